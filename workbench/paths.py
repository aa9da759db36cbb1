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
