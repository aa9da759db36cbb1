"""``check --report DIR``: an issue-ready Markdown page per present finding, and a summary.

Each page says what was run, on what, what was seen against what was expected (with the
intervals the run measured), where in vLLM's source it comes from, which statements are
measured and which inferred, and how to reproduce it with and without the workbench. The
standalone reproduction is a script of its own (``<id>.repro.py``, no workbench import): the
servers' command lines as ``plan`` makes them, the proxy's two requests, and a client reading
each response's ``metrics.speculative_decoding``.
"""

from __future__ import annotations

import json
import platform
import shlex
from importlib import metadata
from pathlib import Path

from ..config import ExperimentConfig
from ..measuring.results import Result
from ..serving.plan import server_specs
from . import FINDINGS
from .finding import PRESENT, Finding

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = Path(__file__).with_name("repro_template.py")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(build, device: str) -> list[str]:
    return [f"- vLLM {build.version} (commit {build.commit or 'not recorded in the build'}; "
            f"workbench table entry {build.table_entry}, {build.source})",
            f"- torch {_version('torch')}, NIXL {_version('nixl')}, Python "
            f"{platform.python_version()}, {platform.platform()}",
            f"- device: {device} ({platform.processor() or platform.machine()})"]


def servers(cfg: ExperimentConfig, log_dir: str = "/tmp/repro") -> list[dict]:
    """The servers as ``plan`` makes them, vLLM untouched (no workbench variable)."""
    return [{"role": s.role, "argv": ["python", *s.command()[1:]],
             "env": {k: v for k, v in s.env().items() if not k.startswith("WORKBENCH_")},
             "port": s.port} for s in server_specs(cfg, log_dir)]


def command_lines(servers: list[dict]) -> list[str]:
    return ["```bash", *(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in s["env"].items()),
                                    *map(shlex.quote, s["argv"]), "&"]) for s in servers), "```"]


def standalone(cfg: ExperimentConfig, result: dict) -> str:
    """A reproduction script (``repro_template.py`` with this run's servers and prompts)."""
    prompts = [r["prompt_token_ids"] for r in result.get("requests") or []
               if r.get("prompt_token_ids")]
    return (TEMPLATE.read_text()
            .replace('SERVERS = []', f"SERVERS = {json.dumps(servers(cfg), indent=1)}")
            .replace('PROMPTS = []', f"PROMPTS = {json.dumps(prompts)}")
            .replace('MAX_TOKENS = 0', f"MAX_TOKENS = {cfg.max_tokens}"))


def observed(result: dict) -> list[str]:
    """What the run measured, D against the baseline, with intervals."""
    lines = []
    for side in ("baseline", "pd"):
        s = result.get(side) or {}
        if s:
            ci = s.get("per_position_ci95") or []
            rates = ", ".join(f"{r:.3f}" + (f" [{c[0]:.3f}, {c[1]:.3f}]" if c else "")
                              for r, c in zip(s["per_position"], ci or [None] * 9, strict=False))
            lines.append(f"- {'D (PD)' if side == 'pd' else 'baseline'}: per-position acceptance "
                         f"{rates}; acceptance length {s['acceptance_length']:.3f}; drafts "
                         f"{s['num_drafts']} over {s.get('num_requests')} requests")
    eff = result.get("effect") or {}
    if eff.get("per_position_diff"):
        ci = [[round(a, 3), round(b, 3)] for a, b in eff.get("per_position_diff_ci95") or []]
        lines.append(f"- D minus baseline per position, paired by request: "
                     f"{[round(x, 3) for x in eff['per_position_diff']]}, 95% intervals {ci}; "
                     f"verdict against vLLM's 5% tolerance: {eff.get('verdict')}")
    if result.get("token_agreement") is not None:
        lines.append(f"- token agreement D vs baseline: {result['token_agreement']:.3f}")
    return lines


def figure(f: Finding, result: dict, out: Path) -> str | None:
    """The finding's figure beside its page (PNG); None when there is nothing to draw."""
    from ..figures import kv_plots, plots

    r = Result(**result)
    made = (kv_plots.kv_probe([r], out, stem=f.id) if f.figure == "kv_probe"
            else plots.per_position([r], out, stem=f.id))
    png = next((p for p in made or [] if str(p).endswith(".png")), None)
    return Path(png).name if png else None


def _ok(control: dict) -> str:
    return {True: "ok", False: "NOT OK", None: "n/a"}[control["ok"]]


def page(f: Finding, o, build, result: dict, command: str, fig: str | None) -> str:
    cfg = ExperimentConfig.from_dict(result["config"])
    fix = REPO / f.fix if f.fix else None
    controls = "; ".join(f"{w}: {c.get('verdict')} ({_ok(c)})" for w, c in o.controls.items())
    parts = [
        f"# {f.title}", "",
        f"Found with the PD + EAGLE3 acceptance workbench (finding `{f.id}`, first seen on vLLM "
        f"{f.found_on}).", "", "## Environment", *environment(build, cfg.profile), "",
        "## Where in vLLM", f.where, "",
        "## Observed (this run) against expected", f"Verdict: **{o.verdict}** (expected "
        f"{o.expected}); controls: {controls}.", "", "Evidence: `" + json.dumps(o.evidence) + "`",
        "", *observed(result), "",
        "Expected: D's per-position acceptance equals the standalone baseline's on the same "
        "prompts (vLLM's PD acceptance test allows 5% relative), and D's output equals the "
        "baseline's token for token (greedy).", "",
    ]
    if fig:
        parts += [f"![{f.id}]({fig})", ""]
    parts += ["## What is measured and what is inferred", "Measured:",
              *[f"- {s}" for s in f.measured], "", "Inferred from source:",
              *[f"- {s}" for s in f.inferred or ("nothing beyond the location above",)], "",
              "## Reproduce", "With the workbench:", "```",
              f"python -m workbench check --only {f.id} --out DIR", "```",
              f"(this report came from `{command}`)", "",
              f"Without the workbench (vLLM untouched): `python {f.id}.repro.py` starts P, D "
              "and the baseline with the command lines below, sends each prompt to P "
              "(max_tokens=1, do_remote_decode) and then to D with P's kv_transfer_params, "
              "as vLLM's toy_proxy_server.py does, and the same prompt to the baseline, and "
              "prints each request's drafts and accepted tokens from "
              "metrics.speculative_decoding.", "", *command_lines(servers(cfg)), ""]
    if not f.standalone:
        parts += [f"The detector reads {f.reads}, recorded inside vLLM's processes by the "
                  "workbench's plugin, which the standalone script cannot; it shows the "
                  "acceptance side only.", ""]
    if fix is not None and fix.is_file():
        parts += ["## Proposed fix", f"`{f.fix}` (`patch -p1` in the directory that holds the "
                  "`vllm` package):", "```diff", fix.read_text().rstrip(), "```", ""]
    return "\n".join(parts) + "\n"


def write_reports(out: Path, outs, build, results: dict, uses: dict, command: str) -> list[Path]:
    """``out/<id>.md`` (+ figure and ``<id>.repro.py``) per present finding, ``summary.md``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for o in outs:
        res = results.get(uses.get(o.id, {}).get("main"))
        if o.verdict != PRESENT or not res:
            continue
        f = FINDINGS[o.id]
        cfg = ExperimentConfig.from_dict(res["config"])
        (out / f"{f.id}.repro.py").write_text(standalone(cfg, res))
        (out / f"{f.id}.md").write_text(page(f, o, build, res, command, figure(f, res, out)))
        written.append(out / f"{f.id}.md")
    rows = ["| finding | verdict | expected | controls | seconds |", "|---|---|---|---|---|"]
    rows += [f"| {o.id} | {o.verdict} | {o.expected} | "
             + ", ".join(f"{w} {_ok(c)}" for w, c in o.controls.items())
             + f" | {o.seconds:.0f} |" for o in outs]
    (out / "summary.md").write_text(f"# workbench check on vLLM {build.version}\n\n`{command}`\n\n"
                                    + "\n".join(rows) + "\n")
    return [*written, out / "summary.md"]
