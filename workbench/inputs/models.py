"""Model names a config may hold: a local directory, or a Hugging Face id fetched once.

A GPU user names ``meta-llama/Llama-3.1-8B-Instruct``; three servers loading an id from an
empty cache at once would each download it (or, with ``HF_HUB_OFFLINE``, each fail). So the
workbench downloads every id once, in its own process and with huggingface_hub's progress
bar, before any server starts; the servers then find the files in the shared cache. Local
directories need nothing and work offline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# org/name as the Hub spells repository ids; a path that exists is never taken for one.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(name: str) -> bool:
    """``org/name`` that is not a path on this machine (``./x/y`` or ``/x`` never are)."""
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def problem(name: str) -> str | None:
    """Why ``name`` cannot be loaded (None: a local model directory, or a Hub id)."""
    if is_hub_id(name):
        return None
    p = Path(name).expanduser()
    if not p.is_dir():
        return f"directory {str(p)!r} does not exist"
    if not (p / "config.json").is_file():
        return f"directory {str(p)!r} has no config.json"
    return None


def offline() -> bool:
    """The user asked for no network (huggingface_hub reads the same variable)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def fetch(names: list[str]) -> dict[str, str]:
    """Download each Hub id once (cached: a second call only checks), before servers start;
    return {id: local snapshot}. Offline, ids must already be in the cache."""
    ids = list(dict.fromkeys(n for n in names if is_hub_id(n)))
    if not ids:
        return {}
    from huggingface_hub import snapshot_download

    out = {}
    for repo in ids:
        if not offline():
            print(f"downloading {repo} (once; Hugging Face cache)", flush=True)
        try:
            out[repo] = snapshot_download(repo_id=repo, local_files_only=offline())
        except Exception as e:  # noqa: BLE001 - any hub failure means the same to the user
            where = "in the Hugging Face cache (HF_HUB_OFFLINE is set)" if offline() else (
                "on the Hugging Face Hub (gated models need HF_TOKEN)")
            raise ValueError(f"model {repo!r} is not a local directory and could not be "
                             f"fetched {where}: {type(e).__name__}: {e}") from None
    return out
