"""The runtime control channel between the workbench and the plugin inside vLLM.

Protocol
--------
* The workbench writes the control file (path in ``WORKBENCH_KNOBS_FILE``) atomically
  (tmp file + ``os.replace``) as JSON ``{"version": int, "knobs": {...}, "seed": int}``.
* In every vLLM process where the plugin patched something, one *component* runs: the
  ``engine_core`` (scheduler-side knobs) and the ``worker`` (worker-side knobs). Each has
  a daemon thread that stats the control file every ~50 ms; when a new version appears
  it applies the knobs in that process and then writes its state file atomically to
  ``$WORKBENCH_KNOBS_STATE_DIR/<role>-<component>-<pid>.json``::

      {"version", "role", "component", "pid", "vllm_version", "runner",
       "knobs": {knob values in force in this component, read back},
       "requested": {the full knob dict of the control file}, "seed",
       "patched": ["module:Class.method", ...], "events": {...}, "errors": [...],
       "unreachable": {knob: why}, "updated_at"}

  ``events`` holds what was done for this version (fills, blocks zeroed, legacy hand-offs,
  lookahead in force, host staging); its counters keep being updated (the state file is
  rewritten at most every 0.2 s while they change), so read the states after a run for
  the run's counts.
* The workbench applies a new version only while no request is in flight, and waits with
  :func:`wait_for_version` until every component of every role acknowledged it.

The workbench-side helpers (``write_control``, ``read_states``, ``wait_for_version``,
``merge_role``) import neither vLLM nor torch.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import spec

COMPONENTS = ("engine_core", "worker")
POLL_S = 0.05
EVENT_FLUSH_S = 0.2

# Which knobs each component reports (the other component's knobs are not in its force).
OWNED: dict[str, tuple[str, ...]] = {
    "engine_core": ("prefill_lookahead", "block_handoff", "blocks", "transfer"),
    "worker": ("finalize", "blocks", "dirty_source", "transfer"),
}
# When both components report a knob, the merged value comes from this one.
MERGE_PREFERENCE = {"blocks": "worker", "transfer": "worker"}
CLIENT_SIDE = ("double_bos",)


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
    except (OSError, IndexError):
        pass
    return True


# --------------------------------------------------------------------------------------
# Workbench side
# --------------------------------------------------------------------------------------


def write_control(path: str | os.PathLike, version: int, knobs: dict[str, str], seed: int) -> dict:
    """Validate ``knobs`` (defaults filled in) and write the control file atomically.

    Returns the document written. Raises ValueError for a bad knob name/value or version.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ValueError(f"control version {version!r} must be an integer >= 1")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed {seed!r} must be an integer")  # noqa: TRY004
    doc = {"version": version, "knobs": spec.validate(dict(knobs)), "seed": seed}
    atomic_write_json(path, doc)
    return doc


def read_control(path: str | os.PathLike) -> dict | None:
    """The control document, or None if the file is absent or not (yet) valid JSON."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, OSError):
        return None
    return doc if isinstance(doc, dict) else None


def read_states(state_dir: str | os.PathLike, *, include_dead: bool = False) -> list[dict]:
    """Every state file in ``state_dir`` (of live processes unless ``include_dead``)."""
    out: list[dict] = []
    d = Path(state_dir)
    if not d.is_dir():
        return out
    for p in sorted(d.glob("*.json")):
        try:
            st = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(st, dict):
            continue
        st["_path"] = str(p)
        pid = st.get("pid")
        st["_alive"] = isinstance(pid, int) and _pid_alive(pid)
        if st["_alive"] or include_dead:
            out.append(st)
    return out


def merge_role(states: list[dict]) -> dict:
    """One role's view: knobs in force merged from its components, plus the components."""
    by_comp: dict[str, list[dict]] = {}
    for st in states:
        by_comp.setdefault(st.get("component", "?"), []).append(st)
    knobs: dict[str, str] = {}
    disagreements: dict[str, dict[str, str]] = {}
    for name in spec.KNOBS:
        if name in CLIENT_SIDE:
            continue
        seen: dict[str, str] = {}
        for comp, sts in by_comp.items():
            for st in sts:
                v = (st.get("knobs") or {}).get(name)
                if v is not None:
                    seen[f"{comp}:{st.get('pid')}"] = v
        if not seen:
            continue
        pref = MERGE_PREFERENCE.get(name)
        chosen = next((v for k, v in seen.items() if pref and k.startswith(pref + ":")), None)
        knobs[name] = chosen if chosen is not None else next(iter(seen.values()))
        if len(set(seen.values())) > 1:
            disagreements[name] = seen
    versions = sorted({st.get("version") for st in states}, key=str)
    return {
        "version": versions[0] if len(versions) == 1 else versions,
        "knobs": knobs,
        "disagreements": disagreements,
        "components": {c: (s[0] if len(s) == 1 else s) for c, s in by_comp.items()},
    }


def wait_for_version(
    state_dir: str | os.PathLike,
    version: int,
    roles: list[str] | tuple[str, ...],
    timeout: float = 60.0,
    logs: dict[str, str] | None = None,
    components: tuple[str, ...] = COMPONENTS,
    read: Callable[[], list[dict]] | None = None,
) -> dict[str, dict]:
    """Wait until every component of every role in ``roles`` reports ``version``.

    Returns ``{role: merge_role(...)}``. Raises TimeoutError naming the role/component
    that did not acknowledge (and where its log is), RuntimeError if a component reported
    errors while applying this version. ``read`` replaces reading ``state_dir`` (the HTTP
    channel reads remote servers' states).
    """
    deadline = time.monotonic() + timeout
    while True:
        states = read() if read is not None else read_states(state_dir)
        missing: list[str] = []
        result: dict[str, dict] = {}
        for role in roles:
            role_states = [s for s in states if s.get("role") == role]
            acked: list[dict] = []
            for comp in components:
                cs = [s for s in role_states if s.get("component") == comp]
                if not cs:
                    missing.append(f"{role}/{comp}: no state file from a live process")
                    continue
                behind = [s for s in cs if s.get("version") != version]
                if behind:
                    seen = ", ".join(f"pid {s.get('pid')} at version {s.get('version')}"
                                     for s in behind)
                    missing.append(f"{role}/{comp}: {seen}")
                    continue
                errs = [e for s in cs for e in (s.get("errors") or [])]
                if errs:
                    raise RuntimeError(
                        f"workbench knobs: role {role!r} component {comp!r} failed to apply "
                        f"version {version}: " + " | ".join(str(e) for e in errs) + "."
                        + _log_hint(role, logs)
                    )
                acked.extend(cs)
            if not missing:
                result[role] = merge_role(acked)
        if not missing:
            return result
        if time.monotonic() >= deadline:
            hint = "".join(_log_hint(r, logs) for r in roles
                           if any(m.startswith(r + "/") for m in missing))
            none_at_all = [r for r in roles if not any(s.get("role") == r for s in states)]
            extra = ""
            if none_at_all:
                extra = (
                    f" No state file at all for {none_at_all}: is the plugin loaded in that "
                    f"server (workbench installed in its venv, {spec.ENV_CONTROL_FILE}, "
                    f"{spec.ENV_STATE_DIR} and {spec.ENV_ROLE} set in its environment, "
                    "VLLM_PLUGINS not excluding 'workbench_knobs')?"
                )
            raise TimeoutError(
                f"workbench knobs: version {version} not acknowledged within {timeout:.0f} s "
                f"by: {'; '.join(missing)} (state dir {state_dir}).{extra}{hint}"
            )
        time.sleep(POLL_S)


def _log_hint(role: str, logs: dict[str, str] | None) -> str:
    if logs and role in logs:
        return f" See the {role} server log {logs[role]} (lines with '[workbench-knobs]')."
    return f" See the {role} server's log (lines with '[workbench-knobs]')."


# --------------------------------------------------------------------------------------
# Plugin side (runs inside vLLM processes)
# --------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[workbench-knobs pid={os.getpid()}] {msg}", file=sys.stderr, flush=True)


# An applier: (component, requested knobs, seed) -> (knobs in force it owns, events).
Applier = Callable[["Component", dict, int], "tuple[dict[str, str], dict[str, Any]]"]

_registry_lock = threading.Lock()
_components: dict[str, Component] = {}


def component(name: str) -> Component | None:
    return _components.get(name)


class Component:
    """One patched vLLM component in this process and its control thread."""

    def __init__(self, name: str, obj: Any, appliers: list[tuple[str, Applier]],
                 runner: str = "v1", info: dict | None = None):
        assert name in COMPONENTS, name
        self.name = name
        self.obj = obj
        self.appliers = appliers
        self.runner = runner
        self.info = dict(info or {})
        self.role = os.environ.get(spec.ENV_ROLE, "unknown")
        self.control_path = os.environ.get(spec.ENV_CONTROL_FILE, "")
        self.state_dir = os.environ.get(spec.ENV_STATE_DIR, "")
        self.version = 0
        self.seed = 0
        self.requested = spec.defaults()
        self.knobs: dict[str, str] = {}
        self.events: dict[str, Any] = {}
        self.errors: list[str] = []
        self.unreachable: dict[str, str] = {}
        self.lock = threading.RLock()
        self._dirty = False
        self._last_flush = 0.0
        self._sig: tuple | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ctx: dict[str, Any] = {}  # per-mechanism private state (originals, ...)

    # -- counters updated from vLLM's threads -------------------------------------------
    def bump(self, section: str, key: str, n: int = 1) -> None:
        with self.lock:
            sec = self.events.setdefault(section, {})
            sec[key] = sec.get(key, 0) + n
            self._dirty = True

    def note(self, section: str, key: str, value: Any) -> None:
        with self.lock:
            self.events.setdefault(section, {})[key] = value
            self._dirty = True

    def append(self, section: str, key: str, value: Any, keep: int = 20) -> None:
        with self.lock:
            lst = self.events.setdefault(section, {}).setdefault(key, [])
            lst.append(value)
            del lst[:-keep]
            self._dirty = True

    # -- state file --------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) / f"{self.role}-{self.name}-{os.getpid()}.json"

    def state(self) -> dict:
        from . import _patch
        from .plugin import vllm_version

        with self.lock:
            return {
                "version": self.version,
                "role": self.role,
                "component": self.name,
                "pid": os.getpid(),
                "vllm_version": vllm_version(),
                "runner": self.runner,
                "knobs": dict(self.knobs),
                "requested": dict(self.requested),
                "seed": self.seed,
                "patched": list(_patch.PATCHED),
                "events": json.loads(json.dumps(self.events, default=str)),
                "errors": list(self.errors),
                "unreachable": dict(self.unreachable),
                "info": dict(self.info),
                "control_file": self.control_path,
                "updated_at": time.time(),
            }

    def write_state(self) -> None:
        if not self.state_dir:
            return
        st = self.state()
        with self.lock:
            self._dirty = False
            self._last_flush = time.monotonic()
        try:
            atomic_write_json(self.state_path, st)
        except OSError as e:
            log(f"{self.name}: cannot write state file {self.state_path}: {e}")

    def remove_state(self) -> None:
        try:
            self.state_path.unlink()
        except OSError:
            pass

    # -- applying ----------------------------------------------------------------------
    def apply(self, doc: dict | None) -> None:
        """Apply a control document (None: defaults, version 0)."""
        t_start = time.monotonic()
        version = 0
        seed = 0
        requested = spec.defaults()
        errors: list[str] = []
        if doc is not None:
            version = doc.get("version", 0)
            seed = doc.get("seed", 0)
            try:
                if not isinstance(version, int):
                    raise ValueError(f"control version {version!r} is not an integer")  # noqa: TRY004
                if not isinstance(seed, int):
                    raise ValueError(f"control seed {seed!r} is not an integer")  # noqa: TRY004
                requested = spec.validate(dict(doc.get("knobs") or {}))
            except ValueError as e:
                errors.append(str(e))
                requested = dict(self.requested)
        self.unreachable = {}
        # Restart-time knobs come from the environment, never from the control file.
        env_transfer = os.environ.get(spec.ENV_TRANSFER, spec.KNOBS["transfer"].default)
        if requested.get("transfer") != env_transfer and doc is not None and not errors:
            self.unreachable["transfer"] = (
                f"transfer is restart-time: this server runs transfer={env_transfer!r} "
                f"(env {spec.ENV_TRANSFER}); the control file asked for "
                f"{requested.get('transfer')!r}, which needs a restart"
            )
        with self.lock:
            self.version = version if isinstance(version, int) else 0
            self.seed = seed if isinstance(seed, int) else 0
            self.requested = requested
            self.events = {}
            self.errors = errors
        if errors:  # nothing was applied: what was in force stays in force
            log(f"{self.name} role={self.role} rejected version {self.version}: {errors}")
            self.write_state()
            return
        knobs: dict[str, str] = {}
        for mech, fn in self.appliers:
            t0 = time.monotonic()
            try:
                in_force, events = fn(self, requested, self.seed)
            except Exception as e:  # noqa: BLE001 - report, keep the process alive
                tb = traceback.format_exc(limit=4)
                log(f"{self.name}: applying {mech} failed: {e}\n{tb}")
                with self.lock:
                    self.errors.append(f"{mech}: {type(e).__name__}: {e}")
                continue
            knobs.update(in_force)
            with self.lock:
                if events:
                    self.events.setdefault(mech, {}).update(events)
                self.events.setdefault(mech, {})["apply_s"] = round(time.monotonic() - t0, 4)
        with self.lock:
            self.knobs = {k: v for k, v in knobs.items() if k in OWNED[self.name]}
            self.events["apply_seconds"] = round(time.monotonic() - t_start, 3)
        log(f"{self.name} role={self.role} applied version {self.version} in "
            f"{self.events['apply_seconds']} s: {self.knobs}"
            + (f" ERRORS {self.errors}" if self.errors else ""))
        self.write_state()

    # -- control thread ----------------------------------------------------------------
    def _signature(self) -> tuple | None:
        try:
            st = os.stat(self.control_path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def start(self) -> None:
        """Apply the current control file now (synchronously), then poll it."""
        self._sig = self._signature()
        doc = read_control(self.control_path) if self._sig else None
        self.apply(doc)
        self._thread = threading.Thread(
            target=self._loop, name=f"workbench-knobs-{self.name}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                sig = self._signature()
                if sig is not None and sig != self._sig:
                    doc = read_control(self.control_path)
                    if doc is None:
                        continue  # half-written (should not happen with os.replace); retry
                    self._sig = sig
                    if doc.get("version") != self.version:
                        self.apply(doc)
                if self._dirty and time.monotonic() - self._last_flush >= EVENT_FLUSH_S:
                    self.write_state()
            except Exception as e:  # noqa: BLE001 - never let the thread die silently
                log(f"{self.name}: control thread error: {e}\n{traceback.format_exc(limit=4)}")
                time.sleep(1.0)


def start_component(name: str, obj: Any, appliers: list[tuple[str, Applier]],
                    runner: str = "v1", info: dict | None = None) -> Component:
    """Create (once per process and name) and start a component."""
    import atexit

    with _registry_lock:
        if name in _components:
            return _components[name]
        comp = Component(name, obj, appliers, runner=runner, info=info)
        _components[name] = comp
    comp.start()
    atexit.register(comp.remove_state)
    return comp
