"""The vLLM build this process runs: its table entry, and which knobs its source allows.

A build the table lacks (a dev build, a PR branch, a newer release) uses the entry of the
nearest release at or below it (``release.table_entry``). Whatever the version, the entry's
patch checks (its ``*_TARGETS`` and ``*_SOURCE``, ``patch_checks.py``) run on the
installed source before any server starts, because a release with one file patched keeps its
version. A knob is refused when a check of one of its mechanisms fails; the rest stay usable.
The servers the workbench starts get the verdict in ``ENV_VERDICT``, so the plugin inside vLLM
skips exactly those patches (servers started by hand compute it themselves).
"""

from __future__ import annotations

import ast
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from . import release
from . import spec as knob_spec
from .patch_checks import patch_checks
from .source import DirSource, installed_source

ENV_VERDICT = "WORKBENCH_BUILD_VERDICT"  # JSON of Build, set on every server the workbench starts
WHOLE_PLUGIN = "plugin"  # its patches start every knob's components: a failure refuses all
NO_KNOB = ("cpu_pin",)  # the CPU profile's thread restore: a failure skips it, refuses no knob


@dataclass(frozen=True)
class Build:
    """What ``result.json`` records as ``vllm_build``, plus the failing checks by patch set."""

    version: str
    table_entry: str
    source: str  # "table" | "installed-source"
    checks_passed: int
    checks_total: int
    commit: str | None
    failures: dict[str, list[str]] = field(default_factory=dict)  # patch-set key -> checks
    per_set: dict[str, list[int]] = field(default_factory=dict)  # patch-set key -> [passed, total]

    def record(self) -> dict:
        """``result.json``'s ``vllm_build``."""
        out = asdict(self)
        out.pop("failures")
        out.pop("per_set")
        if (parts := release.assembled()) is not None:
            out["assembled"] = parts
        if patches := release.devbuild_patches():
            out["patches"] = patches  # a dev build's: the fuzzer's attribution reads them
        return out

    def table(self) -> list[str]:
        """Per knob (and the plugin's own patches, and ``cpu_pin``): the patch sets it needs,
        their checks passed / total, and whether it is usable on this build."""
        rows = ["| knob | patch sets | checks | verdict |", "|---|---|---|---|"]
        owners = {WHOLE_PLUGIN: "(the plugin itself)", **{m: f"({m}: no knob)" for m in NO_KNOB}}
        for name in [*owners, *(n for n, k in knob_spec.KNOBS.items() if not k.client_side)]:
            keys = [k for k in self.per_set if k.split("/")[0] == name
                    or name in mechanism_knobs(k.split("/")[0]) and k.split("/")[0] != WHOLE_PLUGIN]
            passed = sum(self.per_set[k][0] for k in keys)
            total = sum(self.per_set[k][1] for k in keys)
            bad = any(k in self.failures for k in keys)
            rows.append(f"| {owners.get(name, name)} | {', '.join(keys)} | {passed}/{total} | "
                        f"{'REFUSED' if bad else 'usable'} |")
        return rows

    def refused(self, runner: str | None = None) -> dict[str, list[str]]:
        """Knob -> the failing checks that refuse it (``mechanism_knobs``). With ``runner``,
        a patch set of the other runner (``"<mechanism>/<runner>"``) refuses nothing: its
        patches are never installed there."""
        out: dict[str, list[str]] = {}
        for key, fails in self.failures.items():
            if runner is not None and key_runner(key) not in (None, runner):
                continue
            for knob in mechanism_knobs(key.split("/")[0]):
                out.setdefault(knob, []).extend(fails)
        return out

    def skipped(self, mechanism: str) -> bool:
        """A mechanism no knob owns (``cpu_pin``) whose checks failed: the plugin skips it."""
        return any(k.split("/")[0] == mechanism for k in self.failures)

    def summary(self) -> str:
        """The one line a run says about its build."""
        head = (f"vLLM {self.version}" + (f" (commit {self.commit})" if self.commit else "")
                + (f" is not a release in the workbench's table; it uses the {self.table_entry} "
                   "entry" if self.source == "installed-source" else ""))
        if not self.failures:
            return (f"{head}: all {self.checks_total} patch checks of that entry pass on the "
                    "installed source" if self.source == "installed-source" else head)
        refused = self.refused()
        return (f"{head}: {self.checks_total - self.checks_passed} of {self.checks_total} "
                f"patch checks fail on the installed source; knobs refused: "
                f"{', '.join(refused) or 'none'}; failing: " + "; ".join(
                    f for fs in self.failures.values() for f in fs))


def key_runner(key: str) -> str | None:
    """The runner a patch-set key is for (``"finalize/v2"`` -> ``"v2"``), None for both."""
    part = key.split("/", 1)[1] if "/" in key else None
    return part if part in release.RUNNERS else None


def mechanism_knobs(mechanism: str) -> tuple[str, ...]:
    """The knobs whose hooks live in ``workbench/knobs/<mechanism>.py`` (all knobs for the
    plugin's own patches, none for ``cpu_pin``)."""
    if mechanism == WHOLE_PLUGIN:
        return tuple(n for n, k in knob_spec.KNOBS.items() if not k.client_side)
    if mechanism in NO_KNOB:
        return ()
    return tuple(n for n, k in knob_spec.KNOBS.items() if mechanism in _modules(k))


def _modules(k: knob_spec.KnobSpec) -> set[str]:
    refs = [r for h in k.hooks.values() for r in (h.apply, h.install)] + [k.register]
    return {r.split(":")[0].rsplit(".", 1)[-1] for r in refs if isinstance(r, str)}


def check(version: str, src: DirSource) -> Build:
    """The entry's patch checks on ``src``: passed, total, and failures by patch set."""
    entry, source = release.table_entry(version)
    failures: dict[str, list[str]] = {}
    per_set: dict[str, list[int]] = {}
    for key, ps in release.RELEASES[entry].patches.items():
        counts = per_set.setdefault(key, [0, 0])
        for c in patch_checks(release.Release(entry, {key: ps})):
            ok, where = c.run(src)
            counts[0], counts[1] = counts[0] + ok, counts[1] + 1
            if not ok:
                failures.setdefault(key, []).append(f"{c.name}: {where}")
    passed, total = (sum(c[i] for c in per_set.values()) for i in (0, 1))
    return Build(version, entry, source, passed, total, commit_id(src), failures, per_set)


def commit_id(src: DirSource) -> str | None:
    """``vllm._version.__commit_id__``, read from the file (a wheel's may be None)."""
    tree = src.tree("vllm/_version.py")
    for node in tree.body if tree else []:
        names = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if "__commit_id__" in names and isinstance(node.value, ast.Constant):
            return node.value.value
    return None


@lru_cache(maxsize=1)
def installed() -> Build:
    """The installed build, checked once per process."""
    version = release.vllm_version()
    return check(version, installed_source(version))


def from_env() -> Build | None:
    """The verdict the workbench handed this server (``ENV_VERDICT``), if any."""
    text = os.environ.get(ENV_VERDICT)
    return Build(**json.loads(text)) if text else None


def env(build: Build) -> dict[str, str]:
    return {ENV_VERDICT: json.dumps(asdict(build))}


_said: set[str] = set()


def say_once(build: Build) -> None:
    """Print the build's line once per process where there is something to say."""
    if (build.source == "installed-source" or build.failures) and build.version not in _said:
        _said.add(build.version)
        print(f"workbench: {build.summary()}", file=sys.stderr, flush=True)


def lacking(entry: str, cfg) -> str | None:
    """Why the release of table entry ``entry`` cannot run ``cfg`` (an ``ExperimentConfig``):
    a setting it removed (``Release.removed``), or None."""
    gone = release.RELEASES[entry].lacks(cfg)
    return "; ".join(f"{k} refused, {why}" for k, why in gone.items()) or None


def refusal(build: Build, knobs: dict[str, str]) -> str | None:
    """Why a run asking for ``knobs`` cannot run on ``build`` (None: it can)."""
    if WHOLE_PLUGIN in {k.split("/")[0] for k in build.failures}:
        return (f"vLLM {build.version}: the workbench plugin's own patch targets fail on the "
                f"installed source ({'; '.join(build.failures[WHOLE_PLUGIN])}); no run can "
                "use the knobs on this build")
    runner = knobs.get("runner") or release.runner_for(knob_spec.KNOBS["runner"].default,
                                                       build.version)
    if runner not in (rel := release.RELEASES[build.table_entry]).runners:
        return (f"vLLM {build.version}: runner={runner} refused, "
                f"{release.RUNNER_GONE.get(runner, 'not a model runner it has')}; "
                f"allowed: runner={'|'.join(rel.runners)}")
    asked = knob_spec.changed(knobs)
    refused = {k: v for k, v in build.refused(runner).items() if k in asked}
    if not refused:
        return None
    return (f"vLLM {build.version} (using the {build.table_entry} entry): knob(s) "
            + "; ".join(f"{k}={asked[k]} refused, its checks fail: {', '.join(v)}"
                        for k, v in refused.items())
            + "; a run that leaves them at their defaults still runs")
