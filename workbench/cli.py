"""``python -m workbench``: run one experiment, a sweep, or print a plan."""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import SWEEP_NUM_PROMPTS, ConfigError, ExperimentConfig, read_json
from .inputs import input_checks
from .inputs.profiles import PROFILES
from .inputs.prompts import SOURCES
from .knobs import spec as knob_spec
from .paths import DEFAULT_DRAFTER, DEFAULT_TARGET
from .serving import rundir


def _add_experiment_args(ap: argparse.ArgumentParser) -> None:
    d = ExperimentConfig.__dataclass_fields__
    ap.add_argument("--config", help="a JSON file of ExperimentConfig fields (flags override it)")
    ap.add_argument("--target", help=f"target model directory (default {DEFAULT_TARGET})")
    ap.add_argument("--drafter", help=f"EAGLE3 drafter directory (default {DEFAULT_DRAFTER})")
    ap.add_argument("--profile", help=f"{', '.join(PROFILES)} (default cpu)")
    ap.add_argument("--prompts", dest="num_prompts", type=int, help=f"number of prompts "
                    f"(default {d['num_prompts'].default})")
    ap.add_argument("--max-tokens", type=int, help="new tokens per request (default: the "
                    "profile's; " + ", ".join(f"{n} {p.default_max_tokens}"
                                              for n, p in PROFILES.items()) + ")")
    ap.add_argument("--prompt-set", help=f"{', '.join(SOURCES)} (default: the profile's; "
                    + ", ".join(f"{n} {p.default_prompt_set}" for n, p in PROFILES.items()) + ")")
    ap.add_argument("--prompt-file", help="JSONL of {'text': ...} or {'prompt_token_ids': [...]}")
    ap.add_argument("--k-p", type=int, help="P's num_speculative_tokens (default 1)")
    ap.add_argument("--k-d", type=int, help="D's and the baseline's num_speculative_tokens "
                    "(default 3)")
    ap.add_argument("--block-size", type=int, help="KV block size (CPU: a multiple of 32)")
    ap.add_argument("--kv-cache-bytes", type=int, help="KV cache size per server (CPU)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--concurrency", type=int, help="requests in flight on each side "
                    f"(default {d['concurrency'].default}; 1: one at a time)")
    ap.add_argument("--no-baseline", action="store_true", help="skip the standalone baseline")
    ap.add_argument("--kv-probe", action="store_true",
                    help="capture every KV layer's blocks per request on P, D and the baseline "
                    "and compare them (result.json: requests[].kv_probe, kv_probe_summary)")
    ap.add_argument("--max-num-batched-tokens", type=_budget, metavar="N|ROLE=N,...",
                    help="vLLM's token budget per scheduler step, for every server or per role "
                    "(p=64,d=64 keeps the baseline unchunked); below a prompt's length its "
                    "prefill runs in chunks (default: vLLM's)")
    ap.add_argument("--no-padded-drafter-batch", action="store_true",
                    help="pass disable_padded_drafter_batch in the speculative config (vLLM "
                    "then turns asynchronous scheduling off)")
    ap.add_argument("--no-enforce-eager", action="store_true",
                    help="drop --enforce-eager (every profile sets it, as vLLM's PD test does): "
                    "graphs compile and Model Runner V2 runs its start-up warm-up")
    ap.add_argument("--host", help="address servers bind to (default 127.0.0.1; anything but "
                    "loopback needs --allow-remote)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow a --host beyond loopback: the servers' endpoints (dev mode "
                    "included) and NIXL's side channel become reachable from other machines")
    for role in ("p", "d", "baseline"):
        ap.add_argument(f"--port-{role}", type=int,
                        help=f"port of the {role} server (default: a free one)")
    ap.add_argument("--knob", action="append", default=[], metavar="NAME=VALUE",
                    help="repeatable; " + knob_spec.help_text()
                    + " (the KV probe is --kv-probe; kv_probe=on works too)")


def _budget(text: str) -> int | dict[str, int]:
    """``64`` (every server) or ``p=64,d=64`` (those roles) for --max-num-batched-tokens."""
    try:
        if "=" not in text:
            return int(text)
        return {r.strip(): int(n) for r, n in (part.split("=", 1) for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a number of tokens (64) or ROLE=N,... (p=64,d=64)") from None


_FLAG_FIELDS = ("target", "drafter", "profile", "num_prompts", "max_tokens", "prompt_set",
                "prompt_file", "k_p", "k_d", "block_size", "kv_cache_bytes", "seed", "host",
                "concurrency", "max_num_batched_tokens")


def _flag_values(args: argparse.Namespace, data: dict) -> dict:
    """``data`` (a config file's fields) overridden by the flags given on the command line."""
    data = dict(data)
    for f in _FLAG_FIELDS:
        if getattr(args, f, None) is not None:
            data[f] = getattr(args, f)
    # A config file's ports or knobs that are no object are left for the config's
    # validation, which names them (merging flags into them would fail with no name).
    ports = data.get("ports", {})
    for role in ("p", "d", "baseline"):
        if getattr(args, f"port_{role}", None) is not None and isinstance(ports, dict):
            ports = {**ports, role: getattr(args, f"port_{role}")}
    if ports:
        data["ports"] = ports
    if args.no_baseline:
        data["run_baseline"] = False
    if args.no_enforce_eager:
        data["enforce_eager"] = False
    if args.no_padded_drafter_batch:
        data["padded_drafter_batch"] = False
    if getattr(args, "kv_probe", False):
        data["kv_probe"] = True
    if args.allow_remote:
        data["allow_remote"] = True
    try:
        if isinstance(data.get("knobs", {}), dict):
            data["knobs"] = knob_spec.parse_assignments(args.knob, data.get("knobs", {}))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # The knob's name works too: one switch.
    if isinstance(data.get("knobs"), dict) and data["knobs"].get("kv_probe") == "on":
        data["kv_probe"] = True
    return data


def _config_file(args: argparse.Namespace) -> dict:
    if not args.config:
        return {}
    data = read_json(args.config)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {args.config!r} must hold a JSON object")
    return data


def config_from_args(args: argparse.Namespace, defaults: dict | None = None,
                     **fixed) -> ExperimentConfig:
    """The config the flags describe, over the config file, over ``defaults``, over the
    profile's defaults (``--profile gpu`` gets vLLM's test's models, block size, lengths)."""
    data = _flag_values(args, {**(defaults or {}), **_config_file(args)})
    profile = data.pop("profile", None) or "cpu"
    return ExperimentConfig.for_profile(profile, **data, **fixed)


def parse_attach(text: str | None) -> dict[str, str] | None:
    """``p=URL,d=URL,baseline=URL`` -> {role: url}."""
    if not text:
        return None
    urls = {}
    for part in text.split(","):
        role, sep, url = part.partition("=")
        if not sep or role.strip() not in ("p", "d", "baseline"):
            raise ConfigError(f"--attach {text!r}: expected p=URL,d=URL[,baseline=URL]")
        urls[role.strip()] = url.strip()
    return urls


def check_attach(urls: dict[str, str], timeout: float = 3.0) -> None:
    """Every attach URL answers ``/health`` now: a dead one is refused in seconds, before the
    knob channel's probes and the servers' start-up waits would spend a minute on it."""
    import httpx

    for role, url in urls.items():
        try:
            parsed = httpx.URL(url)
            if parsed.scheme not in ("http", "https") or not parsed.host:
                raise ValueError("not an http(s) URL with a host")
            status = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout).status_code
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as e:
            raise ConfigError(f"--attach {role}={url!r}: no server answers there "
                              f"({type(e).__name__}: {e}); start it, or fix the URL "
                              "(expected http://HOST:PORT)") from None
        if status != 200:
            raise ConfigError(f"--attach {role}={url!r}: /health answered {status}, not 200 "
                              "(its engine is not up)")


def check_before_start(cfg: ExperimentConfig) -> None:
    """What the session checks again right before its servers start, checked here first so a
    CLI user hears in a second, not after prompts and tokenizer are loaded: the installed
    vLLM release, and the ports asked for; then what this machine allows (the host, the
    memory a KV cache takes), which only a server's start would tell otherwise."""
    from .serving.server_set import check_vllm_release
    from .serving.servers import check_port_free

    check_vllm_release(cfg.knobs)
    for port in cfg.ports.values():
        check_port_free(port, cfg.host)
    input_checks.check_machine(cfg)


def check_prompts(cfgs: list[ExperimentConfig]) -> None:
    """Build each config's prompts, as the run will first thing (the prompt cache keeps them
    for it), and refuse one whose longest prompt and ``max_tokens`` overflow
    ``max_model_len``: vLLM would answer such a request with a 400 once the servers are up."""
    from .inputs import models, prompts

    seen = set()
    for cfg in cfgs:
        key = (cfg.prompt_set, cfg.num_prompts, cfg.max_tokens, cfg.max_model_len, cfg.seed,
               cfg.block_size, cfg.prompt_file, cfg.knobs["double_bos"])
        if models.is_hub_id(cfg.target) or key in seen:
            continue  # a Hub model's tokenizer comes with its download, later
        seen.add(key)
        input_checks.check_prompt_lengths(cfg, prompts.for_config(cfg))


def cmd_run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)  # first: a bad flag is refused before the heavy imports
    urls = parse_attach(args.attach)
    if not urls and (args.knobs_file or args.state_dir):
        flag = "--knobs-file" if args.knobs_file else "--state-dir"
        raise ConfigError(f"{flag} {args.knobs_file or args.state_dir!r} names the knob channel "
                          "of servers a run attaches to; allowed only with --attach (without "
                          "it the run starts its own servers with their own channel)")
    out = rundir.check_out_dir(args.out)
    if urls:
        check_attach(urls)
    else:
        check_before_start(cfg)
    check_prompts([cfg])
    from . import experiment
    from .measuring.measure import RunBars

    command = " ".join(shlex.quote(a) for a in ["python", "-m", "workbench", *sys.argv[1:]])
    progress = RunBars(cfg)  # "starting servers", then prompts done per side
    try:
        if urls:
            session = experiment.Session.attach(urls, knobs_file=args.knobs_file,
                                                state_dir=args.state_dir)
            with session:
                result = session.run(cfg, progress=progress, command=command, out_dir=out)
        else:
            with experiment.Session(args.log_dir) as session:
                result = session.run(cfg, progress=progress, command=command, out_dir=out)
    finally:
        progress.close()
    print(_report(result, getattr(args, "verbose", False)))
    print(f"wrote {out / 'result.json'}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    base = config_from_args(args, defaults={"num_prompts": SWEEP_NUM_PROMPTS})
    from .notebook import sweep

    points = sweep.grid_points(args.grid)  # an unknown grid fails before any server starts
    out = rundir.check_out_dir(args.out)
    check_before_start(base)
    configs = [sweep.point_config(base, pt) for pt in points]
    check_prompts(configs)
    from .serving.server_set import check_vllm_release

    for cfg in configs:  # a point's knob this build refuses, before the first server starts
        check_vllm_release(cfg.knobs)

    def on_point(pt, status):
        print(f"[sweep] {pt.name}: {status}", flush=True)

    table = sweep.run_sweep(points, out, base, use_papermill=not args.in_process,
                            resume=not args.restart, on_point=on_point,
                            keep_going=args.keep_going)
    shown = {"label": "label", "token_agreement": "token_agreement",
             "baseline_acceptance_length": "baseline_acceptance_length",
             "pd_acceptance_length": "pd_acceptance_length", "pd_pos0": "pd_pos0",
             "pd_pos1": "pd_pos1", "pd_pos2": "pd_pos2",
             "effect_headline_pos0_verdict": "verdict_pos0 (headline)"}
    cols = [c for c in shown if c in table]
    print(table[cols].rename(columns=shown).to_string(index=False,
                                                      float_format=lambda v: f"{v:.3f}"))
    if "effect_headline_pos0_verdict" in table:
        print("headline: D against its baseline with D's padded load step (finding "
              "padded-load-step) set aside in the requests that have it; raw verdicts in "
              "results.csv (effect_pos*_verdict)")
    print(f"wrote {out / 'results.csv'} and {out / 'figures'}/")
    for slug, why in table.attrs.get("failed", {}).items():
        print(f"[sweep] {slug} failed (its partial result.json is kept, no row): {why}")
    return 1 if table.attrs.get("failed") else 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Print every server command line and environment, one JSON object per line."""
    import json

    from .serving.channels import FileChannel
    from .serving.plan import server_specs

    cfg = config_from_args(args, require_models=False)
    ch = FileChannel.in_dir(args.log_dir)
    for spec in server_specs(cfg, args.log_dir, knobs_file=ch.knobs_file, state_dir=ch.state_dir):
        print(json.dumps({"role": spec.role, "url": spec.url, "argv": spec.command(),
                          "env": spec.env(), "log": str(spec.log_path)}))
    return 0


DEV_MODE_NOTE = (
    "note: these servers run with VLLM_SERVER_DEV_MODE=1, so the knob channel works over HTTP "
    "(POST /collective_rpc). Dev mode also lets anyone who reaches the port call any worker "
    "method by name and reset the prefix cache, with no key (--api-key guards only /v1). "
    "Pass --no-dev-mode to turn it off (attach with --knobs-file and --state-dir then).")


def cmd_serve(args: argparse.Namespace) -> int:
    import json
    import time

    cfg = config_from_args(args)
    check_before_start(cfg)
    from .experiment import Session

    dev_mode = not args.no_dev_mode
    if dev_mode:
        print(DEV_MODE_NOTE, file=sys.stderr, flush=True)
    with Session(args.log_dir, dev_mode=dev_mode) as s:
        s.ensure(cfg)
        info = {"urls": {r: v.url for r, v in s.servers.items()},
                "knobs_file": str(s.knobs_file), "state_dir": str(s.state_dir),
                "logs": {r: str(v.spec.log_path) for r, v in s.servers.items()}}
        print(json.dumps(info), flush=True)
        attach = ",".join(f"{r}={u}" for r, u in info["urls"].items())
        print(f"attach with: python -m workbench run --attach {attach} --knobs-file "
              f"{info['knobs_file']} --state-dir {info['state_dir']} --out DIR", flush=True)
        while all(v.alive() for v in s.servers.values()):
            time.sleep(1)
        print("a server exited; stopping the others", flush=True)
    return 1


def cmd_compat(args: argparse.Namespace) -> int:
    """Check each release's wheel (``--vllm``) or the installed vLLM (``--installed``)."""
    from . import compat

    if args.installed:
        from .knobs import build

        b = build.installed()
        print(f"{b.summary()} (table entry {b.table_entry}, source {b.source}: "
              f"{b.checks_passed}/{b.checks_total} patch checks pass)")
        print("\n".join(b.table()))
        record = compat.check_installed()
        print(f"{record['source']}: {len(record['checks'])} checks of every kind, "
              f"{'every check passes' if record['ok'] else 'FAILED'}")
        for f in compat.failures(record):
            print(f"  fail: {f}", file=sys.stderr)
        return 0 if record["ok"] else 1
    from .knobs.release import SUPPORTED_VLLM

    versions = [v.strip() for v in (args.vllm or ",".join(SUPPORTED_VLLM)).split(",")]
    unknown = [v for v in versions if v not in SUPPORTED_VLLM]
    if unknown:
        raise ConfigError(f"--vllm {','.join(unknown)}: the plugin has no patch table for it; "
                          f"releases in workbench/knobs/release.py: {', '.join(SUPPORTED_VLLM)}")
    return compat.main(versions, out=Path(args.out), cache=Path(args.cache),
                       readme=None if args.no_readme else compat.README)


def _compat_args(cp: argparse.ArgumentParser) -> None:
    from .compat import CACHE, RECORDS

    cp.add_argument("--vllm", help="comma-separated releases (default: every release in the "
                    "plugin's table), e.g. 0.32.0,0.33.0")
    cp.add_argument("--installed", action="store_true",
                    help="check the installed vLLM's files instead (no download, no record)")
    cp.add_argument("--out", default=str(RECORDS), help="where vllm-<release>.json go")
    cp.add_argument("--cache", default=str(CACHE), help="where downloaded wheels are kept")
    cp.add_argument("--no-readme", action="store_true", help="leave the README table alone")


def _add_attach_args(ap: argparse.ArgumentParser, attach_note: str = "") -> None:
    """Attach mode's flags and the log directory, for ``run`` and ``check``."""
    ap.add_argument("--attach", help="use running servers instead of starting any: "
                    "p=URL,d=URL[,baseline=URL]" + attach_note)
    ap.add_argument("--knobs-file", help="attach mode: the servers' WORKBENCH_KNOBS_FILE")
    ap.add_argument("--state-dir", help="attach mode: the servers' WORKBENCH_KNOBS_STATE_DIR")
    ap.add_argument("--log-dir", default=None, help="server logs and the knob channel "
                    "(default: a private temporary directory, kept if the run fails)")


def cmd_check(args: argparse.Namespace) -> int:
    """Every finding on the installed build (``workbench/findings/check.py``)."""
    from .findings import check

    command = " ".join(shlex.quote(a) for a in ["python", "-m", "workbench", *sys.argv[1:]])
    urls = parse_attach(args.attach)
    if urls:
        check_attach(urls)
    return check.main(args, command, urls)


def _add_check(sub) -> None:
    cp = sub.add_parser(
        "check", help="run every known finding on the installed vLLM build (any build: a "
        "version the release table lacks uses its nearest entry at or below it) and print "
        "finding, verdict, evidence, controls, seconds; exit 0 when every verdict equals the "
        "expectation, 1 when one differs, 2 on bad input",
        description="Run the workbench's findings on the installed vLLM (point it at your own "
        "build by installing it into this environment or putting its directory first on "
        "PYTHONPATH). Exit status: 0 every verdict equals the expectation, 1 one differs, "
        "2 bad input.")
    cp.add_argument("--out", required=True, help="directory for check.json and each run's "
                    "result.json (runs/)")
    cp.add_argument("--only", help="comma-separated finding ids (default: all)")
    cp.add_argument("--expect", help="expected verdicts (default: "
                    "data/findings/expected-<table entry>.json)")
    cp.add_argument("--junit", help="also write JUnit XML here (one test case per finding)")
    cp.add_argument("--report", help="write an issue-ready DIR/<id>.md per present finding, "
                    "and DIR/summary.md")
    cp.add_argument("--profile", default="cpu", help=f"{', '.join(PROFILES)} (default cpu)")
    cp.add_argument("--connector", default="nixl", help="the KV connector every run uses (knob "
                    "connector: docs/connectors.md; default nixl); findings that need a knob "
                    "that does not act through it say not-applicable, with why")
    cp.add_argument("--runner", choices=("v1", "v2"), help="the model runner every run uses "
                    "(knob runner: docs/runners.md; default: the profile's, v1 on the CPU); "
                    "its verdicts are judged against the expectations file's runners.<runner>")
    _add_attach_args(cp, "; findings that need other server fields say not-applicable")
    cp.set_defaults(func=cmd_check)


def cmd_releases(args: argparse.Namespace) -> int:
    """Old releases natively beside the knobs (``workbench/releases/run.py``)."""
    from .releases import run

    return run.execute(args, " ".join([run.COMMAND, *sys.argv[2:]]))


def _releases_args(rp: argparse.ArgumentParser) -> None:
    from .releases import run

    # What ``parents=[run.parser(...)]`` does at construction, done once the command is chosen.
    rp._add_container_actions(run.parser(add_help=False))


def cmd_devbuild(args: argparse.Namespace) -> int:
    """A dev build of the installed vLLM (``workbench/devbuild.py``)."""
    from . import devbuild

    return devbuild.run(args)


def _devbuild_args(dp: argparse.ArgumentParser) -> None:
    from . import devbuild

    devbuild.add_args(dp)


def cmd_fuzz(args: argparse.Namespace) -> int:
    """Search scheduling scenarios for unexplained differences (``workbench/fuzz/``)."""
    from .fuzz import command

    return command.main(args)


def cmd_upstream(args: argparse.Namespace) -> int:
    """Each finding's vLLM-layout test on the release and on its fix (``workbench/upstream/``)."""
    from .upstream import command

    return command.main(args)


def _upstream_args(up: argparse.ArgumentParser) -> None:
    from .upstream import command

    command.add_args(up)


def _fuzz_args(fp: argparse.ArgumentParser) -> None:
    from .fuzz import command

    command.add_args(fp)


def _report(result, verbose: bool = False) -> str:
    from .measuring import readout

    return readout.report(result, verbose)


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser that may add its arguments only once that subcommand is chosen
    (``add_args``): what they need (``releases.run`` imports matplotlib and scipy, ``compat``
    httpx) is imported then, so ``--help`` and the other subcommands answer in well under a
    second."""

    def __init__(self, *args: Any,
                 add_args: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_args = add_args

    def parse_known_args(self, args=None, namespace=None):
        if self._add_args is not None:
            add, self._add_args = self._add_args, None
            add(self)
        return super().parse_known_args(args, namespace)


def _add_deferred(sub) -> None:
    """The subcommands whose flags are added only once one is chosen (``_Subcommand``): what
    those flags import (httpx, matplotlib, scipy) costs the other subcommands nothing."""
    for name, add_args, func, help_ in (
        ("compat", _compat_args, cmd_compat,
         "check the plugin's patches, the GPU profiles' flags, the metric names and the "
         "per-request field against each vLLM release's own source (CUDA wheel via pip "
         "download, cached)"),
        ("releases", _releases_args, cmd_releases,
         "run old vLLM releases natively (their own environments, the plugin observe-only) "
         "beside the knobs that re-create their bugs; results.csv and the native_vs_knob "
         "figures"),
        ("fuzz", _fuzz_args, cmd_fuzz,
         "search generated scheduling scenarios (chunking, prefix sharing, arrivals, aborts, "
         "k, block size, KV pressure) for differences between PD and the baseline that no "
         "known finding explains, and shrink each to a minimal case (Hypothesis)"),
        ("upstream", _upstream_args, cmd_upstream,
         "run each finding's test written for vLLM's own tests/ tree (upstream/<id>/) with "
         "vLLM's helpers from the release's source distribution: it must fail on the "
         "installed release and pass with the finding's fix; DIR/upstream.json"),
        ("devbuild", _devbuild_args, cmd_devbuild,
         "lay the installed vLLM into a new directory as links, as the next dev version of "
         "its release (e.g. 0.32.0 -> 0.32.1.dev1+g0000000; --version), with git-style "
         "unified diffs applied; put it first on PYTHONPATH to run the workbench on it; a "
         "build that fails is removed"),
    ):
        sub.add_parser(name, add_args=add_args, help=help_, description=help_[0].upper()
                       + help_[1:] + ".").set_defaults(func=func)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its flags; a subcommand's own imports wait until it runs."""
    ap = argparse.ArgumentParser(prog="python -m workbench", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Subcommand)
    run = sub.add_parser("run", help="run one experiment and write DIR/result.json")
    _add_experiment_args(run)
    run.add_argument("--out", required=True, help="output directory")
    run.add_argument("--verbose", action="store_true", help="print each note whole (the "
                     "printout keeps a note's first sentence; result.json has them all)")
    _add_attach_args(run)
    run.set_defaults(func=cmd_run)
    sv = sub.add_parser("serve", help="start P, D and the baseline and keep them up until "
                        "Ctrl-C; prints how to attach to them")
    _add_experiment_args(sv)
    sv.add_argument("--log-dir", default=None, help="server logs and the knob channel")
    sv.add_argument("--no-dev-mode", action="store_true",
                    help="start the servers without VLLM_SERVER_DEV_MODE (then the knobs reach "
                    "them only through --knobs-file/--state-dir, not over HTTP)")
    sv.set_defaults(func=cmd_serve)
    sw = sub.add_parser("sweep", help="run a grid of knob settings through papermill, "
                        "resumable; aggregate into results.csv and figures")
    _add_experiment_args(sw)
    sw.add_argument("--grid", default="default", help="grid name (default, load, smoke); "
                    f"{SWEEP_NUM_PROMPTS} prompts a point unless --prompts")
    sw.add_argument("--out", default=str(Path("data") / "results"), help="output directory")
    sw.add_argument("--restart", action="store_true", help="rerun points already complete")
    sw.add_argument("--keep-going", action="store_true",
                    help="a point that fails (a server dies) does not stop the sweep: the next "
                    "point restarts what died; exit 1 at the end, naming each failed point")
    sw.add_argument("--in-process", action="store_true",
                    help="run points in this process instead of one notebook each")
    sw.set_defaults(func=cmd_sweep)
    pl = sub.add_parser("plan", help="print the command line and environment of every server "
                        "a run would start (JSON, one per line), starting nothing")
    _add_experiment_args(pl)
    pl.add_argument("--log-dir", default="/tmp/workbench-plan", help="where logs would go")
    pl.set_defaults(func=cmd_plan)
    _add_check(sub)
    _add_deferred(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130
