"""The control channel's protocol, and its workbench side (no vLLM, no torch imported).

* The workbench writes the control file (path in ``WORKBENCH_KNOBS_FILE``) atomically as JSON
  ``{"version": int, "knobs": {...}, "seed": int}``.
* In every vLLM process where the plugin patched something, one *component* runs
  (``component.py``): the ``engine_core`` (scheduler-side knobs) and the ``worker``
  (worker-side knobs). Each polls the control file; when a new version appears it applies the
  knobs in that process and writes its state file atomically to
  ``$WORKBENCH_KNOBS_STATE_DIR/<role>-<component>-<pid>.json``::

      {"version", "role", "component", "pid", "vllm_version", "runner",
       "knobs": {knob values in force in this component, read back},
       "requested": {the full knob dict of the control file}, "seed",
       "patched": ["module:Class.method", ...], "events": {...}, "errors": [...],
       "unreachable": {knob: why}, "updated_at"}

  ``events`` holds what was done for this version (fills, blocks zeroed, legacy hand-offs,
  lookahead in force, host staging); its counters keep being updated (the state file is
  rewritten at most every 0.2 s while they change), so read the states after a run for the
  run's counts.
* The workbench applies a new version only while no request is in flight, and waits with
  :func:`wait_for_version` until every component of every role acknowledged it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..provenance import atomic_write_json
from . import spec

POLL_S = 0.05


# Written by the workbench before it reads the events of a run (``FileChannel.in_force``): each
# process writes its state once more, with the nonce, so no count is read before it landed.
FLUSH_REQUEST = "flush-request.json"

def write_control(path: str | os.PathLike, version: int, knobs: dict[str, str], seed: int) -> dict:
    """Validate ``knobs`` (defaults filled in) and write the control file atomically.

    Returns the document written. Raises ValueError for a bad knob name/value or version.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"control version {version!r} must be an integer >= 1")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed {seed!r} must be an integer")
    doc = {"version": version, "knobs": spec.validate(dict(knobs)), "seed": seed}
    atomic_write_json(path, doc)
    return doc


def read_control(path: str | os.PathLike) -> dict | None:
    """The control document, or None if the file is absent or not (yet) valid JSON."""
    try:
        doc = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead for our purposes)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_states(state_dir: str | os.PathLike, *, include_dead: bool = False) -> list[dict]:
    """Every state file in ``state_dir`` (of live processes unless ``include_dead``)."""
    out: list[dict] = []
    d = Path(state_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        st = read_control(p)  # the same tolerant JSON read
        if st is None:
            continue
        st["_path"] = str(p)
        pid = st.get("pid")
        st["_alive"] = isinstance(pid, int) and pid_alive(pid)
        if st["_alive"] or include_dead:
            out.append(st)
    return out


def _merged_value(name: str, by_comp: dict[str, list[dict]]) -> tuple[str | None, dict[str, str]]:
    """One knob's value for a role: from the component the table lists first for it."""
    seen: dict[str, str] = {}
    for comp in (*spec.KNOBS[name].hooks, *by_comp):
        for st in by_comp.get(comp, []):
            v = (st.get("knobs") or {}).get(name)
            if v is not None:
                seen.setdefault(f"{comp}:{st.get('pid')}", v)
    return next(iter(seen.values()), None), seen


def merge_role(states: list[dict]) -> dict:
    """One role's view: knobs in force merged from its components, plus the components."""
    by_comp: dict[str, list[dict]] = {}
    for st in states:
        by_comp.setdefault(st.get("component", "?"), []).append(st)
    knobs: dict[str, str] = {}
    disagreements: dict[str, dict[str, str]] = {}
    for name in spec.KNOBS:
        value, seen = _merged_value(name, by_comp)
        if value is None:
            continue
        knobs[name] = value
        if len(set(seen.values())) > 1:
            disagreements[name] = seen
    versions = sorted({st.get("version") for st in states}, key=str)
    return {
        "version": versions[0] if len(versions) == 1 else versions,
        "knobs": knobs,
        "disagreements": disagreements,
        "components": {c: (s[0] if len(s) == 1 else s) for c, s in by_comp.items()},
    }


def _acked(states: list[dict], role: str, version: int, components: tuple[str, ...],
           logs: dict[str, str] | None) -> tuple[list[dict], list[str]]:
    """One role's states at ``version`` and what is still missing; raise on apply errors."""
    acked, missing = [], []
    for comp in components:
        cs = [s for s in states if s.get("role") == role and s.get("component") == comp]
        behind = [s for s in cs if s.get("version") != version]
        if not cs:
            missing.append(f"{role}/{comp}: no state file from a live process")
        elif behind:
            seen = ", ".join(f"pid {s.get('pid')} at version {s.get('version')}" for s in behind)
            missing.append(f"{role}/{comp}: {seen}")
        elif errs := [str(e) for s in cs for e in (s.get("errors") or [])]:
            raise RuntimeError(
                f"workbench knobs: role {role!r} component {comp!r} failed to apply version "
                f"{version}: " + " | ".join(errs) + "." + _log_hint(role, logs))
        else:
            acked.extend(cs)
    return acked, missing


def _timeout_error(where, version: int, roles, states: list[dict], missing: list[str],
                   timeout: float, logs: dict[str, str] | None) -> TimeoutError:
    hint = "".join(_log_hint(r, logs) for r in roles
                   if any(m.startswith(r + "/") for m in missing))
    none_at_all = [r for r in roles if not any(s.get("role") == r for s in states)]
    extra = ""
    if none_at_all:
        extra = (
            f" No state file at all for {none_at_all}: is the plugin loaded in that server "
            f"(workbench installed in its venv, {spec.ENV_CONTROL_FILE}, {spec.ENV_STATE_DIR} "
            f"and {spec.ENV_ROLE} set in its environment, VLLM_PLUGINS not excluding "
            "'workbench_knobs')?"
        )
    return TimeoutError(
        f"workbench knobs: version {version} not acknowledged within {timeout:.0f} s by: "
        f"{'; '.join(missing)} (state dir {where}).{extra}{hint}")


def wait_for_version(
    state_dir: str | os.PathLike,
    version: int,
    roles: list[str] | tuple[str, ...],
    timeout: float = 60.0,
    logs: dict[str, str] | None = None,
    components: tuple[str, ...] = spec.COMPONENTS,
    read: Callable[[], list[dict]] | None = None,
) -> dict[str, dict]:
    """Wait until every component of every role in ``roles`` reports ``version``.

    Returns ``{role: merge_role(...)}``. Raises TimeoutError naming the role/component that
    did not acknowledge (and where its log is), RuntimeError if a component reported errors
    while applying this version. ``read`` replaces reading ``state_dir`` (the HTTP channel
    reads remote servers' states).
    """
    deadline = time.monotonic() + timeout
    while True:
        states = read() if read is not None else read_states(state_dir)
        result, missing = {}, []
        for role in roles:
            acked, gaps = _acked(states, role, version, components, logs)
            missing += gaps
            result[role] = merge_role(acked)
        if not missing:
            return result
        if time.monotonic() >= deadline:
            raise _timeout_error(state_dir, version, roles, states, missing, timeout, logs)
        time.sleep(POLL_S)


def _log_hint(role: str, logs: dict[str, str] | None) -> str:
    if logs and role in logs:
        return f" See the {role} server log {logs[role]} (lines with '[workbench-knobs]')."
    return f" See the {role} server's log (lines with '[workbench-knobs]')."
