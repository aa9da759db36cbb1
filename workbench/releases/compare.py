"""The knob settings that re-create an old release's bug, run on the installed release on the
native run's prompts.

    python -m workbench.releases.compare --native data/releases/0.24.0/badcase32/result.json

Runs the native run's prompts (same set, count and greedy settings, one request at a time as
the native run went) on the installed release with each setting of :data:`SETTINGS`, one
``result.json`` each under ``--out`` (default ``data/releases/knobs-<installed>/<tag>/
<setting>``, shared by every native run on those prompts); ``table.py`` then compares them
with each native run request by request. The native release's D (0.24.0) has no
``pad_spec_decode``, so the setting that matches it exactly on 0.32.0 must gate that padding
too (``load_step=gated-async``); the plain knob is kept beside it to show that difference, and
the fixed pipeline both ways.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import ExperimentConfig
from ..experiment import Session
from ..knobs.release import base_version, vllm_version
from ..paths import DATA

RELEASES_DIR = DATA / "releases"


@dataclass(frozen=True)
class Setting:
    """Knob values on the installed release: ``kind`` "knob" (the bug re-created) or
    "fixed" (every fix in place)."""

    kind: str
    knobs: dict[str, str]


SETTINGS: dict[str, Setting] = {
    "legacy": Setting("knob", {"block_handoff": "legacy"}),
    "legacy, load step gated-async": Setting("knob", {"block_handoff": "legacy",
                                                      "load_step": "gated-async"}),
    # Up to 0.22.1 P withheld a new prompt's lookahead slots (survey.py, P_LOOKAHEAD), so the
    # unclipped hand-off had no extra block to hand over: prefill_lookahead=0 on P.
    "legacy, P lookahead 0, load step gated-async": Setting(
        "knob", {"block_handoff": "legacy", "prefill_lookahead": "0",
                 "load_step": "gated-async"}),
    "fixed": Setting("fixed", {}),
    "fixed, load step gated-async": Setting("fixed", {"load_step": "gated-async"}),
}


def slug(name: str) -> str:
    """A setting's directory name: ``"legacy, load step gated-async"`` ->
    ``legacy-load-step-gated-async``."""
    return name.replace(", ", "-").replace(" ", "-")


def tag(native: dict) -> str:
    """``badcase32``: the native run's prompt set and count."""
    return f"{native['prompt_set']}{native['num_prompts']}"


def knob_dir(prompts_tag: str, root: Path = RELEASES_DIR) -> Path:
    """Where the settings for one prompt set go (they serve every native run on it)."""
    return root / f"knobs-{base_version(vllm_version())}" / prompts_tag


def run(native: dict, out: Path) -> list[Path]:
    """Every setting not yet run under ``out`` (resumable), on the installed release, on the
    native run's prompts, in one Session."""
    cfg = ExperimentConfig(prompt_set=native["prompt_set"], num_prompts=native["num_prompts"],
                           max_tokens=native["config"]["request"]["max_tokens"], concurrency=1)
    todo = {n: s for n, s in SETTINGS.items() if not (out / slug(n) / "result.json").is_file()}
    if not todo:
        return []
    with Session(out / "logs") as s:
        for name, setting in todo.items():
            r = s.run(replace(cfg, knobs={**cfg.knobs, **setting.knobs}), out_dir=out / slug(name))
            print(f"{name}: D {r.pd['per_position']} token agreement {r.token_agreement}",
                  flush=True)
    return [out / slug(n) / "result.json" for n in todo]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--native", required=True, help="a native run's result.json "
                    "(native_result.py)")
    ap.add_argument("--out", help="default: data/releases/knobs-<installed>/<tag>")
    args = ap.parse_args(argv)
    native = json.loads(Path(args.native).read_text())
    run(native, Path(args.out) if args.out else knob_dir(tag(native)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
