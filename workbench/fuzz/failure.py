"""An unexplained difference at its smallest, written up: ``case.json`` (replayable with
``--replay``), ``records.json`` (the trial's result and verdicts), the KV figure and a
``report.md`` in the style of ``check --report``: what was observed against the baseline,
request by request, what is measured and what is only inferred."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..config import ExperimentConfig
from ..findings import report
from ..provenance import atomic_write_json, atomic_write_text
from .trial import Trial

# Where a difference of each kind has come from before (the source locations of the known
# findings): a lead for whoever traces a new one, never a conclusion of the fuzzer's.
LEADS = {
    "tokens": "D decoded from other KV than the baseline: compare the blocks D loaded "
    "(kv_vs_p) before reading the scheduler",
    "drafts": "vllm/v1/core/sched/scheduler.py, Scheduler.schedule (pad_spec_decode, "
    "num_lookahead_tokens on the step after a remote load)",
    "accepts": "the drafter's input on D: its KV (kv_vs_p, drafter layers) or the hidden "
    "states it is given (vllm/v1/spec_decode/eagle.py, EagleProposer.propose)",
    "kv_vs_p": "the blocks P handed and D read: Scheduler._connector_finished -> "
    "NixlConnectorScheduler.request_finished (P), NixlConnectorWorker._read_blocks (D)",
    "kv_vs_baseline": "what P computed differs from a standalone prefill: chunking "
    "(--max-num-batched-tokens) or the drafter's prefill on P",
    "crash": "the server's log below; a known loud form: D loading more positions than P's "
    "ExampleConnector saved (vLLM issue #16928, open PR #53314)",
    "timeout": "a request that never finished: a transfer D waits for (NIXL's "
    "VLLM_NIXL_ABORT_REQUEST_TIMEOUT) or a request the scheduler never schedules",
    "start": "the server's log below: a flag combination this vLLM refuses at start-up",
}


def write(out: Path, t: Trial, base: ExperimentConfig, sig: str | None = None) -> Path:
    """``out/failures/<hash>/`` for the failure ``sig`` (its trial's first signature when
    None); returns that directory."""
    sig = sig or next(iter(t.signatures), None)
    d = out / "failures" / t.scenario.hash
    d.mkdir(parents=True, exist_ok=True)
    atomic_write_json(d / "case.json", t.scenario.to_dict(), indent=1)
    atomic_write_json(d / "records.json", {
        "result": t.result, "judged": [asdict(j) for j in t.judged],
        "signature": sig, "signatures": t.signatures, "seconds": t.seconds,
        "crash": t.crash.to_dict() if t.crash else None}, indent=1,
        portable=True)
    fig = _figure(t, d)
    atomic_write_text(d / "report.md", page(t, t.scenario.config(base), fig, sig))
    return d


def _figure(t: Trial, d: Path) -> str | None:
    from ..figures import kv_plots
    from ..measuring.results import Result

    try:
        made = kv_plots.kv_probe([Result(**t.result)], d, stem="kv")
    except Exception:  # noqa: BLE001 - a figure that cannot be drawn leaves the report
        return None
    return next((Path(p).name for p in made if str(p).endswith(".png")), None)


def request_lines(t: Trial) -> list[str]:
    out = []
    for j in t.judged:
        if j.aborted:
            out.append(f"- {j.id}: aborted ({j.aborted}); judged only by not disturbing the rest")
            continue
        bits = [f"{k}: {json.dumps(v)}" for k, v in j.unexplained.items()]
        known = [f"{f} ({', '.join(ks)})" for f, ks in j.explained.items()]
        out.append(f"- {j.id}: {j.verdict}" + (f"; unexplained {'; '.join(bits)}" if bits else "")
                   + (f"; explained by {', '.join(known)}" if known else "")
                   + (f"; noise (differs between two baseline runs): {', '.join(j.noise)}"
                      if j.noise else ""))
    return out


def crash_lines(t: Trial) -> list[str]:
    """What vLLM said when it failed the trial: its error line and its log from the first
    traceback of that start (``crash.excerpt``)."""
    c = t.crash
    if c is None:
        return []
    what = {"crash": "died or answered an error", "timeout": "did not answer in time",
            "start": "could not start"}[c.kind]
    return [f"- the {c.role} server {what}: `{c.line}`", f"- the client saw: {t.error}", "",
            f"The {c.role} server's log from its first traceback:", "", "```", c.log_tail, "```",
            ""]


def page(t: Trial, cfg: ExperimentConfig, fig: str | None, sig: str | None) -> str:
    n, tokens = t.scenario.size()
    kinds = sorted({k for j in t.judged for k in j.unexplained}
                   | ({t.crash.kind} if t.crash else set()))
    title = (f"# Fuzz: unexplained `{sig}`" if sig else  # a replay that found nothing new
             f"# Fuzz replay: {t.verdict}, no unexplained difference")
    lines = [title, "",
             f"Smallest case found: {n} request(s), {tokens} prompt tokens, shape "
             f"`{json.dumps(t.scenario.shape, sort_keys=True)}`, fixed knobs "
             f"`{json.dumps(t.scenario.knobs, sort_keys=True)}`. Replay: `python -m workbench "
             f"fuzz --replay case.json --out DIR`.", "", "## Observed (measured)", "",
             *request_lines(t), *crash_lines(t), *report.observed(t.result), "",
             "## Expected", "", "D's greedy tokens, its draft and accepted counts per position, "
             "and its KV (every position against P's, and against the baseline's) equal to "
             "the standalone baseline's, as two baseline runs are to each other.", "",
             "## Where to look (inferred, not traced by the fuzzer)", "",
             *(f"- {k}: {LEADS[k]}" for k in kinds), "",
             "## The servers", "", *report.command_lines(report.servers(cfg), cfg)]
    if t.scenario.knobs:
        fixed = ", ".join(f"{k}={v}" for k, v in t.scenario.knobs.items())
        lines += ["", f"The fixed knobs ({fixed}) act through the workbench's plugin inside "
                  "these servers (its knob channel), not through their flags: docs/knobs.md."]
    if fig:
        lines += ["", f"![KV probe]({fig})"]
    return "\n".join(lines) + "\n"
