"""The embedded ClickHouse endpoint as a child process: ``python -m embedded.clickhouse_server``.

Guarantees: :meth:`EmbeddedClickHouse.start` returns only once ``/ping`` answers ``Ok.``; data lives
under ``data_dir`` in ClickHouse's own format and survives a restart on the same directory; an
attached endpoint (the default) dies with the process that started it (see :mod:`procs`). Its
users' passwords reach the child in its environment (``USERS_ENV``), never in its command line.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from embedded.ch_config import Cluster
from embedded.service import LoopbackService, NotReady

#: The endpoint's users (a JSON object, name -> password), read by ``embedded.clickhouse_server``.
USERS_ENV = "CHTXN_EMBEDDED_CLICKHOUSE_USERS"


class EmbeddedClickHouse(LoopbackService):
    """ClickHouse's engine (chDB) behind ClickHouse's HTTP interface on ``host:port``; with ``keeper``
    ("host:port" of a ZooKeeper, read at each start) configured for KeeperMap tables. Without
    ``users`` it accepts any user and password; with ``users`` (name -> password, read at each start)
    it takes only those, as a ClickHouse server checks credentials over HTTP (see
    ``embedded.clickhouse_server``). With ``cluster`` (read at each start) it is that cluster's
    shard ``shard`` (1-based; see ``embedded.ch_config``)."""

    name = "clickhouse"
    title = "the embedded ClickHouse endpoint (chDB)"

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        log_path: Path | None = None,
        detached: bool = False,
        ready_timeout_s: float = 90.0,
        keeper: str | None = None,
        users: Mapping[str, str] | None = None,
        cluster: Cluster | None = None,
        shard: int = 1,
    ) -> None:
        super().__init__(port, host, log_path=log_path, detached=detached, ready_timeout_s=ready_timeout_s)
        self.data_dir = Path(data_dir).resolve()
        self.keeper = keeper
        self.cluster = cluster
        self.shard = shard
        if shard != 1:
            self.name = f"clickhouse-shard{shard}"
            self.title = f"{self.title}, shard {shard}"
        self.users: dict[str, str] | None = dict(users) if users is not None else None

    @property
    def url(self) -> str:
        """``http://host:port``, for clickhouse-connect and ``CHTXN_CLICKHOUSE_URL``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> EmbeddedClickHouse:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        super().start()
        return self

    def __enter__(self) -> EmbeddedClickHouse:
        return self.start()

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "embedded.clickhouse_server",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--host",
            self.host,
            *(["--keeper", self.keeper] if self.keeper else []),
            *(["--cluster", self.cluster.arg, "--shard", str(self.shard)] if self.cluster else []),
        ]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != USERS_ENV}
        if self.users is not None:
            env[USERS_ENV] = json.dumps(self.users)
        return {**env, "PYTHONUNBUFFERED": "1"}

    def __repr__(self) -> str:  # never the passwords
        users = f", users={sorted(self.users)}" if self.users is not None else ""
        shard = f", shard={self.shard}" if self.shard != 1 else ""
        return f"EmbeddedClickHouse({str(self.data_dir)!r}, port={self.port}{shard}{users})"

    def _cwd(self) -> str:
        """The directory holding the ``embedded`` package, so ``-m`` resolves from any directory."""
        return str(Path(__file__).resolve().parent.parent)

    def _probe(self) -> None:
        try:
            with urllib.request.urlopen(f"{self.url}/ping", timeout=2.0) as response:
                body = response.read()
        except (OSError, urllib.error.URLError) as exc:
            raise NotReady(f"/ping: {exc}") from exc
        if body.strip() != b"Ok.":
            raise NotReady(f"/ping answered {body[:80]!r}")
