"""A small TCP proxy on loopback that tests use to cut or slow down the path to a server.

Example::

    with TcpProxy("127.0.0.1", 8123) as proxy:     # clients connect to 127.0.0.1:<proxy.port>
        proxy.cut()        # every open connection is reset, new ones are reset at once
        proxy.restore()    # traffic flows again (and any delay is removed)
        proxy.delay(0.3)   # each chunk of traffic waits 0.3 s before it is passed on

Guarantees:

- ``cut()`` returns once every connection that was open is closed with a TCP reset on both sides
  (or after ``CUT_WAIT_S``); while cut, a new connection is accepted and reset at once, so a client
  sees its connection fail immediately (the listening port stays ours: nothing else can take it).
- ``delay(s)`` holds every chunk read from either side ``s`` seconds before passing it on; it
  applies to chunks read after the call, per connection, in both directions.
- Bounded: at most ``max_connections`` open connections (more are reset), and the proxy stops by
  itself after ``lifetime_s``. Every thread is a daemon and polls at most ``POLL_S`` before it
  looks at the proxy's state again, so ``stop()`` returns quickly and leaves no thread or socket.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time

log = logging.getLogger(__name__)

#: Longest a proxy thread blocks before it looks at the proxy's state again.
POLL_S = 0.1
#: Longest ``cut()`` and ``stop()`` wait for the connections to close.
CUT_WAIT_S = 5.0
_CHUNK = 64 * 1024
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST instead of FIN


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset (no graceful FIN)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass
    sock.close()


class _Connection:
    """One client connection and its upstream connection, pumped by two threads (one per direction).

    Whichever thread sees the end first closes both sockets; a cut closes them with a reset.
    """

    def __init__(self, proxy: TcpProxy, client: socket.socket, upstream: socket.socket) -> None:
        self.proxy, self.client, self.upstream = proxy, client, upstream
        self.reset = threading.Event()  # set by cut()/stop(): close both with a reset
        self._lock = threading.Lock()
        self._closed = False
        self._half_closed = 0
        for sock in (client, upstream):
            sock.setblocking(False)
        self.threads = [
            threading.Thread(target=self._pump, args=(client, upstream), name=f"proxy-{proxy.port}-up", daemon=True),
            threading.Thread(target=self._pump, args=(upstream, client), name=f"proxy-{proxy.port}-down", daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    @property
    def closed(self) -> bool:
        return self._closed

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        timeout_ms = int(POLL_S * 1000)
        try:
            readable, writable = select.poll(), select.poll()
            readable.register(src, select.POLLIN)
            writable.register(dst, select.POLLOUT)
            while not self.reset.is_set():
                if not readable.poll(timeout_ms):
                    continue
                try:
                    data = src.recv(_CHUNK)
                except BlockingIOError:
                    continue
                if not data:  # the sender is done: pass the half-close on
                    self._end_of_stream(dst)
                    return
                latency = self.proxy.latency_s
                if latency > 0 and self.reset.wait(latency):
                    break
                view = memoryview(data)
                while view and not self.reset.is_set():
                    if writable.poll(timeout_ms):
                        try:
                            view = view[dst.send(view) :]
                        except BlockingIOError:
                            continue
        except (OSError, ValueError):
            pass  # a reset or a closed socket: the connection is over
        self.close()

    def _end_of_stream(self, dst: socket.socket) -> None:
        with self._lock:
            self._half_closed += 1
            both = self._half_closed == 2
            if not both and not self._closed:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        if both:
            self.close(graceful=True)

    def close(self, graceful: bool = False) -> None:
        """Close both sockets once: with FIN when both sides ended, else with a reset."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for sock in (self.client, self.upstream):
                if graceful:
                    sock.close()
                else:
                    _reset(sock)
        self.proxy._forget(self)


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` (or ``listen_host``) to ``target_host:target_port``.

    ``port`` is chosen at construction (``listen_port=0``: a free one) and stays the proxy's until
    ``stop()``, cut or not. Use as a context manager, or ``start()`` / ``stop()``.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        max_connections: int = 512,
        lifetime_s: float = 1800.0,
    ) -> None:
        self.target = (target_host, target_port)
        self.max_connections = max_connections
        self.lifetime_s = lifetime_s
        self.latency_s = 0.0
        self._cut = False
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._listener = socket.create_server((listen_host, listen_port), backlog=128)
        self._listener.settimeout(POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}-accept", daemon=True)
        self._deadline = 0.0
        self.accepted = 0  # connections passed on since start
        self.refused = 0  # connections reset because the proxy was cut or full

    @property
    def address(self) -> str:
        """``host:port`` of the proxy, for ``bootstrap.servers``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://host:port`` of the proxy, for an HTTP target such as ClickHouse."""
        return f"http://{self.host}:{self.port}"

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._deadline = time.monotonic() + self.lifetime_s
        self._acceptor.start()
        return self

    def stop(self) -> None:
        """Stop accepting, reset every connection, and return once every thread is gone. Idempotent."""
        with self._lock:
            self._stopped.set()
        if self._acceptor.is_alive() and self._acceptor is not threading.current_thread():
            self._acceptor.join(CUT_WAIT_S)
        self._listener.close()
        self._reset_all()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- faults ---------------------------------------------------------------------------

    def cut(self) -> None:
        """Reset every open connection and every new one until ``restore()``."""
        with self._lock:
            self._cut = True
        self._reset_all()
        log.info("proxy %s cut", self.port)

    def restore(self) -> None:
        """Pass traffic again, without added latency."""
        self._cut = False
        self.latency_s = 0.0
        log.info("proxy %s restored", self.port)

    def delay(self, seconds: float) -> None:
        """Hold every chunk of traffic ``seconds`` before passing it on (0: no delay)."""
        if seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, not {seconds}")
        self.latency_s = seconds

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    # ---- internals ------------------------------------------------------------------------

    def _reset_all(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.reset.set()
        deadline = time.monotonic() + CUT_WAIT_S
        for conn in connections:
            for thread in conn.threads:
                if thread.ident is not None and thread is not threading.current_thread():
                    thread.join(max(0.0, deadline - time.monotonic()))
            conn.close()  # a pump that has not started yet (or is stuck) does not delay the reset

    def _accept_loop(self) -> None:
        while not self._stopped.is_set():
            if time.monotonic() > self._deadline:
                log.warning("proxy %s stops by itself after %g s", self.port, self.lifetime_s)
                threading.Thread(target=self.stop, daemon=True).start()
                return
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            self._admit(client)

    def _admit(self, client: socket.socket) -> None:
        if self._cut or self.open_connections >= self.max_connections:
            self._refuse(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2.0)
        except OSError as exc:
            log.warning("proxy %s cannot reach %s:%s: %s", self.port, *self.target, exc)
            self._refuse(client)
            return
        conn = _Connection(self, client, upstream)
        with self._lock:  # cut() flags under this lock: a connection is either reset by it or refused here
            admitted = not self._cut and not self._stopped.is_set()
            if admitted:
                self._connections.add(conn)
        if not admitted:
            _reset(upstream)
            self._refuse(client)
            return
        self.accepted += 1
        conn.start()

    def _refuse(self, client: socket.socket) -> None:
        self.refused += 1
        _reset(client)

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
