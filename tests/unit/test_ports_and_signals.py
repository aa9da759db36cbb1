"""Ports checked as the server binds them, a taken automatic port retried, and a SIGTERM
handler that cannot deadlock. The "server" here is a few lines
of Python under the real reaper, not vLLM."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from workbench.config import ConfigError
from workbench.serving import ports, servers


def _time_wait_port() -> int:
    """A port whose only socket is an accepted connection in TIME_WAIT, from a listener with
    SO_REUSEADDR as uvicorn makes it."""
    srv = ports.server_socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    time.sleep(0.05)
    client.close()
    srv.close()
    time.sleep(0.05)
    return port


def test_an_automatic_port_lies_outside_the_kernels_ephemeral_range():
    """Where the kernel hands out ports itself (outgoing connections, any process's bind(0))
    none is picked: a server binds its port tens of seconds later, and a port from there was
    taken in between (D's NIXL side channel, under two pytest workers)."""
    kernel = ports.ephemeral_range()
    picked = [servers.free_port() for _ in range(50)]
    assert all(p not in kernel and ports.LOWEST <= p < 65536 for p in picked), picked
    assert len(set(picked)) > 40  # at random, not the first free one each time


def test_processes_seeded_alike_pick_different_ports():
    """A run seeds Python's random with its seed; two runs (two pytest workers) seeded alike
    must not walk the same sequence of ports."""
    import random

    picked = set()
    for _ in range(5):
        random.seed(0)
        picked.add(servers.free_port())
    assert len(picked) > 1


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "0A": "LISTEN"}  # include/net/tcp_states.h


def tcp_states(port: int) -> list[str]:
    """The kernel's TCP sockets whose local port is ``port`` (``/proc/net/tcp``), by state."""
    out = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if int(local.split(":")[1], 16) == port:
            out.append(TCP_STATES.get(state, state))
    return out


def test_a_port_in_time_wait_is_free_for_the_server():
    port = _time_wait_port()
    assert tcp_states(port) == ["TIME_WAIT"]  # the port's only socket lingers in TIME_WAIT
    servers.check_port_free(port)  # today: "already in use" (bound without SO_REUSEADDR)


def test_a_listening_port_is_still_taken():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(ConfigError, match="already in use"):
            servers.check_port_free(s.getsockname()[1])


FAKE_SERVER = textwrap.dedent("""
    import http.server, sys
    port = int(sys.argv[1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    try:
        httpd = http.server.HTTPServer(("127.0.0.1", port), H)
    except OSError as e:
        print(f"ERROR: {e}", flush=True)
        sys.exit(1)
    print("serving", port, flush=True)
    httpd.serve_forever()
""")


@dataclass
class FakeSpec(servers.ServerSpec):
    def command(self) -> list[str]:
        return [sys.executable, "-c", FAKE_SERVER, str(self.port)]


def test_an_automatic_port_taken_before_the_bind_is_retried(tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = iter([taken.getsockname()[1]])  # the first "free" port is taken by then
    real = servers.free_port
    monkeypatch.setattr(servers, "free_port", lambda host="127.0.0.1": next(ports, None)
                        or real(host))
    spec = FakeSpec(role="baseline", target="t", drafter="d", num_speculative_tokens=1,
                    log_dir=tmp_path / "logs")
    assert spec.port == taken.getsockname()[1] and spec.auto_ports == ("port",)
    try:
        (server,) = servers.start_all([spec], timeout=30)
        try:
            assert spec.port != taken.getsockname()[1] and server.alive()
        finally:
            server.stop()
    finally:
        taken.close()


# A server that logs a port it could not bind and stays up without ever answering, as vLLM
# does when its NIXL handshake listener's side-channel port was taken.
HANGING_ON_A_TAKEN_PORT = textwrap.dedent("""
    import sys, time
    taken, port = int(sys.argv[2]), int(sys.argv[1])
    if port == taken:
        print("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:%d')" % port,
              flush=True)
        time.sleep(600)
""") + FAKE_SERVER


def test_a_server_hanging_on_a_taken_port_is_restarted_at_once_not_at_the_timeout(
        tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    ports = iter([taken.getsockname()[1]])
    real = servers.free_port
    monkeypatch.setattr(servers, "free_port", lambda host="127.0.0.1": next(ports, None)
                        or real(host))

    @dataclass
    class Hanging(servers.ServerSpec):
        def command(self) -> list[str]:
            return [sys.executable, "-c", HANGING_ON_A_TAKEN_PORT, str(self.port),
                    str(taken.getsockname()[1])]

    spec = Hanging(role="d", target="t", drafter="d", num_speculative_tokens=1,
                   log_dir=tmp_path / "logs")
    t = time.monotonic()
    try:
        (server,) = servers.start_all([spec], timeout=300)
        try:
            assert spec.port != taken.getsockname()[1] and server.alive()
            assert time.monotonic() - t < 150, "waited for the timeout before the retry"
        finally:
            server.stop()
    finally:
        taken.close()


def test_a_healthy_server_is_asked_once_even_when_its_time_is_up(tmp_path):
    """start_all waits for one server after another: the last one's time can be up before
    its first check, while it has long been healthy."""
    spec = FakeSpec(role="baseline", target="t", drafter="d", num_speculative_tokens=1,
                    log_dir=tmp_path / "logs")
    server = servers.VllmServer(spec).start()
    try:
        deadline = time.monotonic() + 30
        while not server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        server.started_at -= 1000  # as if started 1000 s ago
        assert server.wait_ready(timeout=300) > 300
    finally:
        server.stop()


def test_a_port_the_user_chose_is_not_silently_changed(tmp_path):
    """A port the user chose, taken between the check and the server's bind, fails the start
    naming the clash; the server is not moved to another port, as an automatic one is."""
    chosen = servers.free_port()
    spec = FakeSpec(role="baseline", target="t", drafter="d", num_speculative_tokens=1,
                    log_dir=tmp_path, port=chosen)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", chosen))  # another process got it first
        taken.listen()
        t = time.monotonic()
        with pytest.raises(servers.ServerError, match="exited with code 1"):
            servers.start_all([spec], timeout=60)
    assert time.monotonic() - t < 30, "waited for the timeout instead of failing at the bind"
    assert spec.port == chosen
    log = spec.log_path.read_text()
    assert log.count("Address already in use") == 1, log  # one start, no retry elsewhere


SIGTERM_WHILE_LOCKED = textwrap.dedent("""
    import os, signal, sys
    from workbench.serving import ports, servers
    signal.signal(signal.SIGTERM, lambda *a: None)  # the handler chains to this one
    servers._install_handlers()
    with servers._LOCK:  # as while a server is added to or removed from the live set
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
    print("no deadlock")
""")


def test_sigterm_while_the_live_set_is_locked_does_not_deadlock():
    """Today's handler took a plain Lock that the interrupted main thread held."""
    out = subprocess.run([sys.executable, "-c", SIGTERM_WHILE_LOCKED], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and "no deadlock" in out.stdout, out.stderr
