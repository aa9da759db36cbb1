"""Idempotent class-level monkeypatching with a record of what was installed.

Every patch replaces one attribute of one class in the current process and keeps the
original, so the wrapper can call it and a test can undo it. ``PATCHED`` lists the
"module:Class.method" targets installed in this process; the state files report it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

PATCHED: list[str] = []
_ORIGINALS: dict[tuple[type, str], Any] = {}
_MARK = "__workbench_patch__"


def target_name(cls: type, name: str) -> str:
    return f"{cls.__module__}:{cls.__qualname__}.{name}"


def original(cls: type, name: str) -> Any:
    """The attribute as it was before we patched it (raw: staticmethod objects stay)."""
    return _ORIGINALS[(cls, name)]


def patch(cls: type, name: str, make: Callable[[Any], Any], *, allow_missing: bool = False):
    """Replace ``cls.name`` by ``make(original_function)``; no-op if already patched.

    ``make`` receives the plain function (unwrapped from staticmethod/classmethod) and
    returns the plain replacement; the descriptor kind is preserved. With
    ``allow_missing`` the attribute may be absent (the replacement gets ``None``).
    """
    key = (cls, name)
    if key in _ORIGINALS:
        return
    raw = cls.__dict__.get(name, None)
    if raw is None:
        if hasattr(cls, name):
            raw = getattr(cls, name)
        elif not allow_missing:
            raise AttributeError(f"{target_name(cls, name)} does not exist in this vLLM")
    if isinstance(raw, staticmethod):
        fn, kind = raw.__func__, staticmethod
    elif isinstance(raw, classmethod):
        fn, kind = raw.__func__, classmethod
    else:
        fn, kind = raw, None
    new = make(fn)
    if fn is not None:
        with contextlib.suppress(AttributeError, TypeError):
            functools.update_wrapper(new, fn)
    setattr(new, _MARK, True)
    _ORIGINALS[key] = cls.__dict__.get(name, _MISSING)
    setattr(cls, name, kind(new) if kind is not None else new)
    PATCHED.append(target_name(cls, name))


def add_classmethod(cls: type, name: str, fn: Callable[..., Any]) -> None:
    """Give ``cls`` a classmethod ``name`` (replacing an inherited/absent one)."""
    key = (cls, name)
    if key in _ORIGINALS:
        return
    _ORIGINALS[key] = cls.__dict__.get(name, _MISSING)
    setattr(fn, _MARK, True)
    setattr(cls, name, classmethod(fn))
    PATCHED.append(target_name(cls, name))


class _Missing:
    def __repr__(self) -> str:  # pragma: no cover
        return "<missing>"


_MISSING = _Missing()


def unpatch_all() -> None:
    """Undo every patch (tests only)."""
    for (cls, name), raw in list(_ORIGINALS.items()):
        if raw is _MISSING:
            with contextlib.suppress(AttributeError):
                delattr(cls, name)
        else:
            setattr(cls, name, raw)
    _ORIGINALS.clear()
    PATCHED.clear()
