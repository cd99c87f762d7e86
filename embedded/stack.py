"""The embedded stack: a Kafka-protocol broker and a ClickHouse endpoint on loopback, no Docker;
optionally a keeper (ZooKeeper) that the ClickHouse endpoint is configured for (KeeperMap tables).

Used in-process by the tests and ``make demo`` (the servers die with the process that started them,
SIGKILL included) and detached by ``chtxn embedded up`` (the servers outlive the command and are
stopped by pid, see :mod:`embedded.daemon`). Layout of ``data_dir``::

    clickhouse/        ClickHouse's data (kept across restarts)
    kafka/             the broker's topics, with ``kafka_on_disk=True`` (kept across restarts)
    keeper/            ZooKeeper's data and zoo.cfg (with ``keeper=True``; kept across restarts)
    logs/kafka.log     the broker's output
    logs/clickhouse.log
    logs/keeper.log
    state.json         what ``chtxn embedded up`` started (detached mode only)

Kafka data lives in the broker's memory, gone when the broker stops, unless ``kafka_on_disk``
(``chtxn embedded up`` sets it): then in ``kafka/`` (:mod:`embedded.kafka_storage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from embedded.broker import EmbeddedBroker
from embedded.clickhouse_process import EmbeddedClickHouse
from embedded.keeper import EmbeddedKeeper
from embedded.service import LoopbackService

#: Where the broker keeps its topics under ``data_dir`` with ``kafka_on_disk``.
KAFKA_DIR = "kafka"


class EmbeddedStack:
    """The servers, each started on demand. Example::

        with EmbeddedStack(".chtxn/demo") as stack:
            Producer({"bootstrap.servers": stack.kafka_bootstrap})
            clickhouse_connect.get_client(host=stack.clickhouse_host, port=stack.clickhouse_port)

    Ports 0 pick free ports. Constructing starts nothing; :meth:`start` starts what is not running.
    With ``keeper=True`` the ClickHouse endpoint is started after the keeper and configured for it;
    without, no keeper is started, as before. With ``clickhouse_users`` (name -> password) the
    endpoint takes only those users, checking their passwords as a ClickHouse server does; without,
    any user and password, as before.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        kafka_port: int = 0,
        clickhouse_port: int = 0,
        host: str = "127.0.0.1",
        detached: bool = False,
        keeper: bool = False,
        keeper_port: int = 0,
        kafka_on_disk: bool = False,
        clickhouse_users: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.broker = EmbeddedBroker(
            kafka_port,
            host,
            log_path=self.data_dir / "logs" / "kafka.log",
            detached=detached,
            storage_dir=self.data_dir / KAFKA_DIR if kafka_on_disk else None,
        )
        self.clickhouse = EmbeddedClickHouse(
            self.data_dir / "clickhouse",
            clickhouse_port,
            host,
            log_path=self.data_dir / "logs" / "clickhouse.log",
            detached=detached,
            users=clickhouse_users,
        )
        self.keeper: EmbeddedKeeper | None = None
        if keeper:
            self.keeper = EmbeddedKeeper(
                self.data_dir / "keeper",
                keeper_port,
                host,
                log_path=self.data_dir / "logs" / "keeper.log",
                detached=detached,
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> EmbeddedStack:
        """Start the servers (those not running yet); stops them all again if one fails."""
        try:
            if self.keeper is not None:
                self.start_keeper()
            self.start_kafka()
            self.start_clickhouse()
        except BaseException:
            self.stop()
            raise
        return self

    def start_kafka(self) -> EmbeddedBroker:
        """Start the broker unless it runs; returns it."""
        if not self.broker.running():
            self.broker.stop()  # clears a broker that died
            self.broker.start()
        return self.broker

    def start_keeper(self) -> EmbeddedKeeper:
        """Start the keeper unless it runs (on its earlier port, if it ran before); returns it."""
        if self.keeper is None:
            raise RuntimeError("this stack has no keeper: construct it with keeper=True")
        if not self.keeper.running():
            self.keeper.stop()
            self.keeper.start()
        return self.keeper

    def start_clickhouse(self) -> EmbeddedClickHouse:
        """Start the ClickHouse endpoint unless it runs (with a keeper: the keeper first); returns it."""
        if not self.clickhouse.running():
            if self.keeper is not None:
                self.clickhouse.keeper = self.start_keeper().address
            self.clickhouse.stop()
            self.clickhouse.start()
        return self.clickhouse

    def stop(self) -> None:
        """Stop the servers; returns once no process of the stack is left. Idempotent."""
        try:
            self.clickhouse.stop()
        finally:
            try:
                self.broker.stop()
            finally:
                if self.keeper is not None:
                    self.keeper.stop()

    def __enter__(self) -> EmbeddedStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------------

    @property
    def kafka_bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for ``bootstrap.servers`` and ``CHTXN_KAFKA_BOOTSTRAP_SERVERS``."""
        self._require(self.broker)
        return self.broker.bootstrap

    @property
    def clickhouse_url(self) -> str:
        """``http://127.0.0.1:PORT``, for ``CHTXN_CLICKHOUSE_URL``."""
        self._require(self.clickhouse)
        return self.clickhouse.url

    @property
    def clickhouse_host(self) -> str:
        return urlsplit(self.clickhouse_url).hostname or self.host

    @property
    def clickhouse_port(self) -> int:
        self._require(self.clickhouse)
        return self.clickhouse.port

    @property
    def keeper_address(self) -> str:
        """``127.0.0.1:PORT`` of the keeper, for ``CHTXN_EMBEDDED_KEEPER``."""
        if self.keeper is None:
            raise RuntimeError("this stack has no keeper: construct it with keeper=True")
        self._require(self.keeper)
        return self.keeper.address

    def env(self) -> dict[str, str]:
        """The ``CHTXN_*`` variables that point a pipeline config at this stack (with users, the first
        one's ``CHTXN_CLICKHOUSE_USER`` and ``_PASSWORD``; with a keeper, also ``CHTXN_EMBEDDED_KEEPER``:
        its address, for tools that talk to it)."""
        env = {
            "CHTXN_KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "CHTXN_CLICKHOUSE_URL": self.clickhouse_url,
        }
        if self.clickhouse.users:
            user, password = next(iter(self.clickhouse.users.items()))
            env.update(CHTXN_CLICKHOUSE_USER=user, CHTXN_CLICKHOUSE_PASSWORD=password)
        if self.keeper is not None:
            env["CHTXN_EMBEDDED_KEEPER"] = self.keeper_address
        return env

    @staticmethod
    def _require(service: LoopbackService) -> None:
        if not service.running():
            raise RuntimeError(f"{service.title} is not running: call start() first")
