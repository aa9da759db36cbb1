"""A trial that vLLM failed: a server that died, an HTTP error, a request past its deadline.

Each is a failure with a signature (``crash:<role>``, ``timeout:<role>``, ``start:<role>``),
shrunk and written up like any unexplained difference: the loud form of a bug (D dying on a
shape mismatch, ``example-chunked-store``) must not pass as a harmless error. What failed in
the workbench itself (its knob channel, its probe) is no crash of vLLM and stays an ``error``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ..provenance import portable_text

ROLES = ("d", "p", "baseline")  # a dead D is named before the P it may have taken with it
# A line that names what went wrong: a Python exception with its message ("RuntimeError: ...").
ERROR_LINE = re.compile(r"\b[A-Z]\w*(Error|Exception): \S")
TRACEBACK = "Traceback (most recent call last)"
EXCERPT_LINES = 60
# A traceback's file as its package names it: no path of the machine in a committed record.
INSTALLED = re.compile(r'File "[^"]*/(?:site-packages|lib/python3\.\d+)/')


@dataclass(frozen=True)
class Crash:
    kind: str  # "crash" (died or answered an error), "timeout", "start" (could not start)
    role: str
    line: str  # the server's error line (``error_line``), else the client's error
    log_tail: str = ""  # the server's log from its first traceback (``excerpt``)

    @property
    def signature(self) -> str:
        return f"{self.kind}:{self.role}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "signature": self.signature}


def role_of(url: str, servers: dict[str, Any]) -> str | None:
    return next((r for r, s in servers.items() if url.startswith(s.url)), None)


def error_line(text: str) -> str | None:
    """The cause: the first exception line after the first traceback of this start (the
    engine core's; the API server's ``EngineDeadError`` comes after it), from the exception's
    name on (vLLM's log prefix cut); without a traceback, the last exception line."""
    lines = text.splitlines()
    at = _first_traceback(lines)
    for ln in lines[at:] if at is not None else reversed(lines):
        if m := ERROR_LINE.search(ln):
            return ln[m.start():].strip()
    return None


def excerpt(text: str) -> str:
    """The server's first traceback and what follows it (a server that died logs its
    shutdown after the cause), else its last lines."""
    lines = text.splitlines()
    at = _first_traceback(lines)
    return "\n".join(lines[at:at + EXCERPT_LINES] if at is not None else lines[-40:])


def _first_traceback(lines: list[str]) -> int | None:
    return next((i for i, ln in enumerate(lines) if TRACEBACK in ln), None)


def classify(e: BaseException, servers: dict[str, Any], kind: str | None = None) -> Crash | None:
    """The crash ``e`` shows, or None when vLLM did not fail (the workbench's own error). A
    dead server is named first (the request that saw it die only reports the symptom)."""
    dead = [r for r in ROLES if r in servers and not servers[r].alive()]
    req = getattr(e, "request", None) if isinstance(e, httpx.HTTPError) else None
    asked = role_of(str(req.url), servers) if req is not None else None
    if dead:
        role = asked if asked in dead else dead[0]
        return _with_log("start" if kind == "start" else "crash", role, e, servers)
    if kind == "start" and (role := _named(str(e))):
        return _with_log("start", role, e, servers)
    if asked is None:
        return None
    if isinstance(e, httpx.TimeoutException):
        return _with_log("timeout", asked, e, servers)
    return _with_log("crash", asked, e, servers)


def _named(text: str) -> str | None:
    """The role a start-up error names (``ServerError``: "d server exited ...")."""
    return next((r for r in ROLES if text.startswith(f"{r} server")), None)


def _with_log(kind: str, role: str, e: BaseException, servers: dict[str, Any]) -> Crash:
    server = servers.get(role)  # a server whose start failed is not in the set: its error
    text = server.output() if hasattr(server, "output") else str(e)  # quotes its log
    text = portable_text(INSTALLED.sub('File "', text))
    return Crash(kind, role, error_line(text) or _client_line(e), excerpt(text))


def _client_line(e: BaseException) -> str:
    if isinstance(e, httpx.HTTPStatusError):
        return f"HTTP {e.response.status_code}: {e.response.text[:300]}"
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]
