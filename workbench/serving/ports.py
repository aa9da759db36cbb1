"""Ports for the servers: chosen outside the kernel's ephemeral range, checked as uvicorn binds.

A port from ``bind(("127.0.0.1", 0))`` lies in the ephemeral range, where the kernel also
puts every outgoing connection's local port and every other process's ``bind(0)`` (vLLM's
``get_open_port``); a server binds its port tens of seconds after the pick, and meanwhile the
kernel may hand it to anyone. Outside that range only an explicit bind takes it
(docs/troubleshooting.md#a-port-is-taken).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from ..config import ConfigError

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below, the ports of services a researcher's machine commonly runs (8888...)
TRIES = 200
# Not seeded with the run's seed: two processes seeded alike would pick the same ports.
_pick = random.SystemRandom()


def server_socket() -> socket.socket:
    """A socket with the options of the servers that will bind the port: uvicorn (vLLM's API
    server) sets SO_REUSEADDR, so a port whose old connections linger in TIME_WAIT is free
    for it, and must not be called taken here."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s


def ephemeral_range() -> range:
    """The ports the kernel hands out itself (Linux's ``ip_local_port_range``; elsewhere the
    IANA dynamic range, which macOS and the BSDs use)."""
    try:
        low, high = map(int, EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return range(49152, 65536)
    return range(low, high + 1)


def can_bind(port: int, host: str) -> bool:
    with server_socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A random port outside the ephemeral range that binds now; the kernel's choice (in the
    range) only where none of TRIES candidates does."""
    kernel = ephemeral_range()
    candidates = [p for p in range(LOWEST, 65536) if p not in kernel]
    for port in _pick.sample(candidates, min(TRIES, len(candidates))):
        if can_bind(port, host):
            return port
    with server_socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise early, before any server starts, if a port the user asked for is taken."""
    with server_socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ConfigError(f"port {port} on {host} is already in use ({e.strerror}); "
                              "choose another or leave it unset for a free one") from None
