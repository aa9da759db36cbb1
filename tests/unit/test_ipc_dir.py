"""``workbench/ipc_dir.py``: a server's socket directory goes with its sockets, and nothing else
is ever removed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from workbench import ipc_dir


def bound(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the file stays after close, as vLLM's do


def test_a_made_directory_goes_with_its_sockets():
    d = Path(ipc_dir.make())
    assert d.stat().st_mode & 0o777 == 0o700
    bound(d / "a")
    bound(d / "b")
    ipc_dir.remove(str(d))
    assert not d.exists()
    ipc_dir.remove(str(d))  # once more: nothing to do, no error


def test_a_directory_it_did_not_make_is_left_alone(tmp_path):
    bound(tmp_path / "a")
    ipc_dir.remove(str(tmp_path))
    assert (tmp_path / "a").exists()


def test_what_is_not_a_socket_stays_and_keeps_its_directory():
    d = Path(ipc_dir.make())
    bound(d / "a")
    (d / "notes.txt").write_text("kept")
    ipc_dir.remove(str(d))
    assert not (d / "a").exists() and (d / "notes.txt").read_text() == "kept"
    (d / "notes.txt").unlink()
    d.rmdir()


def test_no_directory_named_is_nothing_to_do():
    ipc_dir.remove(None)
    ipc_dir.remove("")


def test_a_base_of_the_users_own_holds_the_directory(tmp_path):
    d = Path(ipc_dir.make(str(tmp_path)))
    assert d.parent == tmp_path
    ipc_dir.remove(str(d))
    assert not d.exists() and tmp_path.exists()


def test_an_in_process_engines_directory_goes_when_its_process_exits(tmp_path):
    """``training/evaluate.make_llm`` builds vLLM's engine inside its own process, with no
    reaper: the sockets' directory is removed when that process exits (a real process here,
    binding a socket where vLLM would)."""
    code = ("import os, socket\n"
            "from workbench.training import evaluate\n"
            "with evaluate._ipc_sockets_removed_at_exit():\n"
            "    d = os.environ['VLLM_RPC_BASE_PATH']\n"
            "    socket.socket(socket.AF_UNIX).bind(d + '/engine')\n"
            "print(d, os.environ['VLLM_RPC_BASE_PATH'])\n")
    env = {**os.environ, ipc_dir.ENV: str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    made, after = out.stdout.split()
    assert Path(made).parent == tmp_path and Path(made).name.startswith(ipc_dir.PREFIX)
    assert after == str(tmp_path)  # the user's own setting, as it was
    assert not Path(made).exists() and tmp_path.exists()
