"""The test proxy itself, in front of a tiny echo server: pass, cut, restore, delay, stop."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import wait_until


@pytest.fixture
def echo_port() -> Iterator[int]:
    """An echo server on loopback (one thread per connection), closed at the end."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    done = threading.Event()

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := _recv(conn):
                conn.sendall(data)

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join(5)
    server.close()


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


def roundtrip(proxy: TcpProxy, payload: bytes, conn: socket.socket | None = None) -> bytes:
    own = conn is None
    conn = conn or socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    try:
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        if own:
            conn.close()


def test_passes_traffic_both_ways(echo_port):
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        payload = bytes(range(256)) * 1000
        assert roundtrip(proxy, payload) == payload
        assert proxy.accepted == 1


def is_dead(conn: socket.socket) -> bool:
    """True when ``conn`` was reset or closed by the other side."""
    try:
        conn.sendall(b"ping")
        return conn.recv(10) == b""
    except OSError:
        return True


def refused_or_dead(port: int) -> bool:
    """True when a new connection to ``port`` fails, at connect or at its first exchange."""
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return True
    with conn:
        return is_dead(conn)


def test_cut_resets_open_connections_and_refuses_new_ones_until_restored(echo_port):
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        assert roundtrip(proxy, b"before", conn) == b"before"
        proxy.cut()
        assert proxy.open_connections == 0
        assert is_dead(conn)
        conn.close()
        assert refused_or_dead(proxy.port)
        assert proxy.refused >= 1
        proxy.restore()
        assert roundtrip(proxy, b"again") == b"again"


def test_delay_holds_traffic_and_restore_removes_it(echo_port):
    with TcpProxy("127.0.0.1", echo_port) as proxy:
        proxy.delay(0.2)
        assert proxy.latency_s == 0.2
        assert roundtrip(proxy, b"slow") == b"slow"
        proxy.restore()
        assert proxy.latency_s == 0.0
        with pytest.raises(ValueError):
            proxy.delay(-1)


def test_stop_leaves_no_thread_or_listener(echo_port):
    proxy = TcpProxy("127.0.0.1", echo_port).start()
    conn = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    assert roundtrip(proxy, b"x", conn) == b"x"
    proxy.stop()
    conn.close()
    wait_until(
        lambda: not any(t.name.startswith(f"proxy-{proxy.port}") for t in threading.enumerate()),
        10,
        "the proxy's threads to end",
    )
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
