"""Shared fixtures. vLLM servers are expensive (~30-45 s each to start on the CPU), so one
``Session`` serves every pipeline test; knobs switch at runtime between runs."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import psutil
import pytest

from workbench import ipc_dir, paths
from workbench.config import ExperimentConfig


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[str, str]:
    """A randomly initialised target + EAGLE3 drafter: acceptance near zero, but PD must still
    reproduce the baseline token for token."""
    from workbench.training.tiny import make_random_pair

    target, drafter = make_random_pair(tmp_path_factory.mktemp("tiny-pair"))
    amplify(target, gain=4.0)
    return target, drafter


def amplify(model_dir: str, gain: float) -> None:
    """Scale a random target's layer weights so its greedy output depends on the context.

    At initialisation scale the residual stream carries the last token through almost
    untouched (output: the last prompt token, repeated), so a KV corruption could not change
    a single token; with every projection x4 the prefix matters, as in a trained model.
    """
    from safetensors.torch import load_file, save_file

    path = Path(model_dir) / "model.safetensors"
    weights = load_file(path)
    for name, w in weights.items():
        if w.dim() == 2 and "embed" not in name and "lm_head" not in name:
            weights[name] = w * gain
    save_file(weights, path, metadata={"format": "pt"})


def trained_pair_available() -> bool:
    return (paths.DEFAULT_TARGET / "config.json").is_file() and (
        paths.DEFAULT_DRAFTER / "config.json"
    ).is_file()


@pytest.fixture(scope="session")
def model_pair(tiny_pair) -> tuple[str, str]:
    """The shipped trained pair (meaningful acceptance) when present, else the random pair."""
    if trained_pair_available():
        return str(paths.DEFAULT_TARGET), str(paths.DEFAULT_DRAFTER)
    return tiny_pair


@pytest.fixture(scope="session")
def base_cfg(model_pair) -> ExperimentConfig:
    trained = model_pair[0] == str(paths.DEFAULT_TARGET)
    return ExperimentConfig(
        target=model_pair[0], drafter=model_pair[1],
        prompt_set="indomain" if trained else "random",
        num_prompts=16, max_tokens=48,
    )


@pytest.fixture(scope="session")
def pd_session(tmp_path_factory):
    from workbench.experiment import Session

    with Session(tmp_path_factory.mktemp("pd-session")) as s:
        yield s


def tree_pids(server) -> set[int]:
    """The pids of a server's whole process tree (reaper, API server, engine core, worker)."""
    try:
        root = psutil.Process(server.proc.pid)
        return {root.pid} | {c.pid for c in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def ipc_sockets(server) -> dict[str, set[str]]:
    """The server's IPC directory (``workbench/ipc_dir.py``) and every Unix socket its tree bound
    in the temporary directory (vLLM's ZMQ IPC sockets), by the directory they are in."""
    return {server.ipc_path: set(), **sockets_in_tempdir(tree_pids(server))}


def sockets_in_tempdir(pids: set[int]) -> dict[str, set[str]]:
    """Every Unix socket the processes ``pids`` bound in the temporary directory (vLLM's ZMQ
    IPC sockets), by the directory they are in."""
    out: dict[str, set[str]] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(pid).net_connections(kind="unix"):
                if isinstance(c.laddr, str) and c.laddr.startswith(tempfile.gettempdir() + "/"):
                    out.setdefault(str(Path(c.laddr).parent), set()).add(c.laddr)
    return out


def one_ipc_dir(sockets: dict) -> Path:
    """The one directory ``sockets`` (``sockets_in_tempdir``) lie in: none elsewhere in the
    temporary directory, and it is one of ``workbench/ipc_dir.py``'s, holding at least one."""
    assert len(sockets) == 1, sockets
    (where, paths), = sockets.items()
    assert paths and Path(where).name.startswith(ipc_dir.PREFIX), sockets
    return Path(where)


def tree_connections(server, kind: str) -> list:
    """The sockets of ``kind`` (psutil's ``net_connections``) of the server's whole tree."""
    out = []
    for pid in tree_pids(server):
        with contextlib.suppress(psutil.Error):
            out += psutil.Process(pid).net_connections(kind=kind)
    return out


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def pytest_collection_modifyitems(config, items):
    """Tests that need the shared servers restarted (restart-time knobs) run last, so the
    servers restart once rather than back and forth; the one that binds them beyond loopback
    after the others (they would restart them back to loopback first); those that change
    the KV connector after them, so no test restarts P and D back to NIXL after them. A change
    of model runner restarts all three servers (the baseline too): those tests run last of
    all. Under pytest-xdist each scope (``scope``) is queued whole, the shared servers' first
    and the longest after it, and the order above holds within a scope."""
    if stray := [i.nodeid for i in items if i.get_closest_marker("vllm") and
                 scope(i.nodeid) == i.nodeid]:
        raise pytest.UsageError(f"tests that start vLLM belong under tests/ {VLLM_DIRS}, "
                                f"where the scopes below find them: {stray}")
    items.sort(key=lambda item: (queue_rank(item.nodeid),
                                 item.get_closest_marker("restart") is not None,
                                 item.get_closest_marker("runner") is not None,
                                 item.get_closest_marker("connector") is not None,
                                 item.get_closest_marker("beyond_loopback") is not None))


# ``make test`` runs two pytest-xdist workers (``-n 2 --dist loadscope``): one runs every test
# on the session's servers (``pd_session``), whose runs leave one of the two cores idle for
# much of their time (docs/performance.md); the other, beside it, the modules that start vLLM
# of their own (one scope each: their fixtures are the module's), longest first, and the tests
# that start none. The directories whose tests start vLLM, and the modules that start their
# own (those of tests/servers do not use the session's servers), in the order they are queued:
VLLM_DIRS = ("servers", "training", "devbuild")
SHARED = "tests/servers"
OWN_SERVERS = ("test_check", "test_history_live", "test_attach", "test_training",
               "test_cleanup")


def scope(nodeid: str) -> str:
    """The work unit a test belongs to: ``tests/servers`` for a test on the session's servers,
    its module for another module that starts vLLM, the test itself otherwise."""
    path = Path(nodeid.split("::", 1)[0])
    if path.parent.name not in VLLM_DIRS:
        return nodeid
    if path.parent.as_posix() == SHARED and path.stem not in OWN_SERVERS:
        return SHARED
    return path.as_posix()


def queue_rank(nodeid: str) -> int:
    """Where a test's scope is queued: the shared servers' first, the modules that start
    their own next (longest first), the rest as collected."""
    stem = Path(nodeid.split("::", 1)[0]).stem
    if scope(nodeid) == SHARED:
        return 0
    return 1 + OWN_SERVERS.index(stem) if stem in OWN_SERVERS else len(OWN_SERVERS) + 1


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the scopes above. (Not ``loadgroup``: pytest-xdist 3.8 marks a
    group by rewriting ``item._nodeid``, which pytest 9 no longer reads, so no group held;
    pytest-xdist issue #1386.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return Scopes(config, log)
