"""The embedded ClickHouse endpoint: ClickHouse's engine (chDB) behind ClickHouse's HTTP interface.

Any process reaches it with ``clickhouse_connect.get_client(host=..., port=...)`` exactly as it
would reach a server: queries and settings in URL parameters or the body, INSERT rows in the body
in any input format (lz4/zstd/gzip/deflate/br encoded), output in any format, ``X-ClickHouse-*``
headers, errors as ``Code: N. DB::Exception: ...`` with ``X-ClickHouse-Exception-Code`` and
ClickHouse's HTTP status, ``/ping``, sessions, optional users.

Without users it accepts any user and password, as it always did. With users (name -> password)
it checks every request's credentials as a ClickHouse server does over HTTP: HTTP basic auth, the
``X-ClickHouse-User`` / ``X-ClickHouse-Key`` headers or the ``user`` / ``password`` URL
parameters, none meaning user ``default`` with no password; a wrong one is answered HTTP 403 with
``Code: 516. DB::Exception: <user>: Authentication failed: password is incorrect, or there is no
user with such name (AUTHENTICATION_FAILED)``. ``/ping`` never needs credentials.

Guarantees: statements from any number of processes and threads run concurrently, each request
(or session) on its own engine connection (see ``ch_engine``), and none is lost; a statement can
be cancelled with ``KILL QUERY`` or by closing its connection; data lives under ``data_dir`` in
ClickHouse's own format and survives a restart on the same directory.

Run it as ``python -m embedded.clickhouse_server --data-dir D --port P``: it prints
``listening on http://HOST:PORT`` once ready and serves until SIGTERM or SIGINT. Its users come
from ``--user``/``--password`` or, kept out of the process list, from ``$CHTXN_EMBEDDED_CLICKHOUSE_USERS``
(a JSON object, name -> password).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tenacity import Retrying, retry_if_exception_type, retry_if_result, stop_after_delay, wait_fixed

from embedded.ch_config import Cluster
from embedded.ch_engine import Engine
from embedded.ch_errors import EngineError
from embedded.ch_http_server import HttpServer
from embedded.clickhouse_process import USERS_ENV


class ClickHouseEndpoint:
    """An embedded ClickHouse HTTP endpoint serving ``data_dir`` on ``host:port`` (0 picks a free
    port). With ``users`` (name -> password), or ``password`` (and optionally ``user``, default
    ``default``), every query must authenticate as one of them (module docstring); ``/ping`` never
    needs to. With ``keeper`` ("host:port" of a ZooKeeper) the engine uses it for KeeperMap tables
    (see ``ch_engine``); with ``cluster`` it is that cluster's shard ``shard`` (1-based, see
    ``ch_config``). One endpoint per process."""

    def __init__(
        self,
        data_dir: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        user: str | None = None,
        password: str | None = None,
        keeper: str | None = None,
        users: Mapping[str, str] | None = None,
        cluster: Cluster | None = None,
        shard: int = 1,
    ):
        self.data_dir = Path(data_dir)
        self.keeper = keeper
        self.cluster = cluster
        self.shard = shard
        self.host = host
        self._port = port
        self._users: dict[str, str] | None = dict(users) if users is not None else None
        if user is not None or password is not None:
            self._users = {**(self._users or {}), user or "default": password or ""}
        self._server: HttpServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ClickHouseEndpoint:
        """Open the engine and serve in a background thread; returns once the port is bound."""
        if self._server is not None:
            raise RuntimeError("this ClickHouseEndpoint is already started")
        engine = Engine(self.data_dir, self.keeper, self.cluster, self.shard)
        try:
            self._server = HttpServer((self.host, self._port), engine, self._users)
        except OSError:
            engine.close()
            raise
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True, name="clickhouse-endpoint"
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, drop open connections, cancel running statements (waiting up to 30 s for
        them to end), forget the sessions and close the engine."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        server.drop_connections()
        if self._thread is not None:
            self._thread.join()
        if not server.drain(timeout_s=30):
            logging.getLogger("embedded.clickhouse").warning(
                "statements still running at shutdown; closing the engine anyway"
            )
        server.watcher.stop()
        server.sessions.close_all()
        server.engine.close()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the endpoint is not started: call start() first")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> ClickHouseEndpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    """Return once ``url``/ping answers ``Ok.``; raise TimeoutError after ``timeout_s``."""

    def ping() -> bool:
        with urllib.request.urlopen(f"{url.rstrip('/')}/ping", timeout=2) as resp:
            return resp.read() == b"Ok.\n"

    retrying = Retrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(0.05),
        retry=retry_if_exception_type((OSError, urllib.error.URLError)) | retry_if_result(lambda ok: not ok),
        reraise=True,
    )
    try:
        retrying(ping)
    except Exception as ex:
        raise TimeoutError(
            f"the ClickHouse endpoint at {url} did not answer /ping within {timeout_s:.0f}s ({ex!r}): "
            "check that it was started and look at its stderr"
        ) from ex


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedded.clickhouse_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="directory holding the ClickHouse data (created if missing)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8123, help="port to listen on; 0 picks a free one (default 8123)")
    parser.add_argument(
        "--user", default=None, help="user name clients must give (default 'default' when --password is set)"
    )
    parser.add_argument(
        "--password", default=None, help=f"password clients must give (default: ${USERS_ENV}, else no authentication)"
    )
    parser.add_argument(
        "--keeper", default=None, metavar="HOST:PORT", help="a ZooKeeper for KeeperMap tables (default: none)"
    )
    parser.add_argument(
        "--cluster",
        type=Cluster.parse,
        default=None,
        metavar="NAME=HOST:PORT,...",
        help="a cluster, one HOST:PORT (HTTP) per shard, shard 1 first, listed in system.clusters (default: none)",
    )
    parser.add_argument("--shard", type=int, default=1, help="this endpoint's shard of --cluster (default 1)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        users = _users_from_env(os.environ)
    except ValueError as ex:
        print(f"${USERS_ENV}: {ex}", file=sys.stderr)
        return 2
    try:
        endpoint = ClickHouseEndpoint(
            args.data_dir,
            args.host,
            args.port,
            args.user,
            args.password,
            args.keeper,
            users=users,
            cluster=args.cluster,
            shard=args.shard,
        ).start()
    except OSError as ex:
        print(f"cannot listen on {args.host}:{args.port}: {ex}; choose another --port", file=sys.stderr)
        return 2
    except EngineError as ex:
        print(ex.text, file=sys.stderr)
        return 2
    print(f"listening on {endpoint.url}", flush=True)
    stopping.wait()
    endpoint.stop()
    return 0


def _users_from_env(environ: Mapping[str, str]) -> dict[str, str] | None:
    """The users named in ``$CHTXN_EMBEDDED_CLICKHOUSE_USERS``; None when it is unset or empty."""
    text = environ.get(USERS_ENV, "")
    if not text:
        return None
    users = json.loads(text)
    if not isinstance(users, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in users.items()):
        raise ValueError('expected a JSON object of user names and passwords, e.g. {"ingest": "s3cret"}')
    return users


if __name__ == "__main__":
    sys.exit(main())
