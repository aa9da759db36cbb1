"""Notebook helpers and the knob explorer panel (ipywidgets).

The widgets only *set parameters*: each control maps to one ``ExperimentConfig`` field or one
knob, the Run button builds the config and calls ``Session.run``, and the figure and table are
drawn from the ``Result`` objects it returns. Every knob control is generated from
``workbench.knobs.spec.KNOBS`` (names, values, defaults, restart flag, where in vLLM), so
nothing is spelled twice.

The same code path runs without a browser: ``KnobExplorer.run_once()`` is what the Run button's
click handler calls, and the explorer notebook calls it directly under papermill
(``interactive = False``).
"""

from __future__ import annotations

import html
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from .. import paths
from ..config import ConfigError, ExperimentConfig
from ..figures import kv_plots, plots
from ..inputs import prompts as prompt_sets
from ..knobs import spec as knob_spec
from ..measuring.results import Result, knobs_in_force
from .history import RunHistory, claim_run_dir

# --------------------------------------------------------------------------------------
# Helpers both notebooks use
# --------------------------------------------------------------------------------------


def notebook_config(config: dict | None = None, *, target: str = "", drafter: str = "",
                    **fields: Any) -> ExperimentConfig:
    """An ``ExperimentConfig`` from notebook parameters: ``config`` (any fields) overridden by
    the named ones; an empty ``target``/``drafter`` means the trained pair in data/models."""
    data = dict(config or {})
    if target:
        data["target"] = target
    if drafter:
        data["drafter"] = drafter
    data.update({k: v for k, v in fields.items() if v is not None})
    for name, default in (("target", paths.DEFAULT_TARGET), ("drafter", paths.DEFAULT_DRAFTER)):
        if name not in data and not (default / "config.json").is_file():
            raise ConfigError(
                f"no {name} model given and {default} does not exist: train the pair "
                "(`make train`) or pass target=/drafter= (e.g. a random pair from "
                "workbench.training.tiny.make_random_pair, with prompt_set='random')"
            )
    return ExperimentConfig.from_dict(data)


def open_session(attach: dict | None = None, *, log_dir: str | Path | None = None,
                 baseline_cache: str | Path | None = None):
    """One ``Session`` for a notebook: servers of its own (started on the first run, stopped
    at exit), or, with ``attach`` (the dict ``sweep.run_sweep`` passes its points:
    ``{"urls": {...}, "knobs_file", "state_dir", "baseline_cache"}``), servers already running."""
    from ..experiment import Session

    return Session.from_attach(
        attach, log_dir=log_dir,
        baseline_cache=(attach or {}).get("baseline_cache") or baseline_cache,
    )


def knob_table() -> pd.DataFrame:
    """The knob vocabulary as a table: values, default, restart, where in vLLM it acts."""
    return pd.DataFrame([
        {"knob": k.name, "values": " / ".join(k.values), "default": k.default,
         "restart": "yes: " + k.why_restart if k.restart else "no (switched at runtime)",
         "where": k.where}
        for k in knob_spec.KNOBS.values()
    ]).set_index("knob")


def png_of(figure_paths: Sequence[Path]) -> Path | None:
    return next((p for p in figure_paths if Path(p).suffix == ".png"), None)


def png_bytes(figure_paths: Sequence[Path]) -> bytes:
    png = png_of(figure_paths)
    return png.read_bytes() if png else b""


def show_figure(figure_paths: Sequence[Path]):
    """Display the PNG of a figure written by ``figures.plots`` (same file as exported)."""
    from IPython.display import Image, display

    png = png_of(figure_paths)
    if png is not None:
        display(Image(filename=str(png)))
    return png


def acceptance_frame(results: Sequence[Result]) -> pd.DataFrame:
    """Per-position acceptance, PD on D beside the baseline, one row per (run, position)."""
    frames = []
    for r in results:
        df = r.to_dataframe()
        if df.empty:
            continue
        wide = df.pivot_table(index="position", columns="side", values="rate").reset_index()
        wide.insert(0, "run", plots.label(r))
        if "pd" in wide and "baseline" in wide:
            wide["pd - baseline"] = wide["pd"] - wide["baseline"]
        head = (r.effect or {}).get("headline")
        if head:  # the verdict to read: D's padded load step set aside where a request has it
            wide["verdict (headline)"] = head["verdict"][:len(wide)]
            wide["verdict (raw)"] = head["raw_verdict"][:len(wide)]
        frames.append(wide)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


# --------------------------------------------------------------------------------------
# The explorer
# --------------------------------------------------------------------------------------

_PHASE_TEXT = {"start": "starting servers", "knobs": "applying knobs"}  # Session.run phases


def knob_dropdowns(base: ExperimentConfig, attached: bool) -> dict[str, Any]:
    """One dropdown per knob, generated from the knob table (restart-time ones marked ↻,
    and fixed when attached to servers someone else started with their value)."""
    import ipywidgets as w

    out = {}
    for name in knob_spec.settings():
        k = knob_spec.KNOBS[name]
        tip = k.where + (f" | restart: {k.why_restart}" if k.restart else "")
        out[name] = w.Dropdown(options=list(k.values), value=base.knobs.get(name, k.default),
                               description=name + (" ↻" if k.restart else ""), tooltip=tip,
                               style={"description_width": "120px"},
                               layout=w.Layout(width="300px"), disabled=k.restart and attached)
    return out


def run_controls(base: ExperimentConfig, attached: bool) -> dict[str, Any]:
    """The servers' k for P and D (restart), the prompts, the tokens, repeats, reuse."""
    import ipywidgets as w

    small = {"style": {"description_width": "90px"}, "layout": w.Layout(width="190px")}
    sets = list(prompt_sets.SOURCES)
    return {
        "k_p": w.BoundedIntText(value=base.k_p, min=1, max=8, description="k on P ↻",
                                tooltip="P's num_speculative_tokens (restart)",
                                disabled=attached, **small),
        "k_d": w.BoundedIntText(value=base.k_d, min=1, max=8, description="k on D ↻",
                                tooltip="D's and the baseline's num_speculative_tokens "
                                "(restart)", disabled=attached, **small),
        "prompt_set": w.Dropdown(options=sets, value=base.prompt_set if base.prompt_set in sets
                                 else sets[0], description="prompts",
                                 style={"description_width": "90px"},
                                 layout=w.Layout(width="230px")),
        "num_prompts": w.BoundedIntText(value=base.num_prompts, min=1, max=1000,
                                        description="# prompts", **small),
        "max_tokens": w.BoundedIntText(value=base.max_tokens, min=1, max=4096,
                                       description="max tokens", **small),
        "repeats": w.BoundedIntText(value=1, min=1, max=20, description="repeats", **small),
        "concurrency": w.BoundedIntText(value=base.concurrency, min=1, max=256,
                                        description="in flight",
                                        tooltip="requests in flight on each side (1: one at "
                                        "a time)", **small),
        "reuse_baseline": w.Checkbox(value=True, description="reuse baseline", indent=False,
                                     tooltip="measure the baseline once per server shape, "
                                     "prompts and max_tokens (off: measure it every run)"),
        "kv_probe": w.Checkbox(value=base.kv_probe, description="KV probe", indent=False,
                               tooltip="capture every KV layer's blocks per request on P, D "
                               "and the baseline, and show where D's differ"),
    }


def in_force_text(r: Result) -> str:
    """The knob values read back from the servers' processes, each from the role it acts
    on (``results.knobs_in_force``), and any that are not as requested."""
    now = knobs_in_force(r.knobs)
    req = r.knobs.get("requested") or {}
    text = ("In force (read back from the servers' processes): "
            + (", ".join(f"{k}={v}" for k, v in now.items()) or "unknown"))
    off = [k for k, v in now.items() if k in req and req[k] != v]
    if off:
        text += f". NOT as requested: {', '.join(off)}"
    return text + "."


class KnobExplorer:
    """A panel with one control per knob (from ``spec.KNOBS``), the servers' k for P and D,
    the prompts, repeats, a Run button with a progress bar, the per-position figure against
    the baseline (min-max over repeats) and the results table, and an Export button.

    ``session`` is kept for the explorer's life (one set of servers for every click); the
    servers restart only when a restart-time knob (``spec.KNOBS[n].restart``) or k changes.
    """

    def __init__(self, base: ExperimentConfig, session=None, *,
                 out_dir: str | Path = paths.RUNS / "explorer", echo: bool = False):
        self.base = base
        self.out_dir = Path(out_dir)
        self._own_session = session is None
        if session is None:
            session = open_session(log_dir=self.out_dir / "logs",
                                   baseline_cache=self.out_dir / "baseline-cache")
        self.session = session
        self._baseline_cache = session.baseline_cache
        self.echo = echo  # print one line per phase (headless runs, logs)
        self.runs = RunHistory()
        self.last_error: BaseException | None = None
        self.figure_paths: list[Path] = []
        self._rep, self._repeats = 0, 1
        attached = getattr(session, "attached", False)
        self.knob_controls = knob_dropdowns(base, attached)
        self.controls = run_controls(base, attached)
        self._build_outputs()
        self.panel = self._layout(attached)

    def _build_outputs(self) -> None:
        import ipywidgets as w

        self.run_button = w.Button(description="Run", button_style="primary", icon="play",
                                   tooltip="run baseline + PD with these settings")
        self.export_button = w.Button(description="Export", icon="download",
                                      tooltip="figures (PNG/SVG/PDF with provenance) + CSVs")
        self.clear_button = w.Button(description="Clear", icon="trash",
                                     tooltip="forget the runs shown (files stay on disk)")
        self.export_dir = w.Text(value=str(self.out_dir / "export"), description="export to",
                                 style={"description_width": "70px"},
                                 layout=w.Layout(width="420px"))
        self.progress = w.IntProgress(value=0, min=0, max=1, description="idle",
                                      style={"description_width": "90px"},
                                      layout=w.Layout(width="420px"))
        self.status, self.notes, self.log_html = (w.HTML(value="") for _ in range(3))
        self.plot = w.Image(format="png", layout=w.Layout(max_width="820px"))
        self.plot.add_class("wb-plot")
        self.kv_plot = w.Image(format="png", layout=w.Layout(max_width="820px"))
        self.kv_plot.add_class("wb-kv-plot")
        # HTML widgets, not Output captures: they update the same way from a kernel, a
        # papermill run or a plain Python process (tests), and render without a kernel.
        self.table_html = w.HTML(value="")
        self.table_html.add_class("wb-table")
        self.run_button.on_click(self._on_run)
        self.export_button.on_click(self._on_export)
        self.clear_button.on_click(lambda _b: self.clear())

    def _layout(self, attached: bool):
        import ipywidgets as w

        restart = ", ".join(knob_spec.restart_knobs()) or "none"
        header = w.HTML(
            "<b>PD + EAGLE3 knob explorer</b> &mdash; ↻ marks settings that restart the "
            f"servers (knobs: {html.escape(restart)}; and k); the rest switch at runtime."
            + (" <i>Attached to running servers: restart-time settings are fixed.</i>"
               if attached else ""))
        knob_grid = w.GridBox(list(self.knob_controls.values()),
                              layout=w.Layout(grid_template_columns="repeat(3, 310px)"))
        c = self.controls
        panel = w.VBox([
            header, knob_grid,
            w.HBox([c["k_p"], c["k_d"], c["prompt_set"], c["num_prompts"]]),
            w.HBox([c["max_tokens"], c["concurrency"], c["repeats"], c["reuse_baseline"],
                    c["kv_probe"]]),
            w.HBox([self.run_button, self.progress]),
            self.status, self.notes, self.plot, self.kv_plot, self.table_html,
            w.HBox([self.export_button, self.export_dir, self.clear_button]),
            self.log_html,
        ])
        panel.add_class("wb-explorer")
        return panel

    # --- parameters ----------------------------------------------------------------------
    def set_values(self, **values: Any) -> None:
        """Set controls by name: knob names (``finalize="eager"``) or run controls
        (``k_d=2``, ``prompt_set="badcase"``, ``repeats=2``); unknown names raise."""
        for name, value in values.items():
            if name in self.knob_controls:
                dd = self.knob_controls[name]
                if str(value) not in dd.options:
                    raise ConfigError(f"knob {name}={value!r} is not allowed; allowed values: "
                                      f"{', '.join(dd.options)}")
                dd.value = str(value)
            elif name in self.controls:
                self.controls[name].value = value
            else:
                raise ConfigError(f"unknown control {name!r}; knobs: "
                                  f"{', '.join(self.knob_controls)}; controls: "
                                  f"{', '.join(self.controls)}")

    def config(self) -> ExperimentConfig:
        """The ExperimentConfig the controls describe (validated)."""
        c = self.controls
        knobs = knob_spec.validate({n: dd.value for n, dd in self.knob_controls.items()})
        changed = [f"{n}={v}" for n, v in knob_spec.changed(knobs, instruments=False).items()]
        label = f"#{len(self.history) + 1} " + (", ".join(changed) or "all fixes in place")
        cfg = replace(self.base, k_p=int(c["k_p"].value), k_d=int(c["k_d"].value),
                      prompt_set=c["prompt_set"].value, num_prompts=int(c["num_prompts"].value),
                      max_tokens=int(c["max_tokens"].value),
                      concurrency=int(c["concurrency"].value), knobs=knobs, label=label,
                      kv_probe=bool(c["kv_probe"].value))
        cfg.validate()
        return cfg

    # --- running -------------------------------------------------------------------------
    def _on_progress(self, phase: str, done: int, total: int) -> None:
        if phase in _PHASE_TEXT:  # before the requests: no count to show on the bar
            self.progress.description = _PHASE_TEXT[phase]
            return
        self.progress.max = max(1, total * self._repeats)
        self.progress.value = self._rep * total + done
        self.progress.description = f"{phase} {done}/{total}"
        if self.echo and done == total:
            print(f"repeat {self._rep + 1}/{self._repeats}: {phase} {done}/{total}", flush=True)

    def run_once(self) -> list[Result]:
        """One Run click: build the config from the controls, run it ``repeats`` times on the
        session, then redraw the figure and the table. Raises on failure."""
        cfg = self.config()
        self._repeats = int(self.controls["repeats"].value)
        self.session.baseline_cache = (self._baseline_cache
                                       if self.controls["reuse_baseline"].value else None)
        run_no = len(self.history) + 1
        disk_no = claim_run_dir(self.out_dir / "runs")  # on disk: after every earlier kernel's
        group: list[Result] = []
        self.run_button.disabled = True
        self.progress.value, self.progress.bar_style = 0, "info"
        t0 = time.monotonic()
        try:
            for rep in range(self._repeats):
                self._rep = rep
                if self.session.needs_start(cfg):
                    self._say(f"run {run_no}: starting the vLLM servers (P, D, baseline) for "
                              "this shape: about a minute on the CPU ...")
                else:
                    self._say(f"run {run_no}, repeat {rep + 1}/{self._repeats}: applying knobs "
                              "and running ...")
                r = self.session.run(
                    cfg, progress=self._on_progress,
                    command=f"workbench.notebook.widgets.KnobExplorer ({cfg.label})",
                    out_dir=self.out_dir / "runs" / f"run{disk_no:03d}-rep{rep + 1}",
                )
                group.append(r)
        except BaseException:
            self.progress.bar_style = "danger"
            raise
        finally:
            self.run_button.disabled = False
            if group:
                self.history.append(group)
                self.refresh()
        self.progress.bar_style = "success"
        self.progress.value = self.progress.max
        self.progress.description = "done"
        self._say(f"run {run_no} done in {time.monotonic() - t0:.1f} s. "
                  + in_force_text(group[-1]))
        return group

    def _on_run(self, _button=None) -> None:
        """The Run button's click handler: ``run_once`` with errors shown in the panel."""
        self.last_error = None
        self.log_html.value = ""
        try:
            self.run_once()
        except Exception as e:  # noqa: BLE001 - shown to the user, kept for callers
            self.last_error = e
            self.status.value = (f"<span style='color:#b00'><b>run failed:</b> "
                                 f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</span>")
            self.log_html.value = f"<pre>{html.escape(traceback.format_exc())}</pre>"

    def _say(self, text: str) -> None:
        self.status.value = html.escape(text)
        if self.echo:
            print(text, flush=True)

    # --- results -------------------------------------------------------------------------
    @property
    def history(self) -> list[list[Result]]:
        return self.runs.groups

    @property
    def results(self) -> list[Result]:
        return self.runs.results

    def table(self, full: bool = False) -> pd.DataFrame:
        return self.runs.table(full)

    def refresh(self) -> None:
        """Redraw the figure and the table from ``history``."""
        if not self.history:
            self.table_html.value, self.plot.value, self.notes.value = "", b"", ""
            self.kv_plot.value, self.figure_paths = b"", []
            return
        live = self.out_dir / "live"
        self.figure_paths = self.runs.figure(live)
        kv = kv_plots.kv_probe([self.history[-1][-1]], live)  # [] unless probed
        self.plot.value, self.kv_plot.value = png_bytes(self.figure_paths), png_bytes(kv)
        self.figure_paths += kv
        self.table_html.value = self.table().round(4).to_html(index=False, na_rep="")
        notes = self.history[-1][-1].notes
        self.notes.value = "".join(f"<div><b>note:</b> {html.escape(n)}</div>" for n in notes)

    def clear(self) -> None:
        self.runs.groups = []
        self.refresh()

    def export(self, directory: str | Path | None = None) -> list[Path]:
        """``RunHistory.export`` into ``directory`` (default: the panel's export field)."""
        return self.runs.export(Path(directory or self.export_dir.value))

    def _on_export(self, _button=None) -> None:
        try:
            files = self.export()
            self.status.value = html.escape(f"exported {len(files)} files to "
                                            f"{Path(self.export_dir.value).resolve()}")
        except Exception as e:  # noqa: BLE001 - shown to the user in the panel
            self.status.value = (f"<span style='color:#b00'><b>export failed:</b> "
                                 f"{html.escape(str(e))}</span>")

    # --- lifetime ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the servers if the explorer started them (also done at exit by the package)."""
        if self._own_session:
            self.session.close()

    def _repr_mimebundle_(self, **kwargs):
        return self.panel._repr_mimebundle_(**kwargs)
