"""The checks ``compat`` runs on one release's source, each named so records can be compared.

Families (``kind``):

* ``target``: every patch target of the release's ``knobs/release.RELEASES`` entry exists with
  the parameters its wrapper expects (the ``*_TARGETS`` tuples; ``knobs/patch_checks.py``,
  which the plugin runs too);
* ``order``: every source fact a mechanism relies on, including the call order (the
  ``*_SOURCE`` tuples: for example ``GPUModelRunner.sample_tokens`` calls
  ``finalize_step`` after ``self.speculator.propose(`` in 0.33.0's Model Runner V2, and the V1
  runner calls ``finalize_kv_connector`` after ``propose_draft_token_ids``);
* ``entry``: the module every server is started with (``servers.API_SERVER_MODULE``) still
  runs as ``python -m`` (it has a ``__main__`` block);
* ``flag`` / ``value`` / ``env``: every server flag and environment variable the profiles
  pass (``plan`` of ``gpu`` and ``gpu-single`` with both ``kv_buffer_device`` values, and of
  ``cpu``, which a CPU 0.33.0 would run) exists in that release: flags as ``EngineArgs`` /
  ``FrontendArgs`` fields, JSON keys of ``--speculative-config`` / ``--kv-transfer-config``
  as ``SpeculativeConfig`` / ``KVTransferConfig`` fields, ``--attention-backend`` as an
  ``AttentionBackendEnum`` member,
  ``VLLM_*`` variables as keys of ``vllm/envs.py``'s ``environment_variables`` (and a value
  among its ``env_with_choices`` choices);
* ``metric``: every Prometheus name ``workbench/measuring/metrics.py`` reads is still created;
* ``field``: the per-request spec-decode metrics field (``--per-request-spec-decode-metrics``,
  ``ObservabilityConfig.per_request_spec_decode_metrics``, and the response's
  ``PerRequestMetrics.speculative_decoding`` with the per-step arrays ``measure.py`` reads).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator

from ..knobs.patch_checks import Check, Outcome
from ..knobs.source import Source, class_fields, files_defining, find_def
from ..measuring import metrics
from ..serving.servers import API_SERVER_MODULE


def entry_checks() -> Iterator[Check]:
    def run(src: Source) -> Outcome:
        rel = src.module_file(API_SERVER_MODULE)
        if rel is None:
            return False, f"{API_SERVER_MODULE} is missing"
        ok = 'if __name__ == "__main__":' in (src.read(rel) or "")
        return ok, rel if ok else f"{rel} has no __main__ block"

    yield Check("entry", f"python -m {API_SERVER_MODULE}", run)


# ---------------------------------------------------------------------- flags, env, values --
_ARG_CLASSES = (("vllm.engine.arg_utils", "EngineArgs"),)
_FRONTEND = "class FrontendArgs"
_JSON_FLAGS = {"--speculative-config": ("vllm.config.speculative", "SpeculativeConfig"),
               "--kv-transfer-config": ("vllm.config.kv_transfer", "KVTransferConfig")}
_ENUM_FLAGS = {"--attention-backend": ("vllm.v1.attention.backends.registry",
                                       "AttentionBackendEnum")}


def _frontend_fields(src: Source) -> set[str]:
    out: set[str] = set()
    for rel in files_defining(src, "vllm/entrypoints/", _FRONTEND):
        out |= class_fields(src, rel[:-3].replace("/", "."), "FrontendArgs")
    return out


def _flag(flag: str) -> Check:
    field = flag[2:].replace("-", "_")

    def run(src: Source) -> Outcome:
        for module, cls in _ARG_CLASSES:
            if field in class_fields(src, module, cls):
                return True, f"{cls}.{field}"
        if field in _frontend_fields(src):
            return True, f"FrontendArgs.{field}"
        return False, f"no EngineArgs / FrontendArgs field {field!r}"

    return Check("flag", flag, run)


def _json_key(flag: str, key: str) -> Check:
    module, cls = _JSON_FLAGS[flag]

    def run(src: Source) -> Outcome:
        ok = key in class_fields(src, module, cls)
        return ok, f"{cls}.{key}" if ok else f"{module}:{cls} has no field {key!r}"

    return Check("value", f"{flag} {key}", run)


def _enum_member(flag: str, value: str) -> Check:
    module, cls = _ENUM_FLAGS[flag]

    def run(src: Source) -> Outcome:
        ok = value in class_fields(src, module, cls) or _enum_names(src, module, cls, value)
        return ok, f"{cls}.{value}" if ok else f"{module}:{cls} has no member {value!r}"

    return Check("value", f"{flag} {value}", run)


def _enum_names(src: Source, module: str, cls: str, value: str) -> bool:
    found = find_def(src, module, cls)
    return bool(found) and any(
        isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == value
                                          for t in n.targets) for n in found[0].body)


def _envs_table(src: Source) -> dict[str, ast.expr]:
    """``vllm/envs.py``'s ``environment_variables``: name -> the expression that reads it."""
    tree = src.tree("vllm/envs.py")
    for node in tree.body if tree else []:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(
                node.value, ast.Dict):
            return {k.value: v for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant)}
    return {}


def _choices(expr: ast.expr) -> list[str] | None:
    """The allowed values when ``expr`` is ``env_with_choices(name, default, [..])``."""
    if (isinstance(expr, ast.Call) and getattr(expr.func, "id", "") == "env_with_choices"
            and len(expr.args) >= 3 and isinstance(expr.args[2], ast.List)):
        return [e.value for e in expr.args[2].elts if isinstance(e, ast.Constant)]
    return None


def _env(name: str, value: str) -> Check:
    def run(src: Source) -> Outcome:
        table = _envs_table(src)
        if name not in table:
            return False, "not a key of vllm/envs.py environment_variables"
        allowed = _choices(table[name])
        if allowed is not None and value not in allowed:
            return False, f"{value!r} is not among vllm/envs.py's choices {allowed}"
        return True, "vllm/envs.py environment_variables"

    return Check("env", f"{name}={value}" if _is_choice_env(name) else name, run)


# Variables whose value (not only whose name) is part of the contract with vLLM's test.
_VALUE_ENVS = ("VLLM_KV_CACHE_LAYOUT",)


def _is_choice_env(name: str) -> bool:
    return name in _VALUE_ENVS


def flag_checks(servers: list[dict]) -> Iterator[Check]:
    """Checks for every flag, JSON key, enum value and ``VLLM_*`` variable in ``servers``
    (``plan`` lines), each once; variables of CUDA, UCX, Hugging Face and this plugin are not
    vLLM's and are left out."""
    seen: set[str] = set()
    for s in servers:
        for check in _server_checks(s["argv"], s["env"]):
            if check.name not in seen:
                seen.add(check.name)
                yield check


def _server_checks(argv: list[str], env: dict[str, str]) -> Iterator[Check]:
    for i, tok in enumerate(argv):
        if not tok.startswith("--"):
            continue
        yield _flag(tok)
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if tok in _JSON_FLAGS:
            yield from (_json_key(tok, k) for k in json.loads(nxt))
        if tok in _ENUM_FLAGS:
            yield _enum_member(tok, nxt)
    for name, value in env.items():
        if name.startswith("VLLM_"):
            yield _env(name, value if _is_choice_env(name) else "")


# -------------------------------------------------------------- metrics and response field --
def _creates(tree: ast.Module, base: str) -> int | None:
    """The line where ``base`` is given as a metric's name: ``name="..."`` in a call, or the
    first item of a ``(name, documentation)`` tuple (``SpecDecodingProm``'s counter specs);
    a comparison such as ``metric.name == "..."`` (a reader) does not count."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "name" and isinstance(
                node.value, ast.Constant) and node.value.value == base:
            return node.value.lineno
        if isinstance(node, ast.Tuple) and node.elts and isinstance(
                node.elts[0], ast.Constant) and node.elts[0].value == base:
            return node.lineno
    return None


def _metric(name: str) -> Check:
    base = name.removesuffix("_total")  # prometheus_client adds _total to counters

    def run(src: Source) -> Outcome:
        for rel in src.names():
            text = src.read(rel) if rel.startswith("vllm/v1/") else None
            if text and base in text and (line := _creates(src.tree(rel), base)):
                return True, f"{rel}:{line}"
        return False, f"no vllm/v1 file creates a metric named {base!r}"

    return Check("metric", name, run)


def metric_checks() -> Iterator[Check]:
    """Every ``vllm:`` sample name ``workbench/measuring/metrics.py`` parses."""
    for value in vars(metrics).values():
        if isinstance(value, str) and value.startswith("vllm:"):
            yield _metric(value)


def _fields(kind: str, module: str | None, cls: str, names: tuple[str, ...]) -> Check:
    def run(src: Source) -> Outcome:
        modules = [module] if module else [
            r[:-3].replace("/", ".") for r in files_defining(src, "vllm/entrypoints/",
                                                             f"class {cls}(")]
        for m in modules:
            missing = [n for n in names if n not in class_fields(src, m, cls)]
            if not missing:
                return True, f"{m}:{cls}"
        return False, f"{cls} lacks {', '.join(names)} in {modules or 'vllm/entrypoints'}"

    return Check(kind, f"{module or 'vllm.entrypoints.*'}:{cls}.{'/'.join(names)}", run)


# What measure.py / metrics.request_counters read from each completion's body.
SPEC_FIELD_CHECKS = (
    ("vllm.config.observability", "ObservabilityConfig", ("per_request_spec_decode_metrics",)),
    ("vllm.engine.arg_utils", "EngineArgs", ("per_request_spec_decode_metrics",)),
    (None, "PerRequestMetrics", ("speculative_decoding",)),
    (None, "SpeculativeDecodingMetrics", ("per_step_accepted", "per_step_drafted")),
)


def field_checks() -> Iterator[Check]:
    for module, cls, names in SPEC_FIELD_CHECKS:
        yield _fields("field", module, cls, names)
