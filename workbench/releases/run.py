"""``python -m workbench releases``: each old release natively, beside the knobs on this one.

For each release of ``--vllm``: its own environment (``.venvs/vllm-<release>``, built once by
``scripts/build-release-env.sh`` with uv), a native run of the CPU pipeline there with the
workbench plugin observe-only (``trial.py``, then ``native_result.py``: a ``result.json`` of the
workbench's own shape), then every knob setting of ``compare.SETTINGS`` on the installed
release on the same prompts (``compare.py``). Last, ``table.py`` and ``figure.py`` turn every
native run under ``--out`` into ``results.csv`` and one ``native_vs_knob`` figure each.

Which releases can be asked for: those in the committed survey (``survey.json``) that run the
CPU pipeline at all (EAGLE3 on the CPU, NIXL with a CPU buffer); the default is the last
release with the unclipped hand-off and P's extra block for a new prompt (0.24.0; the survey
says why no release can serve the eager finalize on the CPU). The installed release needs no
environment: its runs are the knob settings themselves.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from ..config import ConfigError
from ..knobs.release import base_version, version_key, vllm_version
from ..paths import REPO
from ..provenance import atomic_write_text, git_commit
from . import compare, figure, history, matrix, native_result, survey, table, trial
from .envs import env_python

DEFAULT_RELEASES = ("0.24.0",)
DEFAULT_PROMPT_SET, DEFAULT_PROMPTS = "badcase", 32  # half the requests in the bad case
COMMAND = "python -m workbench releases"  # what results.csv and the figures record


def check_releases(versions: list[str], records: dict[str, dict]) -> list[str]:
    """The releases to run natively (the installed one dropped); a clear error for one the
    survey does not know or that cannot run the CPU pipeline."""
    installed = base_version(vllm_version())
    out = []
    for v in versions:
        rec = records.get(v)
        if v == installed:
            print(f"vLLM {v} is installed: its runs are the knob settings", flush=True)
        elif rec is None:
            raise ConfigError(f"--vllm {v}: not in data/releases/survey.json (surveyed: "
                              f"{', '.join(sorted(records, key=version_key))}); run "
                              f"`python -m workbench.releases.survey --vllm {v}` first")
        elif not (rec["cpu_spec_decode"] and rec["nixl_cpu_buffer"]):
            raise ConfigError(f"--vllm {v}: cannot run the CPU PD + EAGLE3 pipeline (spec "
                              f"decode on the CPU: {rec['cpu_spec_decode']}, NIXL with a CPU "
                              f"buffer: {rec['nixl_cpu_buffer']}; survey.json)")
        else:
            out.append(v)
    return out


def native(version: str, prompt_set: str, n: int, out: Path, per_request: bool) -> Path:
    """The native run of ``version``: trial, then its ``result.json`` (kept if there)."""
    run_dir, tag = out / version, f"{prompt_set}{n}"
    done = run_dir / tag / "result.json"
    if done.is_file():
        print(f"{done} exists: the native run is not repeated (delete it to rerun)", flush=True)
        return done
    argv = ["--python", str(env_python(version)), "--out", str(run_dir),
            "--prompt-set", prompt_set, "--prompts", str(n)]
    trial.main(argv + (["--per-request-metrics"] if per_request else []))
    return native_result.write(run_dir, tag)


def native_runs(out: Path) -> list[tuple[str, str]]:
    """Every (release, tag) with a native ``result.json`` under ``out``."""
    return sorted((p.parent.parent.name, p.parent.name)
                  for p in out.glob("*/*/result.json") if not p.parts[-3].startswith("knobs-"))


def aggregate(out: Path, command: str) -> pd.DataFrame:
    """``results.csv`` over every native run under ``out``, and a figure for each."""
    installed = base_version(vllm_version())
    frames = []
    for release, tag in native_runs(out):
        df = table.frame(table.rows(table.load(out, release, tag, installed), tag))
        figure.native_vs_knob(df, out / "figures", {"command": command, "csv": "results.csv",
                                                    "git_commit": git_commit()},
                              stem=f"native_vs_knob-{release}-{tag}")
        frames.append(df)
    if not frames:
        raise RuntimeError(f"no native run under {out} (<release>/<tag>/result.json)")
    all_rows = pd.concat(frames, ignore_index=True)
    atomic_write_text(out / "results.csv", f"# {command}\n" + all_rows.to_csv(index=False))
    return all_rows


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=COMMAND, add_help=add_help,
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", help="comma-separated releases (default: "
                    f"{','.join(DEFAULT_RELEASES)}; with --check, none: give it or --all)")
    ap.add_argument("--prompt-set", default=DEFAULT_PROMPT_SET)
    ap.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS)
    ap.add_argument("--out", default=str(compare.RELEASES_DIR))
    ap.add_argument("--aggregate-only", action="store_true",
                    help="only rebuild results.csv and the figures from the runs under --out")
    ap.add_argument("--check", action="store_true",
                    help="every finding natively on each release of --vllm (or --all): "
                    "history/<release>/check.json, findings-matrix.csv and its figure")
    ap.add_argument("--all", action="store_true",
                    help=f"with --check: {', '.join(history.ALL_RELEASES)}")
    ap.add_argument("--only", help="with --check: comma-separated finding ids (default: all)")
    ap.add_argument("--rerun", action="store_true",
                    help="with --check: run the --only findings again on releases already "
                    "recorded; their outcomes replace the recorded ones, the others stay")
    ap.add_argument("--log-dir", default=str(REPO / ".cache" / "history"),
                    help="with --check: the servers' logs, per release (default: %(default)s)")
    return ap


def execute(args: argparse.Namespace, command: str) -> int:
    """Native runs and knob settings for ``args.vllm`` (unless ``--aggregate-only``), then the
    table and the figures."""
    out = Path(args.out)
    if args.check:
        versions = history.releases_arg(args.vllm, args.all)
        records = history.run(versions, args.only, out, command, Path(args.log_dir), args.rerun)
        print(matrix_table(out), flush=True)
        if bad := history.broken(records):
            print(f"detector-broken (a control did not behave): {', '.join(bad)}", flush=True)
            return 1
        return 0
    if args.all or args.only or args.rerun:
        raise ConfigError("--all, --only and --rerun go with --check")
    if not args.aggregate_only:
        records = survey.load()
        asked = args.vllm or ",".join(DEFAULT_RELEASES)
        for v in check_releases([x.strip() for x in asked.split(",")], records):
            res = native(v, args.prompt_set, args.prompts, out,
                         records[v]["per_request_spec_metrics"])
            nat = json.loads(res.read_text())
            compare.run(nat, compare.knob_dir(compare.tag(nat), out))  # settings not yet run
    rows = aggregate(out, command)
    print(rows[rows["side"] == "pd"][["series", "prompts", "group", "requests", "p0",
                                      "token_agreement", "signature_agrees"]]
          .to_string(index=False))
    return 0


def matrix_table(out: Path) -> str:
    """The matrix as releases across, findings down, one word per verdict."""
    df = pd.read_csv(out / matrix.CSV_NAME)
    grid = df.pivot(index="finding", columns="release", values="verdict")
    cols = sorted(grid.columns, key=version_key)
    return grid[cols].reindex(list(dict.fromkeys(df["finding"]))).to_string()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return execute(parser().parse_args(argv), " ".join([COMMAND, *argv]))


if __name__ == "__main__":
    raise SystemExit(main())
