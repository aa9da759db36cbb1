"""The package's shape, checked from its source: no import cycle (imports inside functions
included), no class over 250 lines, no function over 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "workbench"
MAX_CLASS, MAX_FUNCTION = 250, 60


def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The workbench modules ``name`` imports anywhere in its source."""
    package = (name if _is_package(name) else name.rpartition(".")[0]).split(".")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                target = f"{base}.{a.name}"
                out.add(target if target in known else base)
    return {m for m in out if m in known and m != name}


def _is_package(name: str) -> bool:
    return (PKG.parent / Path(*name.split(".")) / "__init__.py").is_file()


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    mods = modules()
    graph = {name: imported(name, tree, set(mods)) for name, tree in mods.items()}
    assert graph["workbench.knobs.plugin"] >= {"workbench.knobs.component"}  # the walk sees edges
    assert "workbench.experiment" in graph["workbench.notebook.sweep"]  # in-function imports count
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("kind, limit", [(ast.ClassDef, MAX_CLASS),
                                         ((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION)])
def test_no_class_or_function_is_too_long(kind, limit):
    long = [f"{name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for name, tree in modules().items() for node in ast.walk(tree)
            if isinstance(node, kind) and node.end_lineno - node.lineno + 1 > limit]
    assert not long, f"over {limit} lines: {long}"


def test_session_is_orchestration_only():
    """Server specs, knob channels, measurement and aggregation live in their own modules."""
    (session,) = [n for n in ast.walk(modules()["workbench.experiment"])
                  if isinstance(n, ast.ClassDef) and n.name == "Session"]
    assert session.end_lineno - session.lineno + 1 < 200


# The stages, top to bottom: a module imports only from its own group or from a group listed
# after it. Top-level modules are groups of one.
GROUPS = ("__main__", "cli", "notebook", "fuzz", "upstream", "releases", "findings", "compat",
          "devbuild", "experiment", "figures", "measuring", "serving", "config", "inputs",
          "training", "knobs", "ipc_dir", "provenance", "paths")


def group(module: str) -> str:
    return module.split(".")[1] if "." in module else "workbench"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {g: i for i, g in enumerate(GROUPS)}
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if group(t) != group(m) and rank[group(t)] < rank[group(m)])


def test_every_module_belongs_to_a_listed_group():
    assert {group(m) for m in modules()} - {"workbench"} == set(GROUPS)


def test_groups_import_downward_only():
    mods = modules()
    graph = {name: imported(name, tree, set(mods)) for name, tree in mods.items()}
    assert "workbench.config" in graph["workbench.serving.servers"]  # the walk sees groups
    assert not upward_imports(graph), "upward imports:\n" + "\n".join(upward_imports(graph))


def test_upward_import_finder_finds_one():
    assert upward_imports({"workbench.config": {"workbench.serving.servers"}}) == [
        "workbench.config -> workbench.serving.servers"]
    assert upward_imports({"workbench.serving.servers": {"workbench.config"}}) == []
