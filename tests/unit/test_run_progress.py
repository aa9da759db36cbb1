"""What ``run`` shows while it runs and what its help and the README say, without a server:
the progress (``measure.RunBars``) fed by the real ``measure.measure`` over a fake HTTP
transport, the help of ``--profile``/``--prompt-set``/``--knob``, the README's knob table and
Python snippet, and the docs sections the code cites."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
import time
from pathlib import Path

import httpx
import pytest
from tqdm import tqdm

from workbench import cli
from workbench.config import ExperimentConfig
from workbench.inputs.profiles import PROFILES
from workbench.inputs.prompts import Prompt
from workbench.knobs import spec
from workbench.measuring import measure, results

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SPEC = {"num_spec_tokens": 3, "num_spec_steps": 2, "per_step_accepted": [1, 2],
        "per_step_drafted": [3, 3]}


def fake_vllm(request: httpx.Request) -> httpx.Response:
    """Every server: an empty ``/metrics`` (nothing in flight), completions with their
    per-request spec-decode metrics and, from P, kv_transfer_params."""
    if request.url.path == "/metrics":
        return httpx.Response(200, text="")
    body = {"choices": [{"token_ids": [1, 2, 3]}], "metrics": {"speculative_decoding": SPEC}}
    if request.url.host == "p":
        body["kv_transfer_params"] = {"remote_block_ids": [0, 1]}
    return httpx.Response(200, json=body)


class FakeBar:
    """Stands in for tqdm: what each bar was opened with, its updates, refreshes, closing."""

    def __init__(self, log: list[FakeBar], **kw) -> None:
        self.kw, self.n, self.refreshes, self.closed = kw, 0, 0, False
        log.append(self)

    def update(self, n: int) -> None:
        assert not self.closed
        self.n += n

    def refresh(self) -> None:
        self.refreshes += 1

    def set_description_str(self, desc: str, refresh: bool = True) -> None:
        self.kw["desc"] = desc

    def close(self) -> None:
        self.closed = True


def run_requests(cfg: ExperimentConfig, progress, n: int = 4) -> list[dict]:
    prompts = [Prompt(f"q{i}", [1, 2, 3 + i]) for i in range(n)]
    rows = [{"id": p.id} for p in prompts]

    async def go() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake_vllm)) as client:
            req = measure.Requests(client, {r: f"http://{r}" for r in ("p", "d", "baseline")},
                                   cfg, "wb1", progress)
            await measure.measure(req, prompts, rows, None, [])

    asyncio.run(go())
    return rows


@pytest.mark.parametrize("baseline", [True, False])
def test_progress_counts_prompts_per_side_not_legs(baseline):
    cfg = ExperimentConfig(run_baseline=baseline, concurrency=2)
    log: list[FakeBar] = []
    bars = measure.RunBars(cfg, bar=lambda **kw: FakeBar(log, **kw))
    rows = run_requests(cfg, bars)
    bars.close()
    assert all(r.get("pd") for r in rows)  # the fake servers were measured
    sides = ["baseline", "pd"] if baseline else ["pd"]
    assert [(b.kw["desc"], b.kw["total"], b.n, b.closed) for b in log] == [
        (s, 4, 4, True) for s in sides]  # 4 prompts: 4 on each side, never 8
    assert all(b.kw["unit"] == "prompt" for b in log)


def test_real_tqdm_shows_four_of_four_prompts():
    buf = io.StringIO()
    cfg = ExperimentConfig(concurrency=4)
    bars = measure.RunBars(cfg, bar=lambda **kw: tqdm(file=buf, **kw))
    run_requests(cfg, bars)
    bars.close()
    text = buf.getvalue()
    assert "baseline: 100%" in text and "pd: 100%" in text and "4/4" in text
    assert "/8" not in text and "req" not in text


def test_server_start_is_its_own_stage_before_any_request_bar():
    log: list[FakeBar] = []
    bars = measure.RunBars(ExperimentConfig(), bar=lambda **kw: FakeBar(log, **kw),
                           tick_s=0.01)
    bars("start", 0, 1)
    start = log[0]
    assert start.kw["desc"] == "starting servers" and "{elapsed}" in start.kw["bar_format"]
    deadline = time.monotonic() + 5
    while start.refreshes < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert start.refreshes >= 2  # the elapsed time moves while nothing is counted
    bars("knobs", 0, 1)  # the servers are up
    assert start.closed and start.kw["desc"] == "servers up after" and len(log) == 1
    refreshes = start.refreshes
    time.sleep(0.05)
    assert start.refreshes == refreshes  # the ticking stopped with the stage
    bars("baseline", 1, 8)
    assert log[1].kw["desc"] == "baseline" and log[1].kw["total"] == 4 and log[1].n == 1
    bars.close()


def test_a_failed_start_is_not_shown_as_servers_up():
    log: list[FakeBar] = []
    bars = measure.RunBars(ExperimentConfig(), bar=lambda **kw: FakeBar(log, **kw))
    bars("start", 0, 1)
    bars.close()  # what cmd_run's finally does when ensure() raises
    assert log[0].closed and log[0].kw["desc"] == "starting servers"


def run_help(monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens otherwise
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--help"])
    return " ".join(buf.getvalue().split())


def test_run_help_names_every_profile_and_the_defaults(monkeypatch):
    text = run_help(monkeypatch)
    assert f"--profile PROFILE {', '.join(PROFILES)} (default cpu)" in text
    assert "cpu indomain" in text and "gpu mt_bench" in text  # --prompt-set's default
    assert "cpu 64, gpu 256" in text  # --max-tokens'


def readme_knob_rows() -> list[str]:
    section = README.read_text().split("## Knobs", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, re.M)


def test_knob_help_and_the_readme_table_list_the_same_knobs(monkeypatch):
    text = run_help(monkeypatch)
    knob_help = text.rsplit("--knob NAME=VALUE", 1)[1].split("--out", 1)[0]
    named = re.findall(r"(\w+): ", knob_help)
    assert named == list(spec.settings()) == readme_knob_rows()
    assert "--kv-probe" in knob_help  # the instrument: its own flag


def test_knob_kv_probe_on_is_the_kv_probe_flag():
    args = cli.build_parser().parse_args(["run", "--out", "o", "--knob", "kv_probe=on"])
    assert cli.config_from_args(args).kv_probe is True


def test_readme_python_snippet_prints_verdicts_and_intervals(monkeypatch, capsys):
    """The snippet run as a script, its Session replaced by one that returns the committed
    reference sweep's fixed run: it must print the verdicts, not nothing."""
    code = re.search(r"^## One experiment.*?^```python\n(.*?)^```", README.read_text(),
                     re.M | re.S).group(1)
    assert "summary_row()" in code

    class FakeSession:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def run(self, cfg):
            r = results.Result.load(REPO / "data" / "reference-sweep" / "points" / "fixed"
                                    / "result.json")
            r.notes = []
            results.aggregate(r, r.requests)
            return r

    import workbench.experiment

    monkeypatch.setattr(workbench.experiment, "Session", FakeSession)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("bottom line: ") and "(95%, paired)" in out
    assert "position 0 (padded step set aside): D " in out
    assert "effect_headline_pos0_verdict" in out and "within" in out
    assert "effect_headline_pos0_diff_ci95_low" in out


CITED = re.compile(r"(docs/[\w-]+\.md)#([\w-]+)")


def heading_anchors(page: Path) -> set[str]:
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_docs_sections_cited_in_the_code_exist():
    """A note or comment that sends its reader to ``docs/page.md#section`` names a heading
    there (the concurrency note once cited a README section that did not exist)."""
    cites = [(f, m) for f in [*(REPO / "workbench").rglob("*.py"),
                              *(REPO / "benchmarks").glob("*.py")]
             for m in CITED.findall(f.read_text())]
    assert any(page == "docs/measurement.md" and a == "concurrency" for _, (page, a) in cites)
    bad = [f"{f.relative_to(REPO)}: {page}#{a}" for f, (page, a) in cites
           if not (REPO / page).is_file() or a not in heading_anchors(REPO / page)]
    assert not bad
