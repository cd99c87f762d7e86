"""The threaded HTTP server of the embedded ClickHouse endpoint: one thread per client connection,
all sharing one ``Engine``; each request is ``embedded.ch_http.Handler``'s. It counts the statements
running (``drain`` cancels them at shutdown) and can drop every open connection.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from http.server import ThreadingHTTPServer

from embedded.ch_engine import Engine
from embedded.ch_errors import EngineError
from embedded.ch_http import Handler
from embedded.ch_sessions import SessionStore
from embedded.ch_watch import DisconnectWatcher


class HttpServer(ThreadingHTTPServer):
    """Threaded HTTP server: one thread per connection, all sharing one Engine."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], engine: Engine, users: Mapping[str, str] | None = None):
        super().__init__(address, Handler)
        self.engine = engine
        self.sessions = SessionStore(engine.connect)
        self.watcher = DisconnectWatcher(engine.kill)
        self.users = dict(users) if users is not None else None  # name -> password; None: anyone
        self.display_name = socket.gethostname()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._running: dict[str, int] = {}  # query id -> statements running under it
        self._idle = threading.Condition()

    @contextmanager
    def running(self, query_id: str) -> Iterator[None]:
        """Count a statement as running for the duration of the block (see ``drain``)."""
        with self._idle:
            self._running[query_id] = self._running.get(query_id, 0) + 1
        try:
            yield
        finally:
            with self._idle:
                self._running[query_id] -= 1
                if not self._running[query_id]:
                    del self._running[query_id]
                self._idle.notify_all()

    def drain(self, timeout_s: float) -> bool:
        """Cancel every running statement and wait up to ``timeout_s`` for all to end; False if
        some still run."""
        with self._idle:
            running = list(self._running)
        for query_id in running:
            with suppress(EngineError):
                self.engine.kill(query_id)
        with self._idle:
            return self._idle.wait_for(lambda: not self._running, timeout_s)

    def process_request(self, request, client_address):  # socketserver's signature
        with self._conns_lock:
            self._conns.add(request)
        # Headers and body go out in separate writes: without NODELAY, Nagle's algorithm and the
        # client's delayed ACK would hold every small reply back by ~40 ms.
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        """Close every open client connection (idle keep-alive ones included)."""
        with self._conns_lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
