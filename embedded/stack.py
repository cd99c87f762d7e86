"""The embedded stack: a Kafka-protocol broker and a ClickHouse endpoint on loopback, no Docker.

Used in-process by the tests and ``make demo`` (the servers die with the process that started them,
SIGKILL included) and detached by ``chtxn embedded up`` (the servers outlive the command and are
stopped by pid, see :mod:`embedded.daemon`). Layout of ``data_dir``::

    clickhouse/        ClickHouse's data (kept across restarts)
    logs/kafka.log     the broker's output
    logs/clickhouse.log
    state.json         what ``chtxn embedded up`` started (detached mode only)

Kafka data lives in the broker's memory: it is gone when the broker stops.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from embedded.broker import EmbeddedBroker
from embedded.clickhouse_process import EmbeddedClickHouse


class EmbeddedStack:
    """Both servers, each started on demand. Example::

        with EmbeddedStack(".chtxn/embedded") as stack:
            Producer({"bootstrap.servers": stack.kafka_bootstrap})
            clickhouse_connect.get_client(host=stack.clickhouse_host, port=stack.clickhouse_port)

    Ports 0 pick free ports. Constructing starts nothing; :meth:`start` starts what is not running.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        kafka_port: int = 0,
        clickhouse_port: int = 0,
        host: str = "127.0.0.1",
        detached: bool = False,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.broker = EmbeddedBroker(kafka_port, host, log_path=self.data_dir / "logs" / "kafka.log", detached=detached)
        self.clickhouse = EmbeddedClickHouse(
            self.data_dir / "clickhouse",
            clickhouse_port,
            host,
            log_path=self.data_dir / "logs" / "clickhouse.log",
            detached=detached,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> EmbeddedStack:
        """Start both servers (those not running yet); stops both again if one fails."""
        try:
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

    def start_clickhouse(self) -> EmbeddedClickHouse:
        """Start the ClickHouse endpoint unless it runs; returns it."""
        if not self.clickhouse.running():
            self.clickhouse.stop()
            self.clickhouse.start()
        return self.clickhouse

    def stop(self) -> None:
        """Stop both servers; returns once no process of the stack is left. Idempotent."""
        try:
            self.clickhouse.stop()
        finally:
            self.broker.stop()

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

    def env(self) -> dict[str, str]:
        """The ``CHTXN_*`` variables that point a pipeline config at this stack."""
        return {
            "CHTXN_KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "CHTXN_CLICKHOUSE_URL": self.clickhouse_url,
        }

    @staticmethod
    def _require(service: EmbeddedBroker | EmbeddedClickHouse) -> None:
        if not service.running():
            raise RuntimeError(f"{service.title} is not running: call start() first")
