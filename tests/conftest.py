"""Shared fixtures. vLLM servers are expensive (~30-45 s each to start on the CPU), so one
``Session`` serves every pipeline test; knobs switch at runtime between runs."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from workbench import paths
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


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests that need the shared servers restarted (restart-time knobs) run last, so the
    servers restart once rather than back and forth; the one that binds them beyond loopback
    after the others (they would restart them back to loopback first); those that change
    the KV connector after them, so no test restarts P and D back to NIXL after them. A change
    of model runner restarts all three servers (the baseline too): those tests run last of
    all. Under pytest-xdist each group (``xdist_group``) is queued whole, the shared servers'
    first and the longest after it, and the order above holds within a group."""
    vllm_modules = {i.path for i in items if i.get_closest_marker("vllm")}
    for item in items:
        if (group := xdist_group(Path(item.path), vllm_modules)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: (queue_rank(Path(item.path), vllm_modules),
                                 item.get_closest_marker("restart") is not None,
                                 item.get_closest_marker("runner") is not None,
                                 item.get_closest_marker("connector") is not None,
                                 item.get_closest_marker("beyond_loopback") is not None))


SHARED = "servers"  # the group of every test on the session's servers (``pd_session``)
# Modules that start vLLM of their own, longest first: under ``make test`` (two pytest-xdist
# workers, ``--dist loadgroup``) the second worker runs them, and the tests that start no
# server, beside the first worker's shared servers, whose runs leave one of the two cores idle
# for much of their time (docs/performance.md).
OWN_SERVERS = ("test_check", "test_history_live", "test_attach", "test_training",
               "test_cleanup")


def xdist_group(path: Path, vllm_modules: set) -> str | None:
    """``servers`` for a test on the session's servers, the module's name for a module that
    starts vLLM otherwise (its fixtures are the module's), None for a test either worker may
    run alone."""
    if path.parent.name == SHARED and path.stem not in OWN_SERVERS:
        return SHARED
    return path.stem if path in vllm_modules else None


def queue_rank(path: Path, vllm_modules: set) -> int:
    """Where a test's group is queued: the shared servers' first, the modules that start
    their own next (longest first), the rest as collected."""
    group = xdist_group(path, vllm_modules)
    if group == SHARED:
        return 0
    return 1 + OWN_SERVERS.index(group) if group in OWN_SERVERS else len(OWN_SERVERS) + 1
