"""``python -m workbench check``: every finding on the installed vLLM build, with its controls.

Runs are planned first (each finding's own run and its controls, as ``ExperimentConfig``s),
identical configs run once, and runs are ordered by server shape so that one ``Session``
restarts servers only where a finding needs other server fields (a token budget, the padded
drafter batch, host staging). Each run's ``result.json`` is kept under ``DIR/runs/``; the
verdicts go to ``DIR/check.json`` (and JUnit XML), and the exit code compares them with the
committed expectations of the build's table entry.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError, ExperimentConfig, profile_runner
from ..inputs import profiles
from ..knobs import connector as kv_connector
from ..knobs import spec as knob_spec
from ..paths import DATA, portable, resolve
from ..provenance import atomic_write_json
from . import FINDINGS
from .finding import (
    ABSENT,
    BROKEN,
    CONTROL_BAD,
    CONTROL_OK,
    FAILED,
    NOT_APPLICABLE,
    OWN_RUN,
    PRESENT,
    RUN_FAILED,
    Finding,
    control_status,
    controls_line,
)

EXPECTED = DATA / "findings"
# Small runs: every finding's signal is per request, so 8 prompts of 32 tokens show it.
BASE = {"num_prompts": 8, "max_tokens": 32, "concurrency": 8}
CONTROLS = {"positive": PRESENT, "negative": ABSENT}


@dataclass
class Outcome:
    """One finding's answer, as ``check.json`` holds it."""

    id: str
    verdict: str
    expected: str | None
    evidence: dict[str, Any]
    controls: dict[str, dict[str, Any]]
    seconds: float
    results: list[str] = field(default_factory=list)
    # not-applicable only: "build" when the build refused a knob the finding needs (a
    # difference unless the expectations mark the finding optional), "run" when this
    # invocation (profile, attach mode) cannot run it.
    cause: str | None = None
    optional: bool = False

    @property
    def ok(self) -> bool:
        if self.verdict == NOT_APPLICABLE:
            return self.cause != "build" or self.optional or self.expected is None
        return self.verdict == self.expected


def select(only: str | None) -> list[Finding]:
    """The findings ``--only`` names (all when None); an unknown id is refused by name."""
    if not only:
        return list(FINDINGS.values())
    ids = [s.strip() for s in only.split(",") if s.strip()]
    unknown = [i for i in ids if i not in FINDINGS]
    if unknown:
        raise ConfigError(f"--only {','.join(unknown)}: no such finding; known: "
                          f"{', '.join(FINDINGS)}")
    return [FINDINGS[i] for i in ids]


def config_for(f: Finding, overrides: dict | None, base: dict,
               which: str = "vLLM as released") -> ExperimentConfig:
    """The finding's experiment with ``overrides`` (fields; ``knobs`` merged) over ``base``
    (``knobs`` merged too: the connector), labelled for tables and figures (the label is not
    part of a run's identity, ``key``)."""
    over = dict(overrides or {})
    knobs = {**base.get("knobs", {}), **f.experiment.get("knobs", {}), **over.pop("knobs", {})}
    fields = {**BASE, **{k: v for k, v in base.items() if k != "knobs"},
              **{k: v for k, v in f.experiment.items() if k != "knobs"}, **over}
    profile = fields.pop("profile", "cpu")
    return ExperimentConfig.for_profile(profile, **fields, knobs=knobs,
                                        label=f"{f.id}: {which}")


def runs_of(f: Finding, base: dict) -> dict[str, ExperimentConfig]:
    """``main``, each control that is a run of its own, and each ``also`` run."""
    out = {"main": config_for(f, None, base)}
    for which in CONTROLS:
        over = getattr(f, which)
        if over is not None:
            out[which] = config_for(f, over, base, f"{which} control")
    out.update({label: config_for(f, over, base, label) for label, over in f.also.items()})
    return out


def key(cfg: ExperimentConfig) -> str:
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k != "label"}, sort_keys=True)


def shape(cfg: ExperimentConfig) -> tuple:
    return tuple(cfg.server_key(r) for r in ("p", "d", "baseline"))


def not_applicable(f: Finding, cfgs: dict[str, ExperimentConfig], profile: str,
                   attached: bool, default: ExperimentConfig) -> str | None:
    """Why ``f`` cannot run here: another profile or KV connector, or (attach mode) server
    fields or restart-time knobs the attached servers cannot be given."""
    if f.profiles and profile not in f.profiles:
        return f"applies to the {', '.join(f.profiles)} profile only, not {profile}"
    conn = default.knobs["connector"]
    if f.connectors and conn not in f.connectors:
        return f"applies to connector {', '.join(f.connectors)} only, not {conn}"
    if not attached:
        return None
    restart = knob_spec.restart_knobs()
    for cfg in cfgs.values():
        fields = [n for n in (*ExperimentConfig.SERVER_FIELDS, "k_p", "k_d",
                              "max_num_batched_tokens")
                  if getattr(cfg, n) != getattr(default, n)]
        fields += [f"knob {n}" for n in restart if cfg.knobs[n] != default.knobs[n]]
        if fields:
            return (f"needs servers started with {', '.join(fields)} set; attach mode uses the "
                    "running servers as they are")
    return None


def plan(findings: list[Finding], base: dict, attached: bool, refused=lambda cfg: None
         ) -> tuple[list[tuple[str, ExperimentConfig]], dict[str, dict], dict[str, tuple]]:
    """(the runs in execution order, each finding's {which: run key}, not-applicable
    (cause, reason) by finding: cause ``run`` for this invocation, ``build`` for a knob the
    build refuses). ``refused(cfg)``: why this build cannot run ``cfg``, or None."""
    fields = {**BASE, **base}
    profile = fields.pop("profile", "cpu")
    default = ExperimentConfig.for_profile(profile, **fields)  # the servers attach mode has
    uses, skipped, unique = {}, {}, {}
    for f in findings:
        try:
            cfgs = runs_of(f, base)
        except ConfigError as e:  # a knob it needs does not act through this connector
            skipped[f.id] = ("run", str(e))
            continue
        why = not_applicable(f, cfgs, profile, attached, default)
        refusal = next((r for c in cfgs.values() if (r := refused(c)) is not None), None)
        if why is not None or refusal is not None:
            skipped[f.id] = ("run", why) if why is not None else ("build", refusal)
            continue
        uses[f.id] = {which: key(c) for which, c in cfgs.items()}
        for c in cfgs.values():
            unique.setdefault(key(c), c)
    shapes: dict[tuple, int] = {}
    for c in unique.values():
        shapes.setdefault(shape(c), len(shapes))
    order = sorted(unique.items(), key=lambda kv: shapes[shape(kv[1])])
    return order, uses, skipped


def _control(f: Finding, which: str, result: dict | None, failed: str | None) -> dict:
    """One control: ``own run`` when the finding's own run stands in for it (it proves
    nothing), ``run failed`` when its run did not finish, else ``ok`` or ``BAD``."""
    want = CONTROLS[which]
    if getattr(f, which) is None:
        return {"verdict": None, "ok": None, "status": OWN_RUN, "run": "main",
                "why": "no knob re-creates this independently of the build; the finding's own "
                       "run is all there is"}
    if result is None:
        return {"verdict": None, "ok": None, "status": RUN_FAILED,
                "why": f"control run failed: {failed or 'no result'}"}
    detect = f.negative_detect if which == "negative" and f.negative_detect else f.detect
    v, ev = detect(result)
    return {"verdict": v, "ok": v == want, "status": CONTROL_OK if v == want else CONTROL_BAD,
            "evidence": ev}


def judge(f: Finding, results: dict[str, dict | None], expected: str | None, seconds: float,
          paths: list[str], failed: dict[str, str] | None = None) -> Outcome:
    """The finding's verdict from its runs' results: its own, unless a control misbehaved
    (``detector-broken``) or a run failed (``run-failed``, with why). ``failed``: why each
    run that has no result failed, by which."""
    failed = failed or {}
    main_result = results.get("main")
    main = f.detect(main_result) if main_result else (
        FAILED, {"why": f"its run failed: {failed.get('main') or 'no result'}"})
    controls = {w: _control(f, w, results.get(w), failed.get(w)) for w in CONTROLS}
    evidence = dict(main[1])
    if f.also:
        evidence["also"] = {label: dict(zip(("verdict", "evidence"), f.detect(r), strict=True))
                            if r else {"verdict": None, "why": "its run failed"}
                            for label, r in ((lb, results.get(lb)) for lb in f.also)}
    verdict = main[0]
    if any(c["status"] == CONTROL_BAD for c in controls.values()):
        verdict = BROKEN
    elif (bad := [c["why"] for c in controls.values() if c["status"] == RUN_FAILED]):
        verdict, evidence["why"] = FAILED, "; ".join(bad)
    return Outcome(f.id, verdict, expected, evidence, controls, round(seconds, 1), paths)


def expectations(path: Path | None, entry: str, connector: str = "nixl",
                 runner: str = "v1") -> tuple[Path, dict]:
    """The expectations file (``--expect``, else the build's table entry's): ``findings``
    maps id -> verdict, ``optional`` lists the ids whose not-applicable is no difference. A
    connector other than NIXL pull has its own verdicts under ``connectors``, and Model Runner
    V2 under ``runners``, which replace these (none recorded in a committed file: every verdict
    is unexpected; in a file given with ``--expect``: its own ``findings``)."""
    p = Path(path) if path else EXPECTED / f"expected-{entry}.json"
    if not p.is_file():
        raise ConfigError(f"--expect {p}: no such file; committed: "
                          f"{', '.join(x.name for x in sorted(EXPECTED.glob('expected-*.json')))}")
    doc = json.loads(p.read_text())
    # a file given with --expect that has no entry for this runner or connector is read as
    # written for it: its own ``findings`` (the committed files keep one per connector/runner)
    own = {"optional": doc.get("optional", []),
           "findings": doc.get("findings", {}) if path else {}}
    if runner != knob_spec.KNOBS["runner"].default:
        return p, {**own, **(doc.get("runners") or {}).get(runner, {})}
    if connector == kv_connector.DEFAULT:
        return p, doc
    return p, {**own, **(doc.get("connectors") or {}).get(connector, {})}


def connector_base(profile: str, connector: str) -> dict:
    """The check's base: the profile and the KV connector every run uses. A connector the
    profile's device cannot run is refused here, by name, before any server starts."""
    if connector not in kv_connector.CONNECTORS:
        raise ConfigError(f"--connector {connector!r}: no such connector; known: "
                          f"{', '.join(kv_connector.CONNECTORS)}")
    try:
        kv_connector.check({"connector": connector}, profiles.get(profile).device)
    except ValueError as e:
        raise ConfigError(f"--connector: {e}") from None
    return {"profile": profile, "knobs": {"connector": connector}}


def check_base(profile: str, connector: str, runner: str | None) -> dict:
    """``connector_base`` and the model runner every run uses (None: the profile's)."""
    base = connector_base(profile, connector)
    try:
        base["knobs"]["runner"] = knob_spec.check_value(
            "runner", runner if runner is not None else profile_runner(profile))
    except ValueError as e:
        raise ConfigError(f"--runner: {e}") from None
    return base


def run_names(uses: dict[str, dict]) -> dict[str, str]:
    """Each run key's directory name under ``DIR/runs/``: the first finding and role using it."""
    names: dict[str, str] = {}
    for fid, m in uses.items():
        for which, k in m.items():
            name = f"{fid}-{which}"
            for a, b in ((" ", "_"), ("=", "-"), ("(", ""), (")", ""), ("#", "")):
                name = name.replace(a, b)
            names.setdefault(k, name[:80])
    return names


@dataclass
class Executed:
    """Each planned run's result (None: it failed), seconds, ``result.json`` path and, for a
    failed one, why."""

    results: dict[str, dict | None] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    stopped: str | None = None  # why the runs left were not started (``execute``'s ``stop``)


def execute(session, order, uses, out: Path, command: str, progress=print,
            stop: Callable[[], str | None] | None = None) -> Executed:
    """Run each planned config once; a failed run keeps what was measured and the rest go on,
    unless ``stop`` (asked after a failed run) gives a reason the rest would fail too."""
    done, names = Executed(), run_names(uses)
    for i, (k, cfg) in enumerate(order):
        run_dir = out / "runs" / names[k]
        progress(f"[check] run {i + 1}/{len(order)}: {names[k]}")
        t0 = time.monotonic()
        try:
            done.results[k] = session.run(cfg, out_dir=run_dir, command=command).to_dict()
        except Exception as e:  # noqa: BLE001 - one failed run makes its findings inconclusive
            progress(f"[check] {names[k]} failed: {type(e).__name__}: {e}")
            done.results[k], done.failed[k] = None, f"{type(e).__name__}: {e}"
        done.seconds[k], done.paths[k] = time.monotonic() - t0, portable(run_dir / "result.json")
        if k in done.failed and stop and (why := stop()):
            done.stopped = why
            break
    return done


def outcomes(findings, uses, skipped, done: Executed, expected: dict) -> list[Outcome]:
    out, charged = [], set()
    verdicts, optional = expected.get("findings", {}), set(expected.get("optional", ()))
    for f in findings:
        exp = verdicts.get(f.id)
        if f.id in skipped:
            cause, why = skipped[f.id]
            out.append(Outcome(f.id, NOT_APPLICABLE, exp, {"why": why}, {}, 0.0, cause=cause,
                               optional=f.id in optional))
            continue
        runs = uses[f.id]
        secs = sum(done.seconds.get(k, 0.0) for k in set(runs.values()) - charged)
        charged |= set(runs.values())
        out.append(judge(f, {w: done.results.get(k) for w, k in runs.items()}, exp, secs,
                         sorted({done.paths[k] for k in runs.values() if k in done.paths}),
                         {w: done.failed[k] for w, k in runs.items() if k in done.failed}))
    return out


def write(out: Path, build: dict, outs: list[Outcome], command: str, expect_file: Path,
          junit: Path | None, created: str | None = None, connector: str = "nixl",
          runner: str = "v1") -> Path:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    doc = {"build": build, "connector": connector, "runner": runner, "command": command,
           "expect": portable(expect_file),
           "created": created or now, **({"judged_again": now} if created else {}),
           "ok": all(o.ok for o in outs), "findings": [asdict(o) for o in outs]}
    path = atomic_write_json(out / "check.json", doc, indent=1, sort_keys=False, portable=True)
    if junit is not None:
        write_junit(Path(junit), build, outs)
    return path


def write_junit(path: Path, build: dict, outs: list[Outcome]) -> None:
    """One test case per finding: a failure when its verdict is not the expected one,
    skipped when it does not apply here (a failure where the build refused what it needs);
    each control's status as a property."""
    suite = ET.Element("testsuite", name=f"workbench check, vLLM {build.get('version')}",
                       tests=str(len(outs)), failures=str(sum(not o.ok for o in outs)),
                       skipped=str(sum(o.verdict == NOT_APPLICABLE and o.ok for o in outs)),
                       time=str(round(sum(o.seconds for o in outs), 1)))
    for o in outs:
        case = ET.SubElement(suite, "testcase", classname="workbench.findings", name=o.id,
                             time=str(o.seconds))
        props = ET.SubElement(case, "properties")
        for w, c in o.controls.items():
            ET.SubElement(props, "property", name=f"control.{w}", value=control_status(c))
        if not o.ok:
            ET.SubElement(case, "failure", message=f"verdict {o.verdict}, expected {o.expected}"
                          ).text = json.dumps({"evidence": o.evidence, "controls": o.controls})
        elif o.verdict == NOT_APPLICABLE:
            ET.SubElement(case, "skipped", message=o.evidence.get("why", ""))
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


EVIDENCE_CHARS = 70  # the table's evidence column; check.json has the whole of it


def clip(text: str, width: int) -> str:
    """``text`` cut at a word to ``width`` characters, with an ellipsis where it was cut."""
    if len(text) <= width:
        return text
    return text[:width - 1].rsplit(", ", 1)[0].rstrip(",") + "…"


def table(outs: list[Outcome]) -> str:
    """The one table ``check`` prints."""
    head = (f"{'finding':28} {'verdict':15} {'expected':9} {'controls':30} {'s':>5}  "
            "evidence")
    lines = [head, "-" * len(head)]
    for o in outs:
        ev = clip(", ".join(f"{k}={v}" for k, v in o.evidence.items()
                            if isinstance(v, (int, float, str)) and k != "why"), EVIDENCE_CHARS)
        why = o.evidence.get("why")
        mark = "" if o.ok else "  <-- differs"
        ctl = controls_line(o.controls)
        lines.append(f"{o.id:28} {o.verdict:15} {o.expected or '?':9} {ctl:30} "
                     f"{o.seconds:5.0f}  {ev}{'; ' if ev and why else ''}{why or ''}{mark}")
    return "\n".join(lines)


@dataclass
class Checked:
    """What one ``check`` produced: the outcomes, the build, and where everything went."""

    outcomes: list[Outcome]
    build: Any
    out: Path
    reports: list[Path]
    seconds: float
    runs: int


def run(only: str | None, out: str | Path, *, expect: str | None = None,
        junit: str | None = None, report: str | None = None, profile: str = "cpu",
        urls: dict[str, str] | None = None, knobs_file: str | None = None,
        state_dir: str | None = None, log_dir: str | None = None,
        command: str = "python -m workbench check", connector: str = "nixl",
        runner: str | None = None) -> Checked:
    """Plan, run and judge the findings ``only`` names (all when None); write check.json, and
    JUnit XML and reports when asked. Bad input raises ConfigError before any server starts."""
    from .. import experiment
    from ..knobs import build
    from ..serving import rundir
    from ..serving.server_set import check_vllm_release

    findings = select(only)
    base = check_base(profile, connector, runner)
    runner = base["knobs"]["runner"]
    out = rundir.check_out_dir(str(out))
    b = experiment.local_build() if urls else check_vllm_release()
    if b is None:
        raise ConfigError("check --attach needs the vLLM build the servers run installed here "
                          "too: its table entry names the expectations")
    expect_file, expected = expectations(expect, b.table_entry, connector, runner)
    order, uses, skipped = plan(findings, base, bool(urls),
                                lambda cfg: build.refusal(b, cfg.knobs)
                                or build.lacking(b.table_entry, cfg))
    session = (experiment.Session.attach(urls, knobs_file=knobs_file, state_dir=state_dir)
               if urls else experiment.Session(log_dir))
    t0 = time.monotonic()
    with session:
        done = execute(session, order, uses, out, command)
    outs = outcomes(findings, uses, skipped, done, expected)
    write(out, {**b.record(), "expect_verified": expected.get("verified")}, outs, command,
          expect_file, junit, connector=connector, runner=runner)
    reports = []
    if report:
        from .report import write_reports

        reports = write_reports(Path(report), outs, b, done.results, uses, command)
    return Checked(outs, b, out, reports, time.monotonic() - t0, len(order))


def load(out: str | Path) -> Checked:
    """A check already run into ``out`` (its ``check.json``), to show without running it."""
    from types import SimpleNamespace

    out = Path(out)
    doc = json.loads((out / "check.json").read_text())
    outs = [Outcome(**f) for f in doc["findings"]]
    return Checked(outs, SimpleNamespace(**doc["build"]), out, [],
                   sum(o.seconds for o in outs), len(list(out.glob("runs/*/result.json"))))


def removed_by(build: dict, cfg: ExperimentConfig) -> str | None:
    """What the recorded build's release removed that ``cfg`` asks for (``build.lacking``)."""
    from ..knobs import build as knob_build
    from ..knobs.release import RELEASES

    entry = build.get("table_entry")
    return knob_build.lacking(entry, cfg) if entry in RELEASES else None


def rejudge(out: str | Path, report: str | Path | None = None) -> Checked:
    """Judge a check already run into ``out`` again from its runs' ``result.json`` files
    (the detectors and controls as they are now), rewrite its ``check.json`` and, with
    ``report``, its reports: how committed records follow a change of the verdict logic."""
    from types import SimpleNamespace

    out = Path(out)
    doc = json.loads((out / "check.json").read_text())
    old = {f["id"]: f for f in doc["findings"]}
    findings = [FINDINGS[i] for i in old if i in FINDINGS]
    first = next(iter((out / "runs").glob("*/result.json")), None)
    profile = json.loads(first.read_text())["config"]["profile"] if first else "cpu"
    connector = doc.get("connector", kv_connector.DEFAULT)
    runner = doc.get("runner", knob_spec.KNOBS["runner"].default)
    _, uses, skipped = plan(findings, check_base(profile, connector, runner), attached=False,
                            refused=lambda cfg: removed_by(doc["build"], cfg))
    for fid, f in old.items():  # refused by the build then (its patch checks): still refused
        if f.get("cause") == "build" and fid in uses:
            del uses[fid]
            skipped[fid] = ("build", f["evidence"].get("why"))
    done = Executed()
    for k, name in run_names(uses).items():
        path = out / "runs" / name / "result.json"
        res = json.loads(path.read_text()) if path.is_file() else None
        done.paths[k] = portable(path)
        if res is None or not res.get("complete", True):  # a failed run keeps a partial one
            done.failed[k] = (res or {}).get("error") or "no result.json recorded"
            res = None
        done.results[k] = res
    _, expected = expectations(resolve(doc["expect"]), doc["build"].get("table_entry"),
                               connector, runner)
    outs = outcomes(findings, uses, skipped, done, expected)
    for o in outs:
        o.seconds = old[o.id]["seconds"]
    build = SimpleNamespace(**doc["build"])
    write(out, doc["build"], outs, doc["command"], resolve(doc["expect"]), None, doc["created"],
          connector, runner)
    reports = []
    if report:
        from .report import write_reports

        reports = write_reports(Path(report), outs, build, done.results, uses, doc["command"])
    return Checked(outs, build, out, reports, sum(o.seconds for o in outs), len(done.results))


def main(args, command: str, urls: dict[str, str] | None) -> int:
    """The ``check`` command (``urls``: attach mode's servers, already found answering): 0 when
    every verdict is the expected one, 1 when one differs."""
    c = run(args.only, args.out, expect=args.expect, junit=args.junit, report=args.report,
            profile=args.profile, urls=urls, knobs_file=args.knobs_file,
            state_dir=args.state_dir, log_dir=args.log_dir, command=command,
            connector=args.connector, runner=args.runner)
    print(table(c.outcomes))
    print(f"vLLM {c.build.version} ({c.build.source}, entry {c.build.table_entry}); {c.runs} "
          f"runs in {c.seconds:.0f} s; wrote {c.out / 'check.json'}")
    for p in c.reports:
        print(f"wrote {p}")
    return 0 if all(o.ok for o in c.outcomes) else 1
