"""Where one vLLM server start's time goes, per process, from its own log.

    .venv/bin/python benchmarks/server_start_profile.py [--starts 3] [--modes spawn,zygote]
    .venv/bin/python benchmarks/server_start_profile.py --log path/to/p.log   # a log already kept

Starts the role's server as a run would (``plan.server_specs`` of the default CPU config, the
knob plugin on), ``--starts`` times per start mode (``WORKBENCH_SERVER_START``), the modes
alternating, each start in a fresh process (cold; with the zygote a second, warm start
follows in the same process), and splits each start by the first and
last log line of each of vLLM's processes (second resolution: vLLM's log timestamps):
launch -> the API server's first line (Python, torch and vLLM imported, the model's config
inspected), -> the engine core's first line (engine process spawned and imported), -> the
worker's first line (worker spawned and imported), -> both models loaded, -> KV cache and
engine initialised (the connector and NIXL registered), -> "Starting vLLM server" (the API
server's routes), -> /health answering. Prints the median of each phase; ``--docs`` writes
them to ``data/performance/server-start.json`` and their table into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables  # a sibling script

LINE = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")
MARKS = (  # (phase, process, text of the line that ends it)
    ("API server up to its first log line", "APIServer", None),
    ("engine core started (spawned: imported)", "EngineCore", None),
    ("worker started (spawned: imported)", "Worker", None),
    ("target and drafter loaded", "Worker", "Using auxiliary layers"),
    ("KV cache, connector, engine initialised", "EngineCore", "init engine"),
    ("API server routes", "APIServer", "Starting vLLM server"),
)


READY, TOTAL = "until /health answers", "total"


def stamps(log: str, year: int) -> list[tuple[str, float, str]]:
    out = []
    for line in log.splitlines():
        m = LINE.match(line)
        if m:
            t = dt.datetime.strptime(f"{year}-{m.group(2)}", "%Y-%m-%d %H:%M:%S")
            out.append((m.group(1).replace("VllmWorker", "Worker"), t.timestamp(), m.group(3)))
    return out


def phases(log: str, launched: float | None, ready: float | None, year: int) -> dict:
    """Seconds per phase (the first needs the launch time; the last the ready time)."""
    lines, out, prev = stamps(log, year), {}, launched
    for name, proc, text in MARKS:
        t = next((ts for p, ts, msg in lines if p == proc and (text is None or text in msg)),
                 None)
        if t is not None and prev is not None:
            out[name] = max(0.0, t - prev)
        prev = t if t is not None else prev
    if ready is not None and prev is not None:
        out[READY] = max(0.0, ready - prev)
    return out


def start_once(role: str, log_dir: Path) -> tuple[str, float, float]:
    from workbench.config import ExperimentConfig
    from workbench.serving.channels import FileChannel
    from workbench.serving.plan import server_specs
    from workbench.serving.servers import start_all

    cfg = ExperimentConfig(run_pd=role != "baseline", run_baseline=role == "baseline")
    ch = FileChannel.in_dir(log_dir)
    ch.prepare(cfg)
    spec = next(s for s in server_specs(cfg, log_dir, knobs_file=ch.knobs_file,
                                        state_dir=ch.state_dir) if s.role == role)
    t0 = time.time()
    (server,) = start_all([spec], 600)
    ready = time.time()
    server.stop()
    return spec.log_path.read_text(), t0, ready


def one(mode: str, role: str, year: int) -> dict:
    """In this (fresh) process: a cold start in ``mode``; with the zygote a second, warm one
    (its fork server already imported vLLM)."""
    os.environ["WORKBENCH_SERVER_START"] = mode
    out = {}
    for which in ("cold", "warm") if mode == "zygote" else ("cold",):
        log, t0, ready = start_once(role, Path(tempfile.mkdtemp(prefix=f"start-{mode}-")))
        out[which] = phases(log, t0, ready, year)
    return out


def medians(runs: list[dict]) -> dict[str, float]:
    names = [n for n in [m[0] for m in MARKS] + [READY] if any(n in r for r in runs)]
    out = {n: round(statistics.median(r[n] for r in runs if n in r), 1) for n in names}
    out[TOTAL] = round(statistics.median(sum(r.values()) for r in runs), 1)
    return out


def table(doc: dict) -> str:
    cols = list(doc["columns"])
    rows = [f"| phase | {' | '.join(f'`{c}`' for c in cols)} |",
            f"|---|{'---|' * len(cols)}"]
    order = [m[0] for m in MARKS] + [READY, TOTAL]  # the record's keys come back sorted
    for name in [n for n in order if any(n in c for c in doc["columns"].values())]:
        cells = [f"{doc['columns'][c][name]:.1f} s" if name in doc["columns"][c] else ""
                 for c in cols]
        if name == TOTAL:
            cells = [f"**{x}**" for x in cells]
        rows.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(rows) + (
        f"\n\nMedians of {doc['starts']} starts per column, the modes alternating, each "
        f"start in a fresh process (`benchmarks/server_start_profile.py`, {doc['date']}, "
        f"{doc['cores']} cores).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--role", default="baseline", choices=("baseline",))
    ap.add_argument("--modes", default="spawn,zygote",
                    help="server start modes (serving/servers.py START_MODES), alternated")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a mode, in a fresh process
    ap.add_argument("--log", help="profile a kept log instead (no launch or ready time)")
    ap.add_argument("--docs", action="store_true", help="write the record and the docs table")
    args = ap.parse_args()
    year = dt.date.today().year
    if args.one:
        print(json.dumps(one(args.one, args.role, year)))
        return
    if args.log:
        print(medians([phases(Path(args.log).read_text(), None, None, year)]))
        return
    seen: dict[str, list[dict]] = {}
    for i in range(args.starts):
        for mode in args.modes.split(","):
            got = json.loads(subprocess.run(
                [sys.executable, __file__, "--one", mode, "--role", args.role], check=True,
                capture_output=True, text=True).stdout.splitlines()[-1])
            for which, ph in got.items():
                seen.setdefault(f"{mode}, {which}", []).append(ph)
            print(f"start {i + 1}, {mode}: " + ", ".join(
                f"{w} {sum(p.values()):.1f} s" for w, p in got.items()), flush=True)
    doc = {"columns": {k: medians(v) for k, v in seen.items()}, "starts": args.starts,
           "raw": seen, "date": dt.date.today().isoformat(), "cores": os.cpu_count()}
    print(table(doc))
    if args.docs:
        doc_tables.write("server-start", doc, table(doc))


if __name__ == "__main__":
    main()
