"""Where the repository's data lives (the package is installed editable from the repo)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
MODELS = DATA / "models"
DEFAULT_TARGET = MODELS / "target"
DEFAULT_DRAFTER = MODELS / "drafter"
MT_BENCH = DATA / "mt_bench" / "question.jsonl"
INDOMAIN = DATA / "prompts" / "indomain.jsonl"
RUNS = DATA / "runs"


def portable(path: str | Path) -> str:
    """``path`` as a record keeps it: relative to the repository root when inside it, so a
    clone in another directory reads the same record; any other path as given."""
    p = Path(path).expanduser()
    if not p.is_absolute():
        return Path(path).as_posix()
    for candidate in (p, p.resolve()):
        if candidate.is_relative_to(REPO):
            return candidate.relative_to(REPO).as_posix()
    return str(path)


def resolve(path: str | Path) -> Path:
    """A recorded path on this machine: a relative one is relative to the repository root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else REPO / p
