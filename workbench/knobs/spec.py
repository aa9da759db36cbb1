"""The knob vocabulary: names, allowed values, defaults, and which need a restart.

Pure Python on purpose: the CLI, the config validation, the widgets and the plugin inside
vLLM's processes all read this one table, so a name or value is spelled in one place.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnobSpec:
    name: str
    values: tuple[str, ...]
    default: str
    restart: bool  # True: takes effect only when the servers are (re)started
    where: str  # the vLLM process / source the mechanism lives in
    why_restart: str = ""
    acts_on: str = "p,d"  # roles whose servers apply it ("client": the request itself)


KNOBS: dict[str, KnobSpec] = {
    k.name: k
    for k in (
        KnobSpec(
            "finalize",
            ("deferred", "eager"),
            "deferred",
            restart=False,
            where="worker: KVConnectorModelRunnerMixin.maybe_get_kv_connector_output / "
            "finalize_kv_connector (V1); ActiveKVConnector.post_forward / finalize_step (MRV2)",
        ),
        KnobSpec(
            "prefill_lookahead",
            ("default", "0"),
            "default",
            restart=False,
            where="engine core (P): Scheduler.num_lookahead_tokens",
            acts_on="p",
        ),
        KnobSpec(
            "block_handoff",
            ("clipped", "legacy"),
            "clipped",
            restart=False,
            where="engine core (P): KVCacheManager.get_block_ids_for_computed_tokens",
            acts_on="p",
        ),
        KnobSpec(
            "blocks",
            ("as-is", "zeroed", "dirty", "poisoned"),
            "as-is",
            restart=False,
            where="worker: KV cache tensors (zeroed: new blocks zeroed before the forward; "
            "dirty/poisoned: free KV filled with stale values before the run)",
        ),
        KnobSpec(
            "dirty_source",
            ("noise", "warmup"),
            "noise",
            restart=False,
            where="worker: noise: seeded noise written into the KV cache before the run. "
            "warmup (blocks=dirty only): nothing is written; blocks keep what the runner's "
            "start-up warm-up (Model Runner V2 without --enforce-eager) and earlier requests "
            "left, measured and recorded. The V1 runner (the CPU) runs no KV-writing warm-up "
            "and vLLM's BlockPool hands out never-used blocks first, so there first-use "
            "blocks hold zeros",
        ),
        KnobSpec(
            "transfer",
            ("direct", "host-staged"),
            "direct",
            restart=True,
            where="worker + engine core: NixlConnector use_host_buffer",
            why_restart="the host staging buffer is allocated and registered with NIXL "
            "when the connector is built",
        ),
        KnobSpec(
            "double_bos",
            ("off", "on"),
            "off",
            restart=False,
            where="client: the prompt token ids sent to every server",
            acts_on="client",
        ),
    )
}

# Environment variables the workbench sets on every server it starts; the plugin reads them.
ENV_CONTROL_FILE = "WORKBENCH_KNOBS_FILE"  # JSON written by the workbench, polled by the plugin
ENV_STATE_DIR = "WORKBENCH_KNOBS_STATE_DIR"  # each vLLM process writes what is in force here
ENV_ROLE = "WORKBENCH_ROLE"  # "p", "d" or "baseline"
ENV_TRANSFER = "WORKBENCH_TRANSFER"  # restart-time knob, fixed for the server's life
ENV_NIXL_PROGRESS_DELAY_US = "WORKBENCH_NIXL_PROGRESS_DELAY_US"  # see nixl_progress.py


def defaults() -> dict[str, str]:
    return {name: k.default for name, k in KNOBS.items()}


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
            f"knob dirty_source='warmup' needs blocks='dirty', not {out['blocks']!r}: it names where "
            "dirty blocks come from (poisoned is noise of its own scale; as-is and zeroed write nothing)"
        )
    return out


def parse_assignment(text: str) -> tuple[str, str]:
    """Parse one ``NAME=VALUE`` from the command line (combinations are checked by validate)."""
    if "=" not in text:
        raise ValueError(f"--knob {text!r} must be NAME=VALUE; knobs: {', '.join(KNOBS)}")
    name, value = (s.strip() for s in text.split("=", 1))
    return name, check_value(name, value)


def restart_knobs() -> tuple[str, ...]:
    return tuple(n for n, k in KNOBS.items() if k.restart)
