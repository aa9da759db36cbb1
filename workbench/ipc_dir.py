"""A directory of its own for each vLLM engine's ZMQ IPC sockets, removed when it is gone.

vLLM names every IPC socket ``$VLLM_RPC_BASE_PATH/<uuid4>`` (``VLLM_RPC_BASE_PATH`` defaults to
the system's temporary directory; ``vllm.utils.network_utils.get_open_zmq_ipc_path``: the API
server's engine input and output, the executor's message queues) and, stopped however it is
stopped, Ctrl-C included, leaves the socket files behind. So each server the workbench starts
gets a fresh directory here, and its reaper removes it with the tree; an in-process engine
(``training/evaluate.make_llm``) gets one removed when its process exits
(docs/troubleshooting.md).

A leaf module (the standard library only), below the layers that use it.
"""

from __future__ import annotations

import contextlib
import stat
import tempfile
from pathlib import Path

ENV = "VLLM_RPC_BASE_PATH"
PREFIX = "workbench-vllm-ipc-"


def make(base: str | None = None) -> str:
    """A new directory (0700) for one server start's sockets, in ``base`` (where a
    ``VLLM_RPC_BASE_PATH`` of the user's own points) or else the temporary directory."""
    return tempfile.mkdtemp(prefix=PREFIX, dir=base or None)


def remove(path: str | None) -> None:
    """Remove a directory :func:`make` made and the sockets in it; anything else (another
    directory, a file that is not a socket) is left where it is."""
    if not path or not Path(path).name.startswith(PREFIX):
        return
    with contextlib.suppress(FileNotFoundError):
        for entry in Path(path).iterdir():
            if stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # gone already, or holds something not ours
        Path(path).rmdir()
