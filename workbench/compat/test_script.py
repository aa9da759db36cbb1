"""vLLM's PD + EAGLE3 acceptance test script, read from each release's sdist.

``tests/pins/test_gpu_profile.py`` compares ``plan --profile gpu`` with the flags and
environment that vLLM's own script (:data:`SCRIPT`) starts P and D with, written down in
:data:`REFERENCE`. ``make compat`` re-derives that file's ``servers`` and ``server_host`` here,
from the script in each release's sdist (the script is not in the wheel), so the copy cannot
drift from the script; the prose (``what``, ``workbench_additions``, ``source.note``) stays as
written.

The sdist comes from the package index pip uses (PEP 691 JSON, the file's sha256 checked
against the index's): ``pip download --no-binary :all:`` would build the sdist's metadata,
which for vLLM installs its whole build toolchain. Nothing in it is run: the script is read
by :func:`derive`, a small reader of the shell it is written in (defaults, ``if`` and ``for``
blocks, functions, arrays, ``${...}`` and ``$((...))``), on an NVIDIA machine with the
script's defaults and an empty environment. A construct it cannot decide fails the
derivation when a server start depends on it, rather than guessing.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import tarfile
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..paths import DATA

SCRIPT = "tests/v1/kv_connector/nixl_integration/spec_decode_acceptance_test.sh"
REFERENCE = DATA / "vllm-test" / "spec_decode_acceptance_test.json"
INDEX = "https://pypi.org/simple"
PER_SERVER = "<per server>"  # a value the script sets per server instance (ports, GPUs)
ROLES = {"kv_producer": "p", "kv_consumer": "d"}
# The command substitutions whose output the derivation assumes: an NVIDIA machine.
HOST_COMMANDS = {'which nvidia-smi || which rocm-smi || echo ""': "/usr/bin/nvidia-smi"}


class ScriptError(RuntimeError):
    """The script cannot be read as before: read it by hand and update this reader."""


class _Unknown:
    """A value this reader does not know (a command's output, a value set where it could not
    decide a condition)."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


# --------------------------------------------------------------------------- the sdist --
def fetch_sdist(release: str, cache: Path, dist: str = "vllm", index: str = INDEX) -> Path:
    """``<dist>-<release>.tar.gz`` in ``cache``, downloaded once from ``index``."""
    cache.mkdir(parents=True, exist_ok=True)
    name = f"{dist}-{release}.tar.gz"
    path = cache / name
    if path.is_file():
        return path
    req = urllib.request.Request(f"{index.rstrip('/')}/{dist}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        files = {f["filename"]: f for f in json.load(r)["files"]}
    if name not in files:
        raise RuntimeError(f"{index} has no {name}")
    entry = files[name]
    with urllib.request.urlopen(entry["url"], timeout=600) as r:
        data = r.read()
    want = entry.get("hashes", {}).get("sha256")
    if want and hashlib.sha256(data).hexdigest() != want:
        raise RuntimeError(f"{name}: sha256 differs from the index's")
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def read_script(sdist: Path) -> str:
    with tarfile.open(sdist) as t:
        for member in t.getmembers():
            if member.name.split("/", 1)[-1] == SCRIPT:
                f = t.extractfile(member)
                if f is not None:
                    return f.read().decode()
    raise ScriptError(f"{sdist.name} has no {SCRIPT}")


# --------------------------------------------------------------------------- the reader --
@dataclass
class _Stmt:
    text: str
    first: int  # line numbers in the script, 1-based
    last: int


def _statements(text: str) -> list[_Stmt]:
    """Lines joined at trailing backslashes, comments and blank lines dropped."""
    out: list[_Stmt] = []
    buf, first = "", 0
    for no, line in enumerate(text.splitlines(), 1):
        if not buf:
            first = no
            if not line.strip() or line.strip().startswith("#"):
                continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        text = (buf + line).strip()
        buf = ""
        # a one-line block (`for ...; do X; done`, `if ...; then X; fi`): three statements
        m = re.fullmatch(r"((?:for|while|if) .*?; (?:do|then)) (.*); (done|fi)", text)
        if m:
            out += [_Stmt(part, first, no) for part in m.groups()]
        else:
            out.append(_Stmt(text, first, no))
    return out


def _block_end(stmts: list[_Stmt], i: int, opens: tuple[str, ...], close: str) -> int:
    """The index of the statement that closes the block opened at ``i``."""
    depth = 0
    for j in range(i, len(stmts)):
        t = stmts[j].text
        if any(t.startswith(o) for o in opens):
            depth += 1
        if t == close or t.startswith(close + " ") or t.startswith(close + ";"):
            depth -= 1
            if depth == 0:
                return j
    raise ScriptError(f"line {stmts[i].first}: no {close!r} for {stmts[i].text!r}")


def _split_if(stmts: list[_Stmt]) -> list[tuple[str | None, list[_Stmt]]]:
    """An ``if ... fi`` block's branches: (condition, body), the ``else`` with None."""
    branches: list[tuple[str | None, list[_Stmt]]] = []
    cond = stmts[0].text[len("if "):].removesuffix("; then").strip()
    body: list[_Stmt] = []
    depth = 0
    for s in stmts[1:-1]:
        t = s.text
        if depth == 0 and (t.startswith("elif ") or t == "else"):
            branches.append((cond, body))
            cond = None if t == "else" else t[len("elif "):].removesuffix("; then").strip()
            body = []
            continue
        if t.startswith("if "):
            depth += 1
        elif t == "fi":
            depth -= 1
        body.append(s)
    branches.append((cond, body))
    return branches


class _Undecided(Exception):
    pass


class _Exit(Exception):
    pass


@dataclass
class _Server:
    context: dict[str, str]
    vars: dict[str, Any]  # as they were where the script starts it
    words: list[Any]
    first: int
    last: int


@dataclass
class _Expander:
    """Variables, and words and conditions expanded with them."""

    vars: dict[str, Any] = field(default_factory=dict)
    per_server: int = 0  # inside a loop over server instances

    def value(self, name: str) -> Any:
        return self.vars.get(name, "")

    def expand(self, word: str) -> list[Any]:
        """One shell word (quotes already removed) -> its words ("${a[@]}" may give many)."""
        m = re.fullmatch(r"\$\{(\w+)\[@\]\}", word)
        if m:
            v = self.value(m.group(1))
            return list(v) if isinstance(v, list) else [v]
        m = re.fullmatch(r"\$\{(\w+)\[@\]\+(.*)\}", word)
        if m:
            v = self.value(m.group(1))
            if v is UNKNOWN:
                return [UNKNOWN]
            return self.expand(m.group(2)) if isinstance(v, list) and v else []
        out = self.string(word)
        if out == "" and word.startswith("${") and word.endswith("}"):
            return []  # an unquoted expansion to nothing is no word
        return [out]

    def string(self, text: str) -> Any:
        """``text`` with its ``$NAME``, ``${...}``, ``$((...))`` and ``$(...)`` expanded."""
        parts: list[Any] = []
        i = 0
        while i < len(text):
            c = text[i]
            if c != "$" or i + 1 == len(text):
                parts.append(c)
                i += 1
                continue
            nxt = text[i + 1]
            if text.startswith("$((", i):
                end = _matching(text, i + 1, "(", ")")
                parts.append(self.arith(text[i + 3:end - 1]))
                i = end + 1
            elif nxt == "(":
                end = _matching(text, i + 1, "(", ")")
                parts.append(HOST_COMMANDS.get(text[i + 2:end].strip(), UNKNOWN))
                i = end + 1
            elif nxt == "{":
                end = _matching(text, i + 1, "{", "}")
                parts.append(self.brace(text[i + 2:end]))
                i = end + 1
            elif nxt.isalnum() or nxt == "_":
                m = re.match(r"\w+", text[i + 1:])
                parts.append(self.value(m.group(0)))
                i += 1 + m.end()
            else:  # $! $? ...
                parts.append(UNKNOWN)
                i += 2
        if any(p is UNKNOWN for p in parts):
            return UNKNOWN
        if any(p == PER_SERVER for p in parts):
            return PER_SERVER
        return "".join(" ".join(p) if isinstance(p, list) else str(p)
                       for p in parts).replace(_LITERAL_DOLLAR, "$")

    def brace(self, inner: str) -> Any:
        m = re.fullmatch(r"#(\w+)\[@\]", inner)
        if m:
            v = self.value(m.group(1))
            return str(len(v)) if isinstance(v, list) else UNKNOWN
        m = re.fullmatch(r"(\w+)\[(.*)\]", inner)
        if m:  # one element: per server inside the loop over instances
            if self.per_server:
                return PER_SERVER
            v, at = self.value(m.group(1)), self.arith(m.group(2))
            ok = isinstance(v, list) and isinstance(at, str) and at != PER_SERVER
            return v[int(at)] if ok and int(at) < len(v) else UNKNOWN
        m = re.fullmatch(r"(\w+)(:-|:\+)?(.*)", inner, re.S)
        if not m:
            raise ScriptError(f"cannot read ${{{inner}}}")
        name, op, rest = m.groups()
        v = self.value(name)
        if op is None:
            if rest:
                raise ScriptError(f"cannot read ${{{inner}}}")
            return v
        empty = v == "" or v == []
        if op == ":-":
            return self.string(rest) if empty else v
        return "" if empty else self.string(rest)

    def arith(self, expr: Any) -> Any:
        text = self.string(expr) if isinstance(expr, str) else expr
        if text is UNKNOWN or text == PER_SERVER:
            return text
        names = re.findall(r"[A-Za-z_]\w*", text)
        values = {n: self.value(n) for n in names}
        if any(v is UNKNOWN for v in values.values()):
            return UNKNOWN
        if any(v == PER_SERVER for v in values.values()):
            return PER_SERVER
        text = re.sub(r"[A-Za-z_]\w*", lambda m: str(values[m.group(0)] or 0), text)
        if not re.fullmatch(r"[0-9+\-*/%()<>=! ]*", text):
            raise ScriptError(f"cannot read $(( {expr} ))")
        return str(int(eval(text.replace("/", "//"))))  # digits and operators only (checked)

    def condition(self, cond: str) -> bool:
        m = re.fullmatch(r"\[\[ (.*) \]\]", cond)
        if not m:
            raise _Undecided(cond)
        words = _words(m.group(1))
        if len(words) == 2 and words[0] in ("-n", "-z"):
            v = self.string(words[1])
            if v is UNKNOWN:
                raise _Undecided(cond)
            return (v != "") == (words[0] == "-n")
        if len(words) == 3:
            a, op, b = self.string(words[0]), words[1], self.string(words[2])
            if UNKNOWN in (a, b) or PER_SERVER in (a, b):
                raise _Undecided(cond)
            if op == "==":
                return fnmatch.fnmatchcase(a, b)
            if op == "!=":
                return not fnmatch.fnmatchcase(a, b)
            ints = {"-lt": int.__lt__, "-le": int.__le__, "-gt": int.__gt__, "-ge": int.__ge__,
                    "-eq": int.__eq__, "-ne": int.__ne__}
            if op in ints:
                return ints[op](int(a), int(b))
        raise _Undecided(cond)



@dataclass
class _Reader(_Expander):
    """The script's statements run as bash would, recording each server it starts."""

    functions: dict[str, list[_Stmt]] = field(default_factory=dict)
    context: dict[str, str] = field(default_factory=dict)  # the loop's kv_buffer_device
    servers: list[_Server] = field(default_factory=list)

    def run(self, stmts: list[_Stmt]) -> None:
        i = 0
        while i < len(stmts):
            s = stmts[i]
            t = s.text
            if re.fullmatch(r"\w+\(\) \{", t):
                end = self._func_end(stmts, i)
                self.functions[t.split("(")[0]] = stmts[i + 1:end]
                i = end + 1
            elif t.startswith("if "):
                end = _block_end(stmts, i, ("if ",), "fi")
                self.run_if(stmts[i:end + 1])
                i = end + 1
            elif t.startswith(("for ", "while ")):
                end = _block_end(stmts, i, ("for ", "while "), "done")
                self.run_loop(stmts[i:end + 1])
                i = end + 1
            else:
                self.command(s)
                i += 1

    @staticmethod
    def _func_end(stmts: list[_Stmt], i: int) -> int:
        for j in range(i + 1, len(stmts)):
            if stmts[j].text == "}":
                return j
        raise ScriptError(f"line {stmts[i].first}: function without its closing brace")

    def run_if(self, block: list[_Stmt]) -> None:
        branches = _split_if(block)
        try:
            for cond, body in branches:
                if cond is None or self.condition(cond):
                    self.run(body)
                    return
        except _Undecided as e:
            self.undecided(block, f"condition {e}")

    def run_loop(self, block: list[_Stmt]) -> None:
        head, body = block[0].text, block[1:-1]
        m = re.fullmatch(r"for (\w+) in (.*); do", head)
        c = re.fullmatch(r"for \(\( (\w+)=(.*?); (.*?); .*? \)\); do", head)
        if m and m.group(2).startswith("$(seq "):
            bounds = [self.arith(w) for w in m.group(2)[len("$(seq "):-1].split(maxsplit=1)]
            if any(not isinstance(b, str) or b == PER_SERVER for b in bounds):
                return self.undecided(block, head)
            if int(bounds[1]) < int(bounds[0]):
                return None
            # one pass stands for every instance: what it sets is per server
            saved = self.vars.get(m.group(1))
            self.vars[m.group(1)] = PER_SERVER
            self.per_server += 1
            try:
                self.run(body)
            finally:
                self.per_server -= 1
                self.vars[m.group(1)] = saved
            return None
        if m:
            words = self.string(m.group(2))
            if words is UNKNOWN or words == PER_SERVER:
                return self.undecided(block, head)
            for w in words.split():
                self.vars[m.group(1)] = w
                self.context[m.group(1)] = w
                self.run(body)
            self.context.pop(m.group(1), None)
            return None
        if c:
            self.vars[c.group(1)] = self.arith(c.group(2))
            if self.arith(c.group(3)) == "0":
                return None
        return self.undecided(block, head)

    def undecided(self, block: list[_Stmt], why: str) -> None:
        """A block this reader cannot decide: fine unless a server start depends on it; what
        it assigns becomes unknown."""
        if any("vllm serve" in s.text or self._calls_server(s.text) for s in block):
            raise ScriptError(f"lines {block[0].first}-{block[-1].last}: cannot decide {why}, "
                              "and a server start depends on it")
        for s in block:
            for m in (re.match(r"(?:local )?(\w+)\+?=", s.text),
                      re.search(r"\bread\b[^<]*?-\w*a (\w+)", s.text)):
                if m:
                    self.vars[m.group(1)] = UNKNOWN

    def _calls_server(self, text: str) -> bool:
        name = text.split(" ", 1)[0]
        return name in self.functions and any(
            "vllm serve" in s.text for s in self.functions[name])

    def command(self, s: _Stmt) -> None:
        t = s.text
        if t.startswith("exit"):
            raise _Exit(f"line {s.first}: {t}")
        m = re.search(r"\bread\b[^<]*?-\w*a (\w+)", t)
        if m:  # read -a NAME: an array this reader cannot fill
            self.vars[m.group(1)] = UNKNOWN
            return
        m = re.fullmatch(r"(?:local )?(\w+)(\+?)=\((.*)\)", t)
        if m:
            items = [x for w in _words(m.group(3)) for x in self.expand(w)]
            if self.per_server:
                items = [PER_SERVER]
            old = self.value(m.group(1)) if m.group(2) else []
            self.vars[m.group(1)] = (UNKNOWN if old is UNKNOWN
                                     else [*(old if isinstance(old, list) else []), *items])
            return
        m = re.fullmatch(r"(?:local )?(\w+)=(.*)", t)
        if m and not t.startswith("env "):
            words = _words(m.group(2)) if m.group(2) else [""]
            value = self.string(words[0]) if len(words) == 1 else UNKNOWN
            self.vars[m.group(1)] = PER_SERVER if self.per_server else value
            return
        words = _words(t)
        if not words:
            return
        if words[0] == "env":
            self.servers.append(_Server(dict(self.context), dict(self.vars), words[1:],
                                        s.first, s.last))
        elif self._calls_server(t):
            saved = dict(self.vars)
            for n, w in enumerate(words[1:], 1):
                self.vars[str(n)] = self.string(w)
            self.run(self.functions[words[0]])
            self.vars = saved

    def server(self, srv: _Server) -> dict[str, Any]:
        self.vars = srv.vars
        env: dict[str, Any] = {}
        words = [w for w in srv.words if w != "&"]
        i = 0
        while i < len(words) and words[i] != "vllm":
            w = words[i]
            whole = w.startswith("${") and _matching(w, 1, "{", "}") == len(w) - 1
            if whole:
                got = self.expand(w)
                w = got[0] if got else None
            i += 1
            if w is None:
                continue
            k = _assignment_split(w)
            if k is None:
                raise ScriptError(f"lines {srv.first}-{srv.last}: cannot read env word {w!r}")
            name, value = (self.string(k[0]), self.string(k[1])) if not whole else k
            env[_known(name, srv, w)] = _known(value, srv, w)
        if words[i:i + 2] != ["vllm", "serve"]:
            raise ScriptError(f"lines {srv.first}-{srv.last}: no `vllm serve` after env")
        args = [x for w in words[i + 2:] for x in self.expand(w)]
        model, args = _known(args[0], srv, "the model"), args[1:]
        flags: dict[str, Any] = {}
        for n, a in enumerate(args):
            if isinstance(a, str) and a.startswith("--"):
                nxt = args[n + 1] if n + 1 < len(args) else None
                value = None if nxt is None or (isinstance(nxt, str) and nxt.startswith("--")) \
                    else _known(nxt, srv, a)
                if isinstance(value, str) and value.startswith("{"):
                    value = json.loads(value)
                flags[a] = value
        return {"model": model, "flags": flags, "env": env}


_LITERAL_DOLLAR = "\ue000"  # a "$" that was quoted: never expanded


def _words(text: str) -> list[str]:
    """Shell words with their quotes removed; ``$(...)``, ``$((...))`` and ``${...}`` stay
    whole (spaces and quotes inside them included), a quoted ``$`` stays literal."""
    words: list[str] = []
    cur, started, i = "", False, 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            if started:
                words.append(cur)
            cur, started = "", False
            i += 1
            continue
        started = True
        if c == "'":
            end = text.index("'", i + 1)
            cur += text[i + 1:end].replace("$", _LITERAL_DOLLAR)
            i = end + 1
        elif c == '"':
            i += 1
            while text[i] != '"':
                if text[i] == "\\" and text[i + 1] in '"\\$`':
                    cur += _LITERAL_DOLLAR if text[i + 1] == "$" else text[i + 1]
                    i += 2
                elif text.startswith(("$(", "${"), i):
                    sub, i = _substitution(text, i)
                    cur += sub
                else:
                    cur += text[i]
                    i += 1
            i += 1
        elif c == "\\" and i + 1 < len(text):
            cur += text[i + 1]
            i += 2
        elif text.startswith(("$(", "${"), i):
            sub, i = _substitution(text, i)
            cur += sub
        else:
            cur += c
            i += 1
    if started:
        words.append(cur)
    return words


def _substitution(text: str, at: int) -> tuple[str, int]:
    """The ``$(...)``, ``$((...))`` or ``${...}`` starting at ``at``, whole, and the index just
    after it: a word keeps it as written, quoted or not."""
    open_ = text[at + 1]
    end = _matching(text, at + 1, open_, ")" if open_ == "(" else "}")
    return text[at:end + 1], end + 1


def _matching(text: str, at: int, open_: str, close: str) -> int:
    """The index of the ``close`` that matches the ``open_`` at ``at``."""
    depth = 0
    for j in range(at, len(text)):
        if text[j] == open_:
            depth += 1
        elif text[j] == close:
            depth -= 1
            if depth == 0:
                return j
    raise ScriptError(f"unbalanced {open_!r} in {text!r}")


def _assignment_split(word: str) -> tuple[str, str] | None:
    """``NAME=value`` (NAME may be a ``${...}`` expansion) -> (NAME, value)."""
    depth = 0
    for j, ch in enumerate(word):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "=" and depth == 0:
            return word[:j], word[j + 1:]
    return None


def _known(value: Any, srv: _Server, what: str) -> Any:
    if value is UNKNOWN:
        raise ScriptError(f"lines {srv.first}-{srv.last}: {what} depends on something this "
                          "reader does not know")
    return value


def derive(text: str) -> dict[str, Any]:
    """P's and D's model, flags and environment per ``kv_buffer_device`` the script tests,
    the host it serves on, and the lines they were read from."""
    r = _Reader()
    try:
        r.run(_statements(text))
    except _Exit as e:
        raise ScriptError(f"the script exits before it starts its servers ({e})") from None
    servers: dict[str, dict[str, Any]] = {}
    lines: dict[str, str] = {}
    for srv in r.servers:
        if len(srv.context) != 1:
            raise ScriptError(f"lines {srv.first}-{srv.last}: a server outside the loop over "
                              "kv_buffer_device values")
        (device,) = srv.context.values()
        got = r.server(srv)
        role = ROLES.get((got["flags"].get("--kv-transfer-config") or {}).get("kv_role"))
        if role is None:
            raise ScriptError(f"lines {srv.first}-{srv.last}: no kv_role P or D")
        if role in servers.setdefault(device, {}):
            raise ScriptError(f"two {role} servers for kv_buffer_device {device}")
        servers[device][role] = got
        lines[role] = f"{srv.first}-{srv.last}"
    if not servers or any(set(v) != {"p", "d"} for v in servers.values()):
        raise ScriptError(f"expected a P and a D per kv_buffer_device, read {servers}")
    host = r.value("SERVER_HOST")
    if not isinstance(host, str) or not host:
        raise ScriptError("no SERVER_HOST")
    return {"server_host": host, "servers": servers,
            "lines": f"P: {lines['p']}, D: {lines['d']} (env and `vllm serve` flags)"}


# --------------------------------------------------------------------------- the record --
def reference(versions: list[str], cache: Path, old: dict[str, Any]) -> dict[str, Any]:
    """The reference file re-derived from each release's script; its prose kept from ``old``.
    Raises ScriptError when the releases' scripts start different servers (the GPU profile
    can equal only one)."""
    derived, shas = {}, {}
    for v in versions:
        text = read_script(fetch_sdist(v, cache))
        shas[v] = hashlib.sha256(text.encode()).hexdigest()
        derived[v] = derive(text)
    first = derived[versions[0]]
    for v in versions[1:]:
        if derived[v]["servers"] != first["servers"] or \
                derived[v]["server_host"] != first["server_host"]:
            raise ScriptError(f"vLLM {versions[0]} and {v}: the script starts different servers")
    same = len(set(shas.values())) == 1
    source = {**old.get("source", {}),
              "repository": "vllm-project/vllm", "path": SCRIPT, "releases": list(versions),
              "read_from": "the releases' sdists, by `make compat` (workbench/compat/"
                           "test_script.py: " + ", ".join(f"vllm-{v}.tar.gz" for v in versions)
                           + (", the same script)" if same else ")"),
              "sha256": shas[versions[0]] if same else shas,
              "lines": first["lines"]}
    return {**old, "source": source, "server_host": first["server_host"],
            "servers": first["servers"]}


def write_reference(versions: list[str], cache: Path, path: Path = REFERENCE) -> bool:
    """Rewrite ``path`` from the releases' scripts; False (and the reason) if it cannot be."""
    old = json.loads(path.read_text()) if path.is_file() else {}
    try:
        new = reference(versions, cache, old)
    except (ScriptError, RuntimeError, OSError) as e:
        print(f"vLLM's test script: {e}; {path} left as it was")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(new, indent=1) + "\n")
    changed = new.get("servers") != old.get("servers") or \
        new.get("server_host") != old.get("server_host")
    print(f"vLLM's test script ({', '.join(versions)}): wrote {path}"
          + (" (servers changed: rerun tests/pins/test_gpu_profile.py)" if changed else ""))
    return True
