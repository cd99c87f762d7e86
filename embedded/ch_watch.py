"""Cancel a running statement when its HTTP client goes away.

A client that times out closes its connection; the statement it started would otherwise run to
its end. ``DisconnectWatcher`` polls the sockets of requests with a running statement (one thread
for all of them) and calls ``cancel(query_id)`` once for a socket whose peer has closed.

Guarantees: ``cancel`` is called at most once per ``watch`` block, in the watcher's thread (so
``stop`` returns only once no cancel is under way). A socket on which the client already sent more bytes (a
pipelined request) is no longer watched, as its closing cannot be seen without reading them.
"""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_POLL_S = 0.05


class DisconnectWatcher:
    """Watches sockets of running statements; ``cancel`` receives the HTTP query id."""

    def __init__(self, cancel: Callable[[str], object]):
        self._cancel = cancel
        self._mutex = threading.Lock()
        self._watched: dict[socket.socket, str] = {}
        self._wake = threading.Condition(self._mutex)
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="clickhouse-disconnect-watcher", daemon=True)
        self._thread.start()

    @contextmanager
    def watch(self, sock: socket.socket, query_id: str) -> Iterator[None]:
        """Watch ``sock`` for the duration of the block."""
        with self._mutex:
            self._watched[sock] = query_id
            self._wake.notify()
        try:
            yield
        finally:
            with self._mutex:
                self._watched.pop(sock, None)

    def stop(self) -> None:
        with self._mutex:
            self._stopped = True
            self._wake.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._mutex:
                while not self._watched and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                socks = list(self._watched)
            try:
                readable, _, _ = select.select(socks, [], [], _POLL_S)
            except (OSError, ValueError):
                readable = [s for s in socks if s.fileno() < 0]
            for sock in readable:
                if _peer_closed(sock):
                    with self._mutex:
                        query_id = self._watched.pop(sock, None)
                    if query_id is not None:
                        self._cancel(query_id)
                else:
                    with self._mutex:
                        self._watched.pop(sock, None)


def _peer_closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
