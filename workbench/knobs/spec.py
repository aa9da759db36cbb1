"""The knob table: the one place a knob is described.

Each entry names its values and default, the roles it acts on, whether it needs a restart, and
for each vLLM component it lives in (``engine_core``: the scheduler's process; ``worker``: the
model runner's) the hooks that install and apply it. Everything else is derived from this
table: the CLI's ``--knob`` help, the config validation, the widget panel, the components the
plugin starts, which component reports a knob, the server environment of restart-time knobs.
Adding a knob is one entry here plus one mechanism module.

Pure Python on purpose: the CLI, the widgets and the plugin inside vLLM's processes all read
it, and hooks are named as ``"module:function"`` strings (resolved in the server) so this
module imports no mechanism and no vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ROLES = ("p", "d", "baseline")
COMPONENTS = ("engine_core", "worker")

# Environment variables the workbench sets on every server it starts; the plugin reads them.
ENV_CONTROL_FILE = "WORKBENCH_KNOBS_FILE"  # JSON written by the workbench, polled by the plugin
ENV_STATE_DIR = "WORKBENCH_KNOBS_STATE_DIR"  # each vLLM process writes what is in force here
ENV_ROLE = "WORKBENCH_ROLE"  # "p", "d" or "baseline"
ENV_TRANSFER = "WORKBENCH_TRANSFER"  # restart-time knob, fixed for the server's life
ENV_CONNECTOR = "WORKBENCH_CONNECTOR"  # restart-time knob: the KV connector P and D run
ENV_RUNNER = "WORKBENCH_RUNNER"  # restart-time knob: the model runner every server runs
ENV_NIXL_PROGRESS_DELAY_US = "WORKBENCH_NIXL_PROGRESS_DELAY_US"  # see nixl_progress.py
ENV_PIN_MAIN_THREAD = "WORKBENCH_PIN_MAIN_THREAD"  # "1": see cpu_pin.py
ENV_FORK_START = "WORKBENCH_FORK_START"  # "1": see fork_start.py
ENV_OBSERVE_ONLY = "WORKBENCH_OBSERVE_ONLY"  # a directory: no knob, see observe.py
ENV_OBSERVE_KV_PROBE = "WORKBENCH_OBSERVE_KV_PROBE"  # with it: the KV probe, see observe.py
ENV_OBSERVE_AFFINITY = "WORKBENCH_OBSERVE_AFFINITY"  # "1": the forward thread's cores, ditto
ENV_DIE_WITH_PID = "WORKBENCH_DIE_WITH_PID"  # an in-process LLM's pid: see parent_death.py

# A hook: "module:function" (a module of this package or any importable one), or a callable.
HookRef = str | Callable[..., Any]


@dataclass(frozen=True)
class Hook:
    """A knob's hooks in one component.

    ``apply(comp, knobs, seed) -> (value in force, events)`` runs whenever a control version
    arrives (the engine is idle then); ``install(comp)`` runs once when the component starts
    (class-level patches that need the component's object, e.g. the model runner's class)."""

    apply: HookRef
    install: HookRef | None = None


@dataclass(frozen=True)
class KnobSpec:
    name: str
    values: tuple[str, ...]
    default: str
    where: str  # the vLLM process / source the mechanism lives in
    # component -> hooks; the first component listed is the one whose read-back a role reports.
    # Empty: a client-side knob (it changes the request, not the server).
    hooks: dict[str, Hook] = field(default_factory=dict)
    roles: tuple[str, ...] = ROLES  # servers that act on it; the others keep the default
    restart: bool = False  # True: takes effect only when the servers are (re)started
    why_restart: str = ""
    env: str | None = None  # restart-time knobs: the variable that carries the value to a server
    register: HookRef | None = None  # run when the plugin registers, before vLLM builds anything
    # An instrument observes and changes nothing (kv_probe): not a setting in labels, and the
    # workbench sets it from its own field (ExperimentConfig.kv_probe), not from --knob.
    instrument: bool = False

    @property
    def client_side(self) -> bool:
        return not self.hooks

    @property
    def read_back_role(self) -> str:
        """The role whose servers report this knob in a results table: P for P-only knobs (D
        always reports its own untouched value), D otherwise."""
        return "p" if self.roles == ("p",) else "d"


def _hook(module: str, apply: str = "apply", install: str | None = None) -> Hook:
    base = f"workbench.knobs.{module}:"
    return Hook(base + apply, base + install if install else None)


KNOBS: dict[str, KnobSpec] = {
    k.name: k
    for k in (
        KnobSpec(
            "finalize", ("deferred", "eager"), "deferred",
            where="worker: KVConnectorModelRunnerMixin.maybe_get_kv_connector_output / "
            "finalize_kv_connector (V1); ActiveKVConnector.post_forward(defer_finalize) / "
            "finalize_step (Model Runner V2, vLLM 0.33.0); ActiveKVConnector.pre_forward / "
            "finish_forward / post_forward (Model Runner V2, vLLM 0.32.0)",
            hooks={"worker": _hook("finalize", install="install")},
        ),
        KnobSpec(
            "prefill_lookahead", ("default", "0"), "default",
            where="engine core (P): Scheduler.num_lookahead_tokens",
            hooks={"engine_core": _hook("lookahead", install="install")}, roles=("p",),
        ),
        KnobSpec(
            "block_handoff", ("clipped", "legacy"), "clipped",
            where="engine core (P): KVCacheManager.get_block_ids_for_computed_tokens",
            hooks={"engine_core": _hook("handoff", install="install")}, roles=("p",),
        ),
        KnobSpec(
            "load_step", ("as-released", "gated", "gated-async"), "as-released",
            where="engine core (D): Scheduler.schedule's pad_spec_decode and lookahead on the "
            "external-KV-load step. gated: vLLM PR #50173 (open) as written, synchronous loads "
            "only; gated-async: the same padding gate on the first step after an asynchronous "
            "(NIXL) load lands",
            hooks={"engine_core": _hook("load_step", install="install")}, roles=("d",),
        ),
        KnobSpec(
            "blocks", ("as-is", "zeroed", "dirty", "poisoned"), "as-is",
            where="worker: KV cache tensors (zeroed: new blocks zeroed before the forward; "
            "dirty/poisoned: free KV filled with stale values before the run)",
            hooks={"worker": _hook("blocks", "apply_worker", "install_worker"),
                   "engine_core": _hook("blocks", "apply_engine", "install_engine")},
        ),
        KnobSpec(
            "dirty_source", ("noise", "warmup"), "noise",
            where="worker: noise: seeded noise written into the KV cache before the run. "
            "warmup (blocks=dirty only): nothing is written; blocks keep what the runner's "
            "start-up warm-up (Model Runner V2 without --enforce-eager) and earlier requests "
            "left, measured and recorded. The V1 runner (the CPU) runs no KV-writing warm-up "
            "and vLLM's BlockPool hands out never-used blocks first, so there first-use "
            "blocks hold zeros",
            hooks={"worker": _hook("blocks", "apply_dirty_source")},
        ),
        KnobSpec(
            "transfer", ("direct", "host-staged"), "direct",
            where="worker + engine core: NixlConnector use_host_buffer",
            hooks={"worker": _hook("transfer", "apply_worker"),
                   "engine_core": _hook("transfer", "apply_engine")},
            roles=("p", "d"),  # the baseline has no KV connector: a change keeps it running
            restart=True, env=ENV_TRANSFER, register="workbench.knobs.transfer:install",
            why_restart="the host staging buffer is allocated and registered with NIXL "
            "when the connector is built",
        ),
        KnobSpec(
            "connector", ("nixl", "nixl-push", "example", "multi", "mooncake", "offloading",
                          "lmcache"), "nixl",
            where="server command line: --kv-transfer-config of P and D (knobs/connector.py: "
            "nixl: NixlConnector, pull; nixl-push: NixlPushConnector; example: "
            "ExampleConnector, shared storage; multi: MultiConnector of NixlConnector and "
            "ExampleConnector; mooncake: MooncakeConnector; offloading: MultiConnector of "
            "NixlConnector and OffloadingConnector; lmcache: LMCacheConnectorV1). The plugin "
            "only reads back the class vLLM built",
            hooks={"engine_core": _hook("connector")},
            roles=("p", "d"),  # the baseline has no KV connector: a change keeps it running
            restart=True, env=ENV_CONNECTOR,
            why_restart="vLLM builds the KV connector once, from --kv-transfer-config",
        ),
        KnobSpec(
            "runner", ("v1", "v2"), "v1",
            where="worker: the model runner CPUWorker / Worker builds (v1: "
            "vllm/v1/worker/gpu_model_runner.py, the CPU's cpu_model_runner.py; v2: Model "
            "Runner V2, vllm/v1/worker/gpu/model_runner.py, the CPU's cpu/model_runner.py, "
            "its Triton kernels run by Triton's interpreter). Chosen by the server's "
            "environment (VLLM_USE_V2_MODEL_RUNNER); the plugin reads back the class built",
            hooks={"worker": _hook("runner")},
            restart=True, env=ENV_RUNNER,
            why_restart="vLLM builds the model runner once, when the worker starts",
        ),
        KnobSpec(
            "double_bos", ("off", "on"), "off",
            where="client: the prompt token ids sent to every server",
        ),
        KnobSpec(
            "kv_probe", ("off", "on"), "off",
            where="worker: digests of every KV layer's blocks per request (D before its first "
            "step, P and the baseline after the prefill's drafter), compared by the workbench",
            hooks={"worker": _hook("kv_probe", install="install")},
            register="workbench.knobs.kv_probe:register", instrument=True,
        ),
    )
}


def defaults() -> dict[str, str]:
    return {name: k.default for name, k in KNOBS.items()}


def owned(component: str) -> tuple[str, ...]:
    """The knobs a component applies and reports, in table order."""
    return tuple(n for n, k in KNOBS.items() if component in k.hooks)


def client_side() -> tuple[str, ...]:
    return tuple(n for n, k in KNOBS.items() if k.client_side)


def restart_knobs(role: str | None = None) -> tuple[str, ...]:
    """The restart-time knobs (those that act on ``role``, when given: a change of one of
    them restarts only the servers it acts on)."""
    return tuple(n for n, k in KNOBS.items() if k.restart and (role is None or role in k.roles))


def restart_env(knobs: dict[str, str]) -> dict[str, str]:
    """The environment that carries restart-time knob values to a server."""
    return {k.env: knobs[n] for n, k in KNOBS.items() if k.restart and k.env}


def changed(knobs: dict[str, str], instruments: bool = True) -> dict[str, str]:
    """The knobs whose value differs from the default (vLLM untouched); without the
    instruments for a setting's label."""
    return {n: v for n, v in knobs.items() if n in KNOBS and v != KNOBS[n].default
            and (instruments or not KNOBS[n].instrument)}


def settings() -> tuple[str, ...]:
    """The knobs that are settings (the widget panel, the sweep grids), not instruments."""
    return tuple(n for n, k in KNOBS.items() if not k.instrument)


def help_text() -> str:
    """One line for ``--knob``: every setting with its values (the instruments have flags)."""
    return "; ".join(f"{n}: {'|'.join(KNOBS[n].values)}" for n in settings())


def check_value(name: str, value: str) -> str:
    """One knob's name and value; raise ValueError naming what is allowed."""
    if name not in KNOBS:
        raise ValueError(f"unknown knob {name!r}; allowed knobs: {', '.join(KNOBS)}")
    value = str(value)
    if value not in KNOBS[name].values:
        raise ValueError(
            f"knob {name}={value!r} is not allowed; allowed values: "
            f"{', '.join(KNOBS[name].values)}"
        )
    return value


def validate(values: dict[str, str]) -> dict[str, str]:
    """Return the full knob dict (defaults filled in); raise ValueError naming a bad name/value
    or a combination that means nothing."""
    out = defaults()
    for name, value in values.items():
        out[name] = check_value(name, value)
    if out["dirty_source"] == "warmup" and out["blocks"] != "dirty":
        raise ValueError(
            f"knob dirty_source='warmup' needs blocks='dirty', not {out['blocks']!r}: it names "
            "where dirty blocks come from (poisoned is noise of its own scale; as-is and zeroed "
            "write nothing)"
        )
    return out


def parse_assignment(text: str) -> tuple[str, str]:
    """Parse one ``NAME=VALUE`` from the command line (combinations are checked by validate)."""
    if "=" not in text:
        raise ValueError(f"--knob {text!r} must be NAME=VALUE; knobs: {', '.join(KNOBS)}")
    name, value = (s.strip() for s in text.split("=", 1))
    return name, check_value(name, value)


def parse_assignments(texts: list[str], base: dict[str, str] | None = None) -> dict[str, str]:
    """Repeated ``--knob NAME=VALUE`` over ``base`` (later wins); combinations not checked."""
    knobs = dict(base or {})
    for text in texts:
        name, value = parse_assignment(text)
        knobs[name] = value
    return knobs
