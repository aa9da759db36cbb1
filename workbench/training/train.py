"""Train the Llama target and its EAGLE3 drafter from scratch, in one command.

    python -m workbench.training.train --out data/models            # full run
    python -m workbench.training.train --out /tmp/m --tiny          # ~1 minute on CPU

Stages (each cached in ``--work-dir``, so an interrupted run resumes where it
stopped): corpus list -> byte-level BPE tokenizer -> token ids -> target
training (periodic checkpoints) -> optional unlikelihood fine-tune -> draft
vocabulary -> drafter training with a multi-step (training-time test) unroll ->
export (safetensors + configs + tokenizer) -> MODEL_CARD.md.  Seeds are fixed; the
device is CUDA when available (about 2 minutes for the full run on an H200), else
CPU (about 6 hours on 2 cores).  ``grid`` runs several settings side by side.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from . import corpus as corpus_mod
from . import tok as tok_mod
from .card import write_card
from .config import FLOAT_FIELDS, FULL, INT_FIELDS, RESUMABLE_FIELDS, TINY, TrainConfig
from .config import aux_layer_ids as aux_layer_ids  # re-exported: the tests import it here
from .data import Data, prepare_data
from .export import save_drafter, save_target
from .loop import Log, Run, pick_device
from .model import count_params
from .stages import copy_candidates as copy_candidates  # re-exported for the tests
from .stages import finetune_target_ul, train_drafter, train_target
from .stages import unlikelihood_term as unlikelihood_term  # re-exported for the tests


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/models")
    ap.add_argument("--work-dir", default=None, help="checkpoints/cache (default "
                    "training-work/, training-work/tiny/ with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="2 layers, 64 wide, a few steps (tests)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--prompts-out", default=None,
                    help="write the held-out prompt set here "
                         "(default: <out>/../prompts/indomain.jsonl; none with --tiny)")
    ap.add_argument("--n-prompts", type=int, default=128)
    ap.add_argument("--stdlib-root", default=None, help=argparse.SUPPRESS)
    for name, kind in [(n, int) for n in INT_FIELDS] + [(n, float) for n in FLOAT_FIELDS]:
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=None)
    ap.add_argument("--aux-layers", default=None,
                    help="target aux layer ids for the drafter, e.g. 2,4,5 "
                         "(default auto: vLLM's (2, L//2, L-3))")
    return ap.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """``--tiny`` or the full settings, with every flag given on the command line applied."""
    base = TINY if args.tiny else FULL
    given = {k: getattr(args, k, None) for k in asdict(base)}
    return replace(base, **{k: v for k, v in given.items() if v is not None})


def claim_work_dir(work: Path, cfg: TrainConfig) -> None:
    """Refuse a work dir whose caches and checkpoints came from other settings."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "hparams.json"
    hp = asdict(cfg)
    if path.exists():
        old = json.loads(path.read_text())
        fixed = [k for k in hp if k not in RESUMABLE_FIELDS]
        if {k: old.get(k) for k in fixed} != {k: hp[k] for k in fixed}:
            raise SystemExit(f"{work} holds a run with other settings {old}; "
                             "use another --work-dir")
    path.write_text(json.dumps(hp, indent=1))


@contextmanager
def logging_to(path: Path) -> Iterator[Log]:
    """A log function that writes each line to stderr and appends it to ``path``."""
    with path.open("a") as f:

        def log(msg: str) -> None:
            line = f"[{time.strftime('%H:%M:%S')}] {msg}"
            print(line, file=sys.stderr, flush=True)
            f.write(line + "\n")
            f.flush()

        yield log


def write_prompt_set(args: argparse.Namespace, data: Data, log: Log) -> tuple[int, str | None]:
    """The held-out prompt set (default ``<out>/../prompts/indomain.jsonl``, none with
    ``--tiny``); returns how many prompts and where."""
    out = args.prompts_out
    if out is None and not args.tiny:
        out = str(Path(args.out).absolute().parent / "prompts" / "indomain.jsonl")
    if not out:
        return 0, out
    prompts = corpus_mod.build_prompts(data.corpus, tok_mod._HFLike(data.tokenizer),
                                       n_prompts=args.n_prompts)
    corpus_mod.write_prompts(prompts, out)
    log(f"prompts: {len(prompts)} held-out prompts -> {out}")
    return len(prompts), out


def main(argv: list[str] | None = None) -> tuple[str, str]:
    args = parse_args(argv)
    cfg = config_from_args(args)
    device = pick_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    work = Path(args.work_dir or ("training-work/tiny" if args.tiny else "training-work"))
    claim_work_dir(work, cfg)
    command = "python -m workbench.training.train " + " ".join(
        sys.argv[1:] if argv is None else argv)
    with logging_to(work / "train.log") as log:
        return _train_and_export(args, cfg, Run(work, device, args.seed, log), command)


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


def _train_and_export(args: argparse.Namespace, cfg: TrainConfig, run: Run,
                      command: str) -> tuple[str, str]:
    t_start = time.time()
    _seed_all(run.seed)
    run.log(f"device {run.device}, threads {torch.get_num_threads()}, settings {asdict(cfg)}")
    data = prepare_data(cfg, run.work, run.log, args.stdlib_root)
    run.log(f"corpus: {len(data.corpus.train_files)} train files ({len(data.train)} tokens), "
            f"{len(data.corpus.heldout_files)} held-out files ({len(data.held)} tokens)")
    n_prompts, prompts_path = write_prompt_set(args, data, run.log)
    _seed_all(run.seed)
    target, tinfo = train_target(cfg, run, data)
    if cfg.ul_steps > 0:
        target, ulinfo = finetune_target_ul(target, cfg, run, data)
        tinfo = {**tinfo, "ul": ulinfo}
    drafter, dinfo = train_drafter(cfg, run, data, target)
    out = Path(args.out)
    save_target(target, cfg.target_config(), data.tok_dir, out / "target")
    save_drafter(drafter, cfg.drafter_config(), out / "drafter")
    info = {**_run_info(command, args.tiny, cfg, run, data),
            "target_params": count_params(target), "drafter_params": count_params(drafter),
            "target": tinfo, "drafter": dinfo, "n_prompts": n_prompts,
            "prompts_path": prompts_path, "total_wall_s": time.time() - t_start}
    (out / "training_info.json").write_text(json.dumps(info, indent=1))
    write_card(out)
    tdir, ddir = str(out / "target"), str(out / "drafter")
    run.log(f"wrote {tdir}, {ddir}, {out / 'MODEL_CARD.md'}")
    return tdir, ddir


def _run_info(command: str, tiny: bool, cfg: TrainConfig, run: Run, data: Data) -> dict:
    """The head of ``training_info.json``: how the run was made and on what."""
    return {
        "command": command, "tiny": tiny, "seed": run.seed, "device": str(run.device),
        "torch": torch.__version__, "host": platform.machine(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else None,
        "hparams": asdict(cfg), "corpus": data.info,
        "n_excluded_files": len(data.corpus.excluded), "excluded_files": data.corpus.excluded,
        "train_tokens": int(len(data.train)), "heldout_tokens": int(len(data.held)),
        "target_config": asdict(cfg.target_config()),
        "drafter_config": asdict(cfg.drafter_config()),
    }


if __name__ == "__main__":
    main()
