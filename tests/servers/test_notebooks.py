"""Every notebook runs headless through papermill against real vLLM servers on the CPU.

The tour and the explorer attach to the shared ``pd_session`` servers (one start for the whole
suite); so does the sweep: ``workbench.notebook.sweep.run_sweep`` executes ``notebooks/sweep.ipynb``
once per point, is interrupted after its first point and resumed.
Assertions are on what the notebooks wrote: result.json files, CSVs, figures and their
provenance metadata, and the injected parameters showing up in the results' config.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import psutil
import pytest

from workbench import paths
from workbench.notebook.sweep import Point, run_sweep

pytestmark = pytest.mark.vllm

NOTEBOOKS = paths.REPO / "notebooks"
POSITIONS = 3  # D's k in the base config


# ------------------------------------------------------------------------------ helpers --

def assert_figure_with_provenance(figures: Path, stem: str, expect: str = "vllm_version") -> dict:
    """PNG, SVG and PDF exist, are non-empty and carry the provenance JSON in their metadata."""
    from PIL import Image

    for ext in ("png", "svg", "pdf"):
        f = figures / f"{stem}.{ext}"
        assert f.is_file() and f.stat().st_size > 1000, f
    with Image.open(figures / f"{stem}.png") as im:
        assert im.size[0] > 100 and im.size[1] > 100
        prov = json.loads(im.text["Description"])
    assert im.text["Software"] == "pd-eagle3-workbench"
    assert prov["runs"] and prov["vllm_version"] and prov["git_commit"]
    assert expect in json.dumps(prov)
    svg = (figures / f"{stem}.svg").read_text()
    assert "vllm_version" in svg and "git_commit" in svg and expect in svg.replace("&quot;", '"')
    pdf = (figures / f"{stem}.pdf").read_bytes()
    assert b"/Subject" in pdf and b"vllm_version" in pdf and b"pd-eagle3-workbench" in pdf
    return prov


def load_result(path: Path) -> dict:
    data = json.loads(path.read_text())
    assert data["complete"], data.get("error")
    for side in ("pd", "baseline"):
        assert len(data[side]["per_position"]) == POSITIONS, data[side]
        assert data[side]["num_drafts"] > 0
    return data


def execute(name: str, out: Path, **parameters) -> nbformat.NotebookNode:
    """papermill-execute notebooks/NAME.ipynb into OUT/NAME.out.ipynb; return the record."""
    record = out / f"{name}.out.ipynb"
    pm.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(record), parameters=parameters,
                        kernel_name="python3", progress_bar=False, cwd=str(NOTEBOOKS))
    nb = nbformat.read(record, as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected, "papermill did not inject the parameters cell"
    return nb


def outputs_of(nb, mime: str) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
            if mime in o.get("data", {})]


# ----------------------------------------------------------------------------- fixtures --

@pytest.fixture(scope="module")
def small_cfg(base_cfg):
    return replace(base_cfg, num_prompts=2, max_tokens=8)


@pytest.fixture()
def attach(pd_session, small_cfg):
    """The shared servers, as a notebook attaches to them (control channel included)."""
    pd_session.ensure(small_cfg)
    return {"urls": {r: s.url for r, s in pd_session.servers.items()},
            "knobs_file": str(pd_session.knobs_file), "state_dir": str(pd_session.state_dir)}


def notebook_config(cfg) -> dict:
    """The config fields that fix the servers' shape (the attached servers were started so)."""
    d = cfg.to_dict()
    return {k: d[k] for k in ("target", "drafter", "block_size", "kv_cache_bytes",
                              "max_model_len", "seed")}


# -------------------------------------------------------------------------------- tests --

def test_tour_runs_headless_and_takes_injected_parameters(attach, small_cfg, tmp_path):
    nb = execute("tour", tmp_path, attach=attach, config=notebook_config(small_cfg),
                 num_prompts=3, max_tokens=8, prompt_set=small_cfg.prompt_set,
                 knobs={"finalize": "eager"}, knob_prompt_set="", out_dir=str(tmp_path / "tour"))
    out = tmp_path / "tour"
    fixed = load_result(out / "fixed" / "result.json")
    # injected values, not the notebook's defaults (8 prompts, 32 tokens)
    assert fixed["config"]["num_prompts"] == 3 and fixed["num_prompts"] == 3
    assert fixed["config"]["max_tokens"] == 8
    assert fixed["config"]["target"] == small_cfg.to_dict()["target"]  # as records keep it
    assert fixed["knobs"]["d"]["finalize"] == "deferred"
    assert fixed["token_agreement"] == 1.0
    knobbed = load_result(out / "knobs" / "result.json")
    assert knobbed["knobs"]["requested"]["finalize"] == "eager"
    assert knobbed["knobs"]["d"]["finalize"] == "eager"  # read back from D's worker
    # eager finalize with direct NIXL reads has nothing to copy too early: parity, and a note
    assert knobbed["token_agreement"] == 1.0
    assert any("host-staged" in n for n in knobbed["notes"])
    # The tour's knob run has the KV probe on: it needs this run's baseline KV, so no reuse.
    assert knobbed["kv_probe_summary"]["cost"]["captured"] == {"p": 3, "d": 3, "baseline": 3}
    assert any("KV probe" in n and "baseline" in n for n in knobbed["notes"])
    assert_figure_with_provenance(out / "figures", "per_position_fixed")
    prov = assert_figure_with_provenance(out / "figures", "per_position", expect="eager")
    assert [r["knobs_d"]["finalize"] for r in prov["runs"]] == ["deferred", "eager"]
    assert_figure_with_provenance(out / "figures", "kv_probe", expect="eager")
    assert len(outputs_of(nb, "image/png")) >= 3  # both figures and the KV probe's inline
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "in force on D" in text
    assert f"bottom line: {fixed['bottom_line']}" in text  # the answer, as result.json has it
    assert fixed["bottom_line"].startswith("no token differs: all 3 requests")


def test_explorer_runs_headless_through_run_once(attach, small_cfg, tmp_path):
    out = tmp_path / "explorer"
    nb = execute("explorer", tmp_path, interactive=False, attach=attach,
                 config=notebook_config(small_cfg), prompt_set=small_cfg.prompt_set,
                 num_prompts=2, max_tokens=8, k_p=small_cfg.k_p, k_d=small_cfg.k_d,
                 runs=[{}, {"block_handoff": "legacy", "repeats": 2}], out_dir=str(out))
    table = pd.read_csv(out / "export" / "results.csv")
    assert list(table["run"]) == [1, 2, 2] and list(table["repeat"]) == [1, 1, 2]
    # knob values as read back from the servers' processes (block_handoff acts on P)
    assert list(table["knob_block_handoff"]) == ["clipped", "legacy", "legacy"]
    assert list(table["knob_finalize"]) == ["deferred"] * 3
    assert (table["num_prompts"] == 2).all()
    for run_dir in sorted((out / "export" / "runs").iterdir()):
        data = load_result(run_dir / "result.json")
        assert data["config"]["max_tokens"] == 8
    assert len(list((out / "export" / "runs").iterdir())) == 3
    assert_figure_with_provenance(out / "export" / "figures", "per_position_spread",
                                  expect="legacy")
    for stem in ("per_position", "relative_error", "affected_split", "token_agreement"):
        assert_figure_with_provenance(out / "export" / "figures", stem)
    reqs = pd.read_csv(out / "export" / "requests.csv")
    assert len(reqs) == 2 * 3 and {"affected", "agree", "run", "repeat"} <= set(reqs.columns)
    assert outputs_of(nb, "image/png"), "the figure was not shown"
    assert outputs_of(nb, "text/html"), "the table was not shown"


def kernels_left() -> list[str]:
    """Jupyter kernels this process started that still run."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if "ipykernel_launcher" in cmd and p.status() != psutil.STATUS_ZOMBIE:
                out.append(cmd)
        except psutil.NoSuchProcess:
            pass
    return out


def test_sweep_resumes_after_interrupt_and_aggregates(pd_session, small_cfg, tmp_path,
                                                      monkeypatch):
    # The sweep runs on the shared servers (``make figures`` starts its own; same code path
    # from ``session.ensure`` on), so the interrupt must leave them running.
    points = [Point("fixed", small_cfg.prompt_set, {}, "parity"),
              Point("eager finalize", small_cfg.prompt_set, {"finalize": "eager"}, "parity")]
    # A relative output directory, as `make figures` passes it (data/results): the point
    # notebooks run with cwd notebooks/ and must still find the same files.
    monkeypatch.chdir(tmp_path)
    out = Path("sweep")
    seen: list[tuple[str, str]] = []

    def interrupt_second(pt, status):
        seen.append((pt.slug, status))
        if pt.slug == "eager-finalize" and status == "running":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(points, out, small_cfg, on_point=interrupt_second, session=pd_session)
    assert all(server.alive() for server in pd_session.servers.values())
    # The second point's kernel, started while the first ran (kernels.KernelStarter), is
    # stopped with the sweep, as is the first's.
    assert not kernels_left(), kernels_left()
    first = out / "points" / "fixed" / "result.json"
    assert load_result(first)["knobs"]["d"]["finalize"] == "deferred"
    assert not (out / "points" / "eager-finalize" / "result.json").exists()
    assert (out / "points" / "fixed.ipynb").is_file()  # the executed notebook is the record
    mtime = first.stat().st_mtime_ns

    seen.clear()
    table = run_sweep(points, out, small_cfg, on_point=lambda pt, s: seen.append((pt.slug, s)),
                      session=pd_session)
    assert seen == [("fixed", "skipped (complete)"), ("eager-finalize", "running")]
    assert first.stat().st_mtime_ns == mtime, "the completed point was run again"
    second = load_result(out / "points" / "eager-finalize" / "result.json")
    assert second["knobs"]["d"]["finalize"] == "eager"
    assert second["config"]["num_prompts"] == 2  # the base config reached the notebook
    timing = json.loads((out / "sweep-timing.json").read_text())
    assert timing["points_run"] == 1 and timing["points_skipped"] == 1

    csv = pd.read_csv(out / "results.csv")
    assert len(csv) == len(table) == 2
    assert list(csv["label"]) == ["fixed", "eager finalize"]
    assert list(csv["knob_finalize"]) == ["deferred", "eager"]
    assert {f"knob_{k}" for k in ("block_handoff", "blocks", "transfer")} <= set(csv.columns)
    assert {"pd_pos0", "baseline_pos0", "token_agreement"} <= set(csv.columns)
    for stem in ("per_position", "relative_error", "affected_split", "token_agreement"):
        prov = assert_figure_with_provenance(out / "figures", stem)
    assert [r["label"] for r in prov["runs"]] == ["fixed", "eager finalize"]
