"""The checks of a release's patch sets on vLLM source: every ``*_TARGETS`` entry exists with the
parameters its wrapper expects, every ``*_SOURCE`` fact (a call order) still holds. They live
with the knobs because the plugin refuses a knob on them inside vLLM (``build.py``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .component import resolve
from .release import Release
from .source import Source, def_text, find_def, params

Outcome = tuple[bool, str]  # (passed, where it was found or why it failed)


@dataclass(frozen=True)
class Check:
    kind: str
    name: str
    run: Callable[[Source], Outcome]


def _target(module: str, cls: str | None, attr: str, expected: list[str] | None) -> Check:
    qual = f"{cls}.{attr}" if cls else attr
    shown = f"({', '.join(expected)})" if expected is not None else ""

    def run(src: Source) -> Outcome:
        found = find_def(src, module, qual)
        if found is None:
            return False, f"{module}:{qual} is missing"
        node, rel = found
        if expected is not None:
            got = params(node) if not isinstance(node, ast.ClassDef) else []
            if got != expected:
                return False, f"{rel}:{node.lineno} takes ({', '.join(got)})"
        return True, f"{rel}:{node.lineno}"

    return Check("target", f"{module}:{qual}{shown}", run)


def _order(module: str, qual: str, snippets: tuple[str, ...]) -> Check:
    def run(src: Source) -> Outcome:
        found = find_def(src, module, qual)
        if found is None:
            return False, f"{module}:{qual} is missing"
        node, rel = found
        text, at = def_text(src, node, rel), 0
        for s in snippets:
            at = text.find(s, at)
            if at < 0:
                return False, f"{rel}:{node.lineno}: {s!r} not found after the snippet before it"
            at += len(s)
        return True, f"{rel}:{node.lineno}"

    return Check("order", f"{module}:{qual}: " + " < ".join(snippets), run)


def checks_for(targets, source=()) -> Iterator[Check]:
    """The checks of one ``*_TARGETS`` tuple and its ``*_SOURCE`` facts."""
    for module, cls, attr, expected in targets:
        yield _target(module, cls, attr, expected)
    for module, qual, snippets in source:
        yield _order(module, qual, snippets)


def failures(targets, source, src: Source) -> dict[str, str]:
    """The checks of ``targets`` and ``source`` that fail on ``src``: name -> why."""
    return {c.name: where for c in checks_for(targets, source)
            for ok, where in [c.run(src)] if not ok}


def failures_installed(targets, source, version: str) -> dict[str, str]:
    """``failures`` on the running release's own source: how an observe-only port decides,
    in each vLLM process, whether it may install."""
    from .source import installed_source

    return failures(targets, source, installed_source(version))


def table_patches(mechanism: str, version: str, runner: str, before: tuple[tuple, tuple]
                  ) -> tuple[tuple, tuple]:
    """``mechanism``'s (targets, source facts) on ``version`` and ``runner``, resolved from the
    release table where it has the release; ``before``, the ones the releases the table lacks
    (the old ones) were checked against, otherwise."""
    from .release import RELEASES, base_version

    if (rel := RELEASES.get(base_version(version))) is None:
        return before
    ps = rel.patch_set(mechanism, runner)
    return resolve(ps.targets), resolve(ps.source) if ps.source else ()


def patch_checks(release: Release) -> Iterator[Check]:
    """Every target and source fact of every patch set of ``release``, in table order."""
    for ps in release.patches.values():
        yield from checks_for(resolve(ps.targets), resolve(ps.source) if ps.source else ())
