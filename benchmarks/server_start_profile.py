"""Where one vLLM server start's time goes, per process, from its own log.

    .venv/bin/python benchmarks/server_start_profile.py [--starts 3] [--role baseline]
    .venv/bin/python benchmarks/server_start_profile.py --log path/to/p.log   # a log already kept

Starts the role's server as a run would (``plan.server_specs`` of the default CPU config, the
knob plugin on), ``--starts`` times one after another, and splits each start by the first and
last log line of each of vLLM's processes (second resolution: vLLM's log timestamps):
launch -> the API server's first line (Python, torch and vLLM imported, the model's config
inspected), -> the engine core's first line (engine process spawned and imported), -> the
worker's first line (worker spawned and imported), -> both models loaded, -> KV cache and
engine initialised (the connector and NIXL registered), -> "Starting vLLM server" (the API
server's routes), -> /health answering. Prints the median of each phase.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import statistics
import tempfile
import time
from pathlib import Path

LINE = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) (.*)$")
MARKS = (  # (phase, process, text of the line that ends it)
    ("API server up to its first log line", "APIServer", None),
    ("engine core spawned and imported", "EngineCore", None),
    ("worker spawned and imported", "Worker", None),
    ("target and drafter loaded", "Worker", "Using auxiliary layers"),
    ("KV cache, connector, engine initialised", "EngineCore", "init engine"),
    ("API server routes", "APIServer", "Starting vLLM server"),
)


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
        out["until /health answers"] = max(0.0, ready - prev)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--role", default="baseline", choices=("baseline",))
    ap.add_argument("--log", help="profile a kept log instead (no launch or ready time)")
    args = ap.parse_args()
    year = dt.date.today().year
    if args.log:
        runs = [phases(Path(args.log).read_text(), None, None, year)]
    else:
        runs = []
        for i in range(args.starts):
            log, t0, ready = start_once(args.role, Path(tempfile.mkdtemp(prefix=f"start{i}-")))
            runs.append(phases(log, t0, ready, year))
            print(f"start {i + 1}: {sum(runs[-1].values()):.0f} s")
    names = [n for n in [m[0] for m in MARKS] + ["until /health answers"] if
             any(n in r for r in runs)]
    for n in names:
        vals = [r[n] for r in runs if n in r]
        each = ", ".join(f"{v:.0f}" for v in vals)
        print(f"{n:42} median {statistics.median(vals):6.1f} s  ({each})")
    totals = [sum(r.values()) for r in runs]
    print(f"{'total':42} median {statistics.median(totals):6.1f} s")


if __name__ == "__main__":
    main()
