"""The coordinator's HTTP endpoint: ``/metrics`` (Prometheus) and ``/ready`` (readiness).

``/ready`` answers 200 or 503 with one line of text (``coordinator.readiness``); every other path
serves the metrics, as prometheus_client's own server does. It binds ``coordinator.metrics_address``
(default 127.0.0.1: the endpoint has no authentication, so it is reachable from other hosts only
when asked for, with ``0.0.0.0`` or ``::``). Requests are served from daemon threads.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from coordinator.readiness import Readiness
from protocol.errors import SetupError

READY_PATH = "/ready"


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are not logged."""


class MetricsServer:
    """Serves ``registry`` and ``readiness`` on ``address:port`` once ``start()`` is called
    (port 0 picks a free port: see ``port``)."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness, *, address: str, port: int) -> None:
        self.address = address
        self.port = port
        self._metrics = make_wsgi_app(registry)
        self._readiness = readiness
        self._server: WSGIServer | None = None

    def start(self) -> None:
        """Bind and serve from a daemon thread. Raises SetupError naming the address when it cannot bind."""
        try:
            self._server = make_server(
                self.address, self.port, self._app, _server_class(self.address, self.port), handler_class=_QuietHandler
            )
        except OSError as exc:
            raise SetupError(
                f"cannot serve metrics on {self.address}:{self.port}: {exc.strerror or exc}; choose another "
                "--metrics-port / coordinator.metrics_port, or an address of this host for --metrics-address / "
                "coordinator.metrics_address"
            ) from None
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="chtxn-metrics", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "").rstrip("/") != READY_PATH:
            return self._metrics(environ, start_response)
        answer = self._readiness.answer()
        reason = "OK" if answer.ready else "Service Unavailable"
        start_response(f"{answer.status} {reason}", [("Content-Type", "text/plain; charset=utf-8")])
        return [answer.line.encode() + b"\n"]


def _server_class(address: str, port: int) -> type[WSGIServer]:
    """A threading server of the address family ``address`` resolves to (IPv6 for "::")."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise OSError(exc.errno, f"cannot resolve {address!r}: {exc.strerror}") from None

    class Server(ThreadingWSGIServer):
        address_family = family

    return Server
