"""The plugin's side of the control channel: one *component* per patched vLLM object.

Runs inside vLLM's processes. ``plugin.py`` starts the ``engine_core`` component once the
``Scheduler`` exists and the ``worker`` component once the ``Worker`` has its KV cache and
connector. Which knobs a component applies, with which hooks, and on which roles comes from
the knob table (``spec.KNOBS``); the protocol is in ``channel.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..provenance import atomic_write_json
from . import _patch, spec
from .channel import FLUSH_REQUEST, POLL_S, read_control
from .release import vllm_version

EVENT_FLUSH_S = 0.2


_registry_lock = threading.Lock()
_components: dict[str, Component] = {}
# Knob -> the failing patch checks that refuse it on this build (knobs/build.py): its hooks
# are never installed, and a control version asking for another value than its default fails.
_refused: dict[str, list[str]] = {}


def refuse(refused: dict[str, list[str]]) -> None:
    _refused.clear()
    _refused.update(refused)


def log(msg: str) -> None:
    print(f"[workbench-knobs pid={os.getpid()}] {msg}", file=sys.stderr, flush=True)


def running(name: str) -> Component | None:
    """The running component of that name in this process (mechanisms count events on it)."""
    return _components.get(name)


def resolve(ref: spec.HookRef) -> Any:
    """A hook named ``"module:function"`` (or given as a callable)."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def effective_knobs(role: str, requested: dict[str, str]) -> tuple[dict[str, str], dict]:
    """What this role acts on: a knob that does not act on ``role`` keeps its default here.
    Returns the knobs and a note per knob that was asked for but does not act here."""
    knobs, notes = dict(requested), {}
    for name, k in spec.KNOBS.items():
        if role not in k.roles and name in knobs and knobs[name] != k.default:
            notes[name] = (f"{name}={knobs[name]} acts on {', '.join(k.roles)} only; role "
                           f"{role!r} keeps {name}={k.default}")
            knobs[name] = k.default
    return knobs, notes


def restart_gaps(requested: dict[str, str]) -> dict[str, str]:
    """Restart-time knobs the control file asks to change: they come from the environment.
    ``requested`` is what acts on this role (``effective_knobs``): a knob that does not act
    here needs no restart of this server."""
    gaps = {}
    for name, k in spec.KNOBS.items():
        running = os.environ.get(k.env, k.default) if k.env else None
        if k.restart and running is not None and requested.get(name) != running:
            gaps[name] = (f"{name} is restart-time: this server runs {name}={running!r} "
                          f"(env {k.env}); the control file asked for {requested.get(name)!r}, "
                          "which needs a restart")
    return gaps


def parse_control(doc: dict | None) -> tuple[int, int, dict[str, str]]:
    """(version, seed, full knob dict) of a control document; None: version 0, defaults.
    Raises ValueError naming a malformed field."""
    if doc is None:
        return 0, 0, spec.defaults()
    version, seed = doc.get("version", 0), doc.get("seed", 0)
    if not isinstance(version, int):
        raise ValueError(f"control version {version!r} is not an integer")
    if not isinstance(seed, int):
        raise ValueError(f"control seed {seed!r} is not an integer")
    return version, seed, spec.validate(dict(doc.get("knobs") or {}))


class Events:
    """The counters and notes a component reports for the current version; mechanisms update
    them from vLLM's threads, the control thread flushes them to the state file."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.events: dict[str, Any] = {}
        self.dirty = False

    def bump(self, section: str, key: str, n: int = 1) -> None:
        with self.lock:
            sec = self.events.setdefault(section, {})
            sec[key] = sec.get(key, 0) + n
            self.dirty = True

    def note(self, section: str, key: str, value: Any) -> None:
        with self.lock:
            self.events.setdefault(section, {})[key] = value
            self.dirty = True

    def append(self, section: str, key: str, value: Any, keep: int = 20) -> None:
        with self.lock:
            lst = self.events.setdefault(section, {}).setdefault(key, [])
            lst.append(value)
            del lst[:-keep]
            self.dirty = True

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return json.loads(json.dumps(self.events, default=str))


class Component(Events):
    """One patched vLLM component in this process and its control thread."""

    def __init__(self, name: str, obj: Any, runner: str = "v1", info: dict | None = None,
                 on_version: Callable[[Component], dict] | None = None):
        if name not in spec.COMPONENTS:
            raise ValueError(f"component {name!r}; allowed: {', '.join(spec.COMPONENTS)}")
        super().__init__()
        self.name, self.obj, self.runner, self.info = name, obj, runner, dict(info or {})
        self.role = os.environ.get(spec.ENV_ROLE, "unknown")
        self.control_path = os.environ.get(spec.ENV_CONTROL_FILE, "")
        self.state_dir = os.environ.get(spec.ENV_STATE_DIR, "")
        self.version, self.seed = 0, 0
        self.requested = spec.defaults()
        self.knobs: dict[str, str] = {}
        self.errors: list[str] = []
        self.unreachable: dict[str, str] = {}
        self._last_flush = 0.0
        self._flushed_for: str | None = None  # the last flush request this state answers
        self._sig: tuple | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.on_version = on_version  # once per control version after the knobs, if given

    def hooks(self) -> dict[str, spec.Hook]:
        """This component's knobs and their hooks, in table order (refused knobs left out)."""
        return {n: k.hooks[self.name] for n, k in spec.KNOBS.items()
                if self.name in k.hooks and n not in _refused}

    def refused(self, knobs: dict[str, str]) -> dict[str, str]:
        """This component's refused knobs: at their default (vLLM untouched) they are in force
        as such; any other value is an error naming the failing checks."""
        mine = [n for n, k in spec.KNOBS.items() if self.name in k.hooks and n in _refused]
        for n in mine:
            if knobs.get(n, spec.KNOBS[n].default) != spec.KNOBS[n].default:
                self.errors.append(f"{n}={knobs[n]} refused on this vLLM build, its patch checks "
                                   f"fail: {', '.join(_refused[n])}")
        return {n: spec.KNOBS[n].default for n in mine}

    # -- state file --------------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return Path(self.state_dir) / f"{self.role}-{self.name}-{os.getpid()}.json"

    def state(self) -> dict:
        with self.lock:
            return {
                "version": self.version, "role": self.role, "component": self.name,
                "pid": os.getpid(), "vllm_version": vllm_version(), "runner": self.runner,
                "knobs": dict(self.knobs), "requested": dict(self.requested), "seed": self.seed,
                "patched": list(_patch.PATCHED), "events": self.snapshot(),
                "errors": list(self.errors), "unreachable": dict(self.unreachable),
                "refused": dict(_refused),
                "info": dict(self.info), "control_file": self.control_path,
                "updated_at": time.time(), "flushed_for": self._flushed_for,
            }

    def write_state(self) -> None:
        if not self.state_dir:
            return
        st = self.state()
        with self.lock:
            self.dirty = False
            self._last_flush = time.monotonic()
        try:
            atomic_write_json(self.state_path, st)
        except OSError as e:
            log(f"{self.name}: cannot write state file {self.state_path}: {e}")

    def remove_state(self) -> None:
        with contextlib.suppress(OSError):
            self.state_path.unlink()

    # -- applying ----------------------------------------------------------------------
    def install(self) -> None:
        """Every install hook of this component's knobs, once (hooks shared by knobs once)."""
        for ref in dict.fromkeys(h.install for h in self.hooks().values() if h.install):
            resolve(ref)(self)

    def apply(self, doc: dict | None) -> None:
        """Apply a control document (None: defaults, version 0)."""
        t_start = time.monotonic()
        try:
            version, seed, requested = parse_control(doc)
        except ValueError as e:  # nothing is applied: what was in force stays in force
            with self.lock:
                self.version = doc.get("version") if isinstance(doc.get("version"), int) else 0
                self.seed = doc.get("seed") if isinstance(doc.get("seed"), int) else 0
                self.events, self.errors, self.unreachable = {}, [str(e)], {}
            log(f"{self.name} role={self.role} rejected version {self.version}: {self.errors}")
            self.write_state()
            return
        knobs, role_notes = effective_knobs(self.role, requested)
        with self.lock:
            self.version, self.seed, self.requested = version, seed, requested
            self.events, self.errors = {}, []
            self.unreachable = restart_gaps(knobs) if doc is not None else {}
        in_force = {name: self._apply_one(name, hook, knobs, role_notes.get(name))
                    for name, hook in self.hooks().items()}
        with self.lock:
            in_force.update(self.refused(knobs))
        per_version = self._per_version() if doc is not None else {}
        with self.lock:
            self.knobs = {k: v for k, v in in_force.items() if v is not None}
            self.events.update(per_version)
            self.events["apply_seconds"] = round(time.monotonic() - t_start, 3)
        log(f"{self.name} role={self.role} applied version {self.version} in "
            f"{self.events['apply_seconds']} s: {self.knobs}"
            + (f" ERRORS {self.errors}" if self.errors else ""))
        self.write_state()

    def _per_version(self) -> dict:
        """The component's own act for a new version (engine core: a fresh prefix cache)."""
        if self.on_version is None:
            return {}
        try:
            return self.on_version(self)
        except Exception as e:  # noqa: BLE001 - report, keep the process alive
            with self.lock:
                self.errors.append(f"per-version action: {type(e).__name__}: {e}")
            return {}

    def _apply_one(self, name: str, hook: spec.Hook, knobs: dict, note: str | None) -> str | None:
        """One knob's apply hook; its events go under ``events[name]``. None if it failed."""
        t0 = time.monotonic()
        try:
            value, events = resolve(hook.apply)(self, knobs, self.seed)
        except Exception as e:  # noqa: BLE001 - report, keep the process alive
            log(f"{self.name}: applying {name} failed: {e}\n{traceback.format_exc(limit=4)}")
            with self.lock:
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
            return None
        with self.lock:
            sec = self.events.setdefault(name, {})
            sec.update(events or {})
            if note:
                sec["note"] = f"{note}; {sec['note']}" if "note" in sec else note
            sec["apply_s"] = round(time.monotonic() - t0, 4)
        return value

    # -- control thread ----------------------------------------------------------------
    def _signature(self) -> tuple | None:
        try:
            st = Path(self.control_path).stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def start(self) -> None:
        """Install, apply the current control file now (synchronously), then poll it."""
        self.install()
        self._sig = self._signature()
        self.apply(read_control(self.control_path) if self._sig else None)
        self._thread = threading.Thread(
            target=self._loop, name=f"workbench-knobs-{self.name}", daemon=True)
        self._thread.start()

    def _poll_once(self) -> None:
        sig = self._signature()
        if sig is not None and sig != self._sig:
            doc = read_control(self.control_path)
            if doc is None:
                return  # half-written (should not happen with os.replace); retry
            self._sig = sig
            if doc.get("version") != self.version:
                self.apply(doc)
        asked = self._flush_asked()
        if asked is not None and asked != self._flushed_for:
            self._flushed_for = asked  # every event counted so far, on disk now
            self.write_state()
        elif self.dirty and time.monotonic() - self._last_flush >= EVENT_FLUSH_S:
            self.write_state()

    def _flush_asked(self) -> str | None:
        """The nonce of the workbench's flush request (``FLUSH_REQUEST``), if one is there."""
        if not self.state_dir:
            return None
        doc = read_control(str(Path(self.state_dir) / FLUSH_REQUEST))
        return doc.get("nonce") if isinstance(doc, dict) else None

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self._poll_once()
            except Exception as e:  # noqa: BLE001 - never let the thread die silently
                log(f"{self.name}: control thread error: {e}\n{traceback.format_exc(limit=4)}")
                time.sleep(1.0)


def start_component(name: str, obj: Any, runner: str = "v1", info: dict | None = None,
                    on_version: Callable[[Component], dict] | None = None) -> Component:
    """Create (once per process and name) and start a component."""
    with _registry_lock:
        if name in _components:
            return _components[name]
        comp = Component(name, obj, runner=runner, info=info, on_version=on_version)
        _components[name] = comp
    comp.start()
    atexit.register(comp.remove_state)
    return comp
