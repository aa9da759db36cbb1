"""A fork server for vLLM's API server: torch and vLLM imported once, every server forked.

A CPU server's start was three processes each importing torch and vLLM (docs/performance.md).
With ``fork_start`` (``knobs/fork_start.py``) vLLM forks its engine core and worker from the API
server; this module removes the API server's own import. The zygote, one per owner process and
environment, imports ``vllm.entrypoints.openai.api_server`` once and then, per server, forks a
child that takes its own session (the process group ``VllmServer.stop`` signals), becomes the
server's reaper (``reaper.supervise``: the tree dies with its owner) and forks the server, which
runs vLLM's own entry point (``runpy``, as ``python -m`` does) with the server's environment.

Owner side: :func:`start` returns a handle with ``pid``, ``poll``, ``wait`` and
``returncode``, like the ``subprocess.Popen`` of the reaper it replaces. Zygote side:
:func:`main` (``python -m workbench.serving.zygote --parent PID --fd FD``), one JSON line per
message over a socket pair: ``{"ready"}`` or ``{"error"}`` once, ``{"pid"}`` per fork,
``{"exit", "code"}`` per reaper that ended.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path

# What may differ between servers of one zygote: read after the fork, never at import (the
# workbench's plugin reads its variables when vLLM loads it; vLLM's CPU worker its binding;
# NIXL and UCX theirs when the connector starts; vLLM its IPC directory when it names a socket).
# Anything else forks a zygote of its own.
PER_SERVER_PREFIX = "WORKBENCH_"
PER_SERVER = frozenset({"VLLM_CPU_OMP_THREADS_BIND", "VLLM_NIXL_SIDE_CHANNEL_PORT",
                        "VLLM_NIXL_SIDE_CHANNEL_HOST", "UCX_NET_DEVICES", "VLLM_RPC_BASE_PATH"})
IMPORT = "vllm.entrypoints.openai.api_server"
READY_TIMEOUT_S = 300.0


class ZygoteError(RuntimeError):
    """The fork server could not import vLLM, or died."""


def per_server(name: str) -> bool:
    return name.startswith(PER_SERVER_PREFIX) or name in PER_SERVER


def shared_env(env: dict[str, str]) -> dict[str, str]:
    """The part of a server's environment its zygote imports vLLM under."""
    return {k: v for k, v in env.items() if not per_server(k)}


# ---------------------------------------------------------------------------------------------
# Owner side

_ZYGOTES: dict[tuple, Zygote] = {}
_LOCK = threading.Lock()


def start(module: str, args: list[str], env: dict[str, str], log_path: str) -> Forked:
    """Fork a server running ``python -m module args`` under its reaper, in ``env``."""
    key = tuple(sorted(shared_env(env).items()))
    with _LOCK:
        z = _ZYGOTES.get(key)
        if z is None or z.closed:
            z = _ZYGOTES[key] = Zygote(shared_env(env))
    return z.fork({"module": module, "args": args, "env": env, "log": log_path,
                   "cwd": str(Path.cwd())})


def close_all() -> None:
    with _LOCK:
        zygotes = list(_ZYGOTES.values())
        _ZYGOTES.clear()
    for z in zygotes:
        z.close()


atexit.register(close_all)  # after the servers' own stop_all (atexit runs last-in first)


class Zygote:
    """The owner's end of one fork server."""

    def __init__(self, env: dict[str, str]):
        mine, theirs = socket.socketpair()
        self._sock = mine
        self.proc = subprocess.Popen(
            [sys.executable, "-m", __name__, "--parent", str(os.getpid()),
             "--fd", str(theirs.fileno())],
            env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        self.closed = False
        self.codes: dict[int, int] = {}
        self._replies: queue.Queue = queue.Queue()
        self._done = threading.Condition()
        self._fork_lock = threading.Lock()
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    def fork(self, request: dict) -> Forked:
        with self._fork_lock:
            self._sock.sendall(json.dumps(request).encode() + b"\n")
            reply = self._replies.get(timeout=READY_TIMEOUT_S)
        if "pid" not in reply:
            raise ZygoteError(f"the fork server could not start vLLM's API server: "
                              f"{reply.get('error', reply)}")
        return Forked(self, reply["pid"])

    def _read(self) -> None:
        for message in _messages(self._sock):
            if "exit" in message:
                with self._done:
                    self.codes[message["exit"]] = message["code"]
                    self._done.notify_all()
            elif "ready" not in message:
                self._replies.put(message)
        self.closed = True
        code = self.proc.wait()
        self._replies.put({"error": f"it exited with code {code}"})
        with self._done:
            self._done.notify_all()

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)


class Forked:
    """One server's reaper, forked by the zygote: what ``VllmServer`` asks of a Popen."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid = zygote, pid

    @property
    def returncode(self) -> int | None:
        code = self.zygote.codes.get(self.pid)
        if code is None and self.zygote.closed and not _running(self.pid):
            return 1  # the zygote died first: the reaper's code is lost with it
        return code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote._done:
            if not self.zygote._done.wait_for(lambda: self.returncode is not None, timeout):
                raise subprocess.TimeoutExpired(f"reaper {self.pid}", timeout)
        return self.returncode


def _running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _messages(sock: socket.socket):
    """JSON lines until the peer closes."""
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        messages, buf = _split(buf + chunk)
        yield from messages


def _split(buf: bytes) -> tuple[list[dict], bytes]:
    """The whole JSON lines in ``buf``, and what is left of a line still arriving."""
    *lines, rest = buf.split(b"\n")
    return [json.loads(line) for line in lines if line], rest


# ---------------------------------------------------------------------------------------------
# Zygote side


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {__name__}")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--fd", type=int, required=True)
    args = ap.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    try:
        __import__(IMPORT)
    except BaseException:  # noqa: BLE001 - whatever it is, the owner reads it
        _send(sock, {"error": traceback.format_exc(limit=-3)})
        return 1
    _send(sock, {"ready": True})
    children = _serve_requests(sock, args.parent)
    _stop(children)
    return 0


def _send(sock: socket.socket, message: dict) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(json.dumps(message).encode() + b"\n")


def _serve_requests(sock: socket.socket, owner: int) -> set[int]:
    """Fork a server per request and report each reaper's end, until the owner is gone."""
    import psutil

    children: set[int] = set()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    buf = b""
    while not stop["now"] and psutil.pid_exists(owner):
        readable, _, _ = select.select([sock], [], [], 0.5)
        if readable:
            chunk = sock.recv(65536)
            if not chunk:
                break
            requests, buf = _split(buf + chunk)
            for request in requests:
                pid = _fork_server(request, sock, owner)
                children.add(pid)
                _send(sock, {"pid": pid})
        _reap(sock, children)
    return children


def _reap(sock: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _stop(children: set[int]) -> None:
    """The owner is gone or closed us: each reaper stops its server's tree."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def _fork_server(request: dict, sock: socket.socket, owner: int) -> int:
    """In a forked child: a session of its own, the server's log, then its reaper."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        sock.close()
        os.setsid()
        fd = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        code = _reaper(request, owner)
    except BaseException:  # noqa: BLE001 - a forked child never returns into the loop
        traceback.print_exc()
    finally:
        _exit(code)


def _reaper(request: dict, owner: int) -> int:
    import psutil

    from .. import ipc_dir
    from . import reaper

    command = f"{sys.executable} -m {request['module']} {' '.join(request['args'])}"
    _title(f"{sys.executable} -m {reaper.__name__} --parent {owner} -- {command}")
    reaper.become_subreaper()
    born = psutil.Process(owner).create_time()  # raises if the owner is gone already
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _server(request, command)
    return reaper.supervise(_Child(pid), lambda: _gone(owner, born), owner,
                            request["env"].get(ipc_dir.ENV))


def _gone(pid: int, born: float) -> bool:
    import psutil

    try:
        return psutil.Process(pid).create_time() != born
    except psutil.NoSuchProcess:
        return True


def _server(request: dict, command: str) -> None:
    """The forked server: vLLM's entry point as ``python -m`` runs it; never returns."""
    import runpy

    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        _title(command)
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as the interpreter would: printed, exit 1
        traceback.print_exc()
        code = 1
    _exit(code, finalize=True)


def _exit(code: int, finalize: bool = False) -> None:
    """Leave a forked child without returning into the zygote's loop. The server gets what
    an interpreter's exit gives it: non-daemon threads joined, atexit handlers run."""
    if finalize:
        with contextlib.suppress(BaseException):
            threading._shutdown()
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _title(title: str) -> None:
    """What ``ps`` shows, as it showed for a spawned server and its reaper."""
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle(title)


class _Child:
    """A forked child as ``reaper.supervise`` asks of a Popen."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the tree's stop (psutil): as Popen says, 0
                self.returncode = 0
            else:
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int:
        import time

        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"server {self.pid}", timeout)
            time.sleep(0.1)
        return self.returncode


if __name__ == "__main__":
    sys.exit(main())
