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

from ..config import ExperimentConfig, profile_runner
from ..inputs import profiles
from ..knobs import connector as kv_connector
from ..knobs import spec as knob_spec
from ..measuring.results import Result
from ..paths import REPO, portable
from ..serving.plan import server_specs
from . import FINDINGS, timeline
from .finding import PRESENT, Finding, control_status, controls_line

TEMPLATE = Path(__file__).with_name("repro_template.py")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment(build, device: str, runner: dict | None = None) -> list[str]:
    return [f"- vLLM {build.version} (commit {build.commit or 'not recorded in the build'}; "
            f"workbench table entry {build.table_entry}, {build.source})",
            f"- torch {_version('torch')}, NIXL {_version('nixl')}, Python "
            f"{platform.python_version()}, {platform.platform()}",
            f"- device: {device} ({platform.processor() or platform.machine()})",
            *runner_line(runner)]


def runner_line(runner: dict | None) -> list[str]:
    """The model runner each server's workers built (the knob ``runner``, read back)."""
    if not runner:
        return []
    names = {"v1": "the V1 model runner", "v2": "Model Runner V2"}
    kinds = sorted(set(runner.values()))
    said = " and ".join(names.get(k, k) for k in kinds)
    return [f"- model runner: {said} (read back from P, D and the baseline)"
            + ("; on the CPU its Triton kernels ran in Triton's interpreter" if "v2" in kinds
               else "")]


def plugin_knobs(cfg: ExperimentConfig) -> dict[str, str]:
    """The knobs off their as-released value that only the workbench's plugin gives this
    platform (host staging on a CPU: NIXL turns its host buffer off there); empty when vLLM
    alone runs the experiment. The KV probe only measures, and the script does not read it;
    the connector is vLLM's own command line, the runner vLLM's own environment variable."""
    defaults = knob_spec.defaults()
    native = {"connector", "runner"} | (
        {"transfer"} if profiles.get(cfg.profile).device != "cpu" else set())
    return {n: v for n, v in cfg.knobs.items()
            if v != defaults.get(n) and n not in native and n != "kv_probe"}


def plugin_env(cfg: ExperimentConfig) -> dict[str, str]:
    """The restart-time variables that ask the plugin for ``plugin_knobs`` (empty: none), and,
    where the plugin runs, the profile's NIXL progress delay as the workbench's own servers
    get it: without it idle host-staged P and D workers spin on both cores of the CPU box and
    starve the script's requests (``knobs/nixl_progress.py``)."""
    knobs = plugin_knobs(cfg)
    env = knob_spec.restart_env({**knob_spec.defaults(), **knobs}) if knobs else {}
    env.pop(knob_spec.ENV_CONNECTOR, None)  # the plugin only reads these two back
    env.pop(knob_spec.ENV_RUNNER, None)
    if env and (delay := profiles.get(cfg.profile).nixl_progress_delay_us):
        env[knob_spec.ENV_NIXL_PROGRESS_DELAY_US] = str(delay)
    return env


def servers(cfg: ExperimentConfig) -> list[dict]:
    """The servers as ``plan`` makes them, with what differs per machine left as
    placeholders the script fills at start: the models, ports, side-channel ports and cores."""
    models = {str(cfg.target): "{target}", str(cfg.drafter): "{drafter}",
              str(kv_connector.storage_dir("repro-logs")): "{storage}"}
    per_machine = {"VLLM_NIXL_SIDE_CHANNEL_PORT": "{side_channel_port}",
                   "VLLM_CPU_OMP_THREADS_BIND": "{cpus}",
                   # Model Runner V2 on the CPU: the workbench's Triton backend, found at start
                   "PYTHONPATH": "{triton_cpu}"}
    out = []
    for s in server_specs(cfg, "repro-logs"):
        argv = ["python", *(replaced(a, models) for a in s.command()[1:])]
        argv[argv.index("--port") + 1] = "{port}"
        env = {k: per_machine.get(k, v) for k, v in s.env().items()
               if not k.startswith("WORKBENCH_")}
        out.append({"role": s.role, "argv": argv, "env": env})
    return out


def replaced(text: str, values: dict[str, str]) -> str:
    for old, new in values.items():
        text = text.replace(old, new)
    return text


def command_lines(servers: list[dict], cfg: ExperimentConfig) -> list[str]:
    """The servers' command lines to paste: the models named, and a shell variable per role
    for each port and core list (``$P_PORT``, ``$D_SIDE_CHANNEL_PORT``, ``$D_CPUS``)."""
    def line(s: dict) -> str:
        values = {"target": portable(cfg.target), "drafter": portable(cfg.drafter),
                  "storage": kv_connector.STORAGE_DIR,  # P and D started in one folder
                  **{k: f"${s['role'].upper()}_{k.upper()}"
                     for k in ("port", "side_channel_port", "cpus")}}
        env = [f"{k}={_quoted(fill(v, values))}" for k, v in s["env"].items()]
        return " ".join([*env, *(_quoted(fill(a, values)) for a in s["argv"]), "&"])

    return ["```bash", *map(line, servers), "```"]


def fill(text: str, values: dict[str, str]) -> str:
    """``{name}`` placeholders filled, as the script does at start."""
    return replaced(text, {"{" + k + "}": v for k, v in values.items()})


def _quoted(arg: str) -> str:
    """Quoted for the shell, with a ``$VAR`` left to expand."""
    return arg if arg.startswith("$") and arg[1:].replace("_", "").isalnum() else shlex.quote(arg)


def gpu_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The same experiment on the gpu profile (its models and block size), for the command
    lines a GPU needs: there host staging is vLLM's own kv_buffer_device=cpu."""
    keep = ("num_prompts", "max_tokens", "prompt_set", "k_p", "k_d", "seed", "knobs",
            "kv_probe", "max_num_batched_tokens", "padded_drafter_batch", "concurrency")
    return ExperimentConfig.for_profile("gpu", require_models=False,
                                        **{k: getattr(cfg, k) for k in keep})


def standalone(f: Finding, cfg: ExperimentConfig, result: dict) -> str:
    """A reproduction script (``repro_template.py`` with this run's servers and prompts)."""
    sent = [r for r in result.get("requests") or [] if r.get("prompt_token_ids")]
    prompts = [r["prompt_token_ids"] for r in sent]
    primed = [i for i, r in enumerate(sent) if r.get("prime_d")]
    knobs = plugin_knobs(cfg)
    return (TEMPLATE.read_text()
            .replace('FINDING = ""', f"FINDING = {f.id!r}")
            .replace('SYMPTOM = ""', f"SYMPTOM = {f.symptom!r}")
            .replace('SERVERS = []', f"SERVERS = {json.dumps(servers(cfg), indent=1)}")
            .replace('PROMPTS = []', f"PROMPTS = {json.dumps(prompts)}")
            .replace('PRIME_D = []', f"PRIME_D = {json.dumps(primed)}")
            .replace('LOUD = 0', f"LOUD = {f.loud_prompt_tokens}")
            .replace('MAX_TOKENS = 0', f"MAX_TOKENS = {cfg.max_tokens}")
            .replace('FLOW = "params"', f"FLOW = {kv_connector.flow(cfg.knobs)!r}")
            .replace('PLUGIN_ENV = {}', f"PLUGIN_ENV = {json.dumps(plugin_env(cfg))}")
            .replace('PLUGIN_KNOBS = {}', "PLUGIN_KNOBS = "
                     f"{json.dumps({**knob_spec.defaults(), **knobs} if knobs else {})}"))


def expected(f: Finding, result: dict) -> list[str]:
    """Against what the evidence is read: acceptance and tokens where the symptom shows in
    the responses; where it is read inside vLLM's processes, only that (an acceptance table
    beside it would be read as the proof, and D's padded first step skews it)."""
    if f.symptom == "inside":
        return [f"The evidence is read inside vLLM's processes: {f.reads}. Expected: no "
                "difference there against the reference. Acceptance is not the proof here and "
                "is not tabulated (D's first step after the KV load is padded with drafts "
                "nobody proposed: finding `padded-load-step`)."]
    return [*observed(result), "",
            "Expected: D's per-position acceptance equals the standalone baseline's on the same "
            "prompts (vLLM's PD acceptance test allows 5% relative), and D's output equals the "
            "baseline's token for token (greedy)."]


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
        ci = [[round(c[0], 3), round(c[1], 3)] if c else None
              for c in eff.get("per_position_diff_ci95") or []]
        lines.append(f"- D minus baseline per position, paired by request (vLLM's raw rates): "
                     f"{[round(x, 3) for x in eff['per_position_diff']]}, 95% intervals {ci}; "
                     f"verdict against vLLM's 5% tolerance: {eff.get('verdict')}")
    if (head := eff.get("headline")) and head.get("attributed"):
        lines.append("- headline verdict per position: " + said_once(head["says"]))
    if result.get("token_agreement") is not None:
        lines.append(f"- token agreement D vs baseline: {result['token_agreement']:.3f}")
    return lines


def said_once(says: list[str]) -> str:
    """Per-position sentences with the positions that say the same thing grouped: "positions
    0, 1, 2: inconclusive, with or without ..." rather than the sentence three times."""
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(says):
        groups.setdefault(text, []).append(i)
    return "; ".join(f"position{'s' if len(ps) > 1 else ''} {', '.join(map(str, ps))}: {text}"
                     for text, ps in groups.items())


def figure(f: Finding, result: dict, out: Path) -> str | None:
    """The finding's figure beside its page (PNG); None when there is nothing to draw. It
    draws the finding's own evidence (``Finding.figure``), never a verdict that sets the
    finding aside."""
    from ..figures import kv_plots, plots

    draw = {"kv_probe": kv_plots.kv_probe, "extra_drafts": plots.extra_drafts}.get(
        f.figure, plots.per_position)
    made = draw([Result(**result)], out, stem=f.id)
    png = next((p for p in made or [] if str(p).endswith(".png")), None)
    return Path(png).name if png else None


def page(f: Finding, o, build, result: dict, command: str, fig: str | None) -> str:
    cfg = ExperimentConfig.from_dict(result["config"])
    fix = REPO / f.fix if f.fix else None
    controls = "; ".join(f"{w}: {control_status(c)}" + (f" ({c['verdict']})" if c.get("verdict")
                                                          else "") for w, c in o.controls.items())
    parts = [
        f"# {f.title}", "",
        f"Found with the PD + EAGLE3 acceptance workbench (finding `{f.id}`, first seen on vLLM "
        f"{f.found_on}).", *since_line(f), "", "## Environment",
        *environment(build, cfg.profile, result.get("runner")), "",
        "## Where in vLLM", f.where, "", *([f"Severity: **{f.severity}**.", ""]
                                           if f.severity else []),
        "## Observed (this run) against expected", f"Verdict: **{o.verdict}** (expected "
        f"{o.expected}); controls: {controls}.", "", "Evidence: `" + json.dumps(o.evidence) + "`",
        "", *expected(f, result), "",
    ]
    if fig:
        parts += [f"![{f.id}]({fig})", ""]
    parts += ["## What is measured and what is inferred", "Measured:",
              *[f"- {s}" for s in f.measured], "", "Inferred from source:",
              *[f"- {s}" for s in f.inferred or ("nothing beyond the location above",)], "",
              "## Reproduce", "With the workbench:", "```",
              f"python -m workbench check --only {f.id}{connector_flag(cfg)}{runner_flag(cfg)} "
              "--out DIR", "```",
              f"(this report came from `{command}`)", "",
              *reproduce(f, cfg)]
    if fix is not None and fix.is_file():
        parts += ["## Proposed fix", f"`{f.fix}` (`patch -p1` in the directory that holds the "
                  "`vllm` package):", "```diff", fix.read_text().rstrip(), "```", ""]
    return "\n".join(parts) + "\n"


def since_line(f: Finding) -> list[str]:
    """Since when the finding is present, as measured natively on each release."""
    said = timeline.since(f.id)
    return ["", f"Across releases: {said}."] if said else []


def connector_flag(cfg: ExperimentConfig) -> str:
    """`` --connector NAME`` where the run's KV connector is not the default one."""
    name = kv_connector.of(cfg.knobs).name
    return "" if name == kv_connector.DEFAULT else f" --connector {name}"


def runner_flag(cfg: ExperimentConfig) -> str:
    """`` --runner NAME`` where the run's model runner is not its profile's."""
    runner = cfg.knobs.get("runner")
    return "" if runner == profile_runner(cfg.profile) else f" --runner {runner}"


def reproduce(f: Finding, cfg: ExperimentConfig) -> list[str]:
    """How to reproduce without ``check``: the script, and what it needs on this platform."""
    script = f"`python {f.id}.repro.py [--target DIR] [--drafter DIR]`"
    to_d = ("(max_tokens=1, do_remote_decode) and then to D with P's kv_transfer_params, as "
            "vLLM's toy_proxy_server.py does" if kv_connector.flow(cfg.knobs) == kv_connector.PARAMS
            else "(max_tokens=1) and then the same prompt to D, which finds P's KV in the shared "
            "storage, as vLLM's disaggregated-prefill-v1 example does")
    what = ("starts P, D and the baseline with the command lines below (free ports picked at "
            "start), sends each prompt to P " + to_d +
            ", and the same prompt to the baseline, and prints each request's tokens, drafts "
            "and accepted tokens from metrics.speculative_decoding, then the symptom in one "
            "line.")
    knobs = plugin_knobs(cfg)
    if knobs:
        named = ", ".join(f"{k}={v}" for k, v in knobs.items())
        lines = [f"vLLM alone cannot run this on the {cfg.profile} profile ({named}: NIXL turns "
                 "its host buffer off on a CPU device). The script " + script + " " + what +
                 " It needs the workbench installed in the same environment: its vLLM plugin "
                 f"does {named} inside P and D, which the script starts with "
                 + ", ".join(f"{k}={v}" for k, v in plugin_env(cfg).items()) + ", WORKBENCH_ROLE "
                 "(p or d), WORKBENCH_KNOBS_FILE (a control file it writes: every other knob as "
                 "released) and WORKBENCH_KNOBS_STATE_DIR on top of the lines below; it never "
                 "imports the workbench.", "", *command_lines(servers(cfg), cfg), "",
                 "On a GPU the same experiment runs with vLLM untouched "
                 "(`kv_buffer_device: cpu`, the gpu profile's models):", "",
                 *command_lines(servers(gpu_config(cfg)), gpu_config(cfg))]
    else:
        lines = ["Without the workbench (vLLM untouched): " + script + " " + what, "",
                 *command_lines(servers(cfg), cfg)]
    if not f.standalone:
        lines += ["", f"The detector reads {f.reads}, recorded inside vLLM's processes by the "
                  "workbench's plugin, which the standalone script cannot"
                  + ("; it shows the symptom in D's tokens." if f.symptom == "tokens"
                     else "; it shows the acceptance side only.")]
    return [*lines, ""]


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
        (out / f"{f.id}.repro.py").write_text(standalone(f, cfg, res))
        (out / f"{f.id}.md").write_text(page(f, o, build, res, command, figure(f, res, out)))
        written.append(out / f"{f.id}.md")
    rows = ["| finding | verdict | expected | controls | seconds |", "|---|---|---|---|---|"]
    rows += [f"| {o.id} | {o.verdict} | {o.expected} | {controls_line(o.controls)} | "
             f"{o.seconds:.0f} |" for o in outs]
    (out / "summary.md").write_text(f"# workbench check on vLLM {build.version}\n\n`{command}`\n\n"
                                    + "\n".join(rows) + "\n")
    return [*written, out / "summary.md"]
