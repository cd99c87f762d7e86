"""The embedded stack: a Kafka-protocol broker and a ClickHouse endpoint on loopback, no Docker;
optionally a keeper (ZooKeeper) that the ClickHouse endpoint is configured for (KeeperMap tables);
optionally more ClickHouse endpoints, the shards of a cluster.

Used in-process by the tests and ``make demo`` (the servers die with the process that started them,
SIGKILL included) and detached by ``chtxn embedded up`` (the servers outlive the command and are
stopped by pid, see :mod:`embedded.daemon`). Layout of ``data_dir``::

    clickhouse/        ClickHouse's data (kept across restarts); shard 1's with ``shards``
    clickhouse-shard2/ shard 2's data, and so on up to ``shards`` (each its own chDB process)
    kafka/             the broker's topics, with ``kafka_on_disk=True`` (kept across restarts)
    keeper/            ZooKeeper's data and zoo.cfg (with ``keeper=True``; kept across restarts)
    logs/kafka.log     the broker's output
    logs/clickhouse.log
    logs/clickhouse-shard2.log ...
    logs/keeper.log
    state.json         what ``chtxn embedded up`` started (detached mode only)

Kafka data lives in the broker's memory, gone when the broker stops, unless ``kafka_on_disk``
(``chtxn embedded up`` sets it): then in ``kafka/`` (:mod:`embedded.kafka_storage`).

With ``shards=N`` (N > 1) there are N ClickHouse endpoints, each its own chDB process with its own
data, and each configured with a cluster (``cluster``, default ``chtxn_shards``) naming all of them,
shard 1 first (``system.clusters``; :mod:`embedded.ch_config`). Shard 1 is the endpoint a stack of
one shard has, on the same data directory and port. Since every shard's configuration names every
shard's port, the ports are picked before the first shard starts and kept from then on: a shard
started again (after it died) serves its earlier port, and a port taken by another process in the
meantime fails the start, as an explicit port does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

from embedded.broker import EmbeddedBroker
from embedded.ch_config import DEFAULT_CLUSTER, Cluster
from embedded.clickhouse_process import EmbeddedClickHouse
from embedded.keeper import EmbeddedKeeper
from embedded.service import LoopbackService
from procs import free_port

#: Where the broker keeps its topics under ``data_dir`` with ``kafka_on_disk``.
KAFKA_DIR = "kafka"
#: Where shard 1's data lives under ``data_dir``.
CLICKHOUSE_DIR = "clickhouse"


def shard_dir(shard: int) -> str:
    """The directory of shard ``shard``'s data (1-based) under ``data_dir``, and its log's name."""
    return CLICKHOUSE_DIR if shard == 1 else f"{CLICKHOUSE_DIR}-shard{shard}"


class EmbeddedStack:
    """The servers, each started on demand. Example::

        with EmbeddedStack(".chtxn/demo") as stack:
            Producer({"bootstrap.servers": stack.kafka_bootstrap})
            clickhouse_connect.get_client(host=stack.clickhouse_host, port=stack.clickhouse_port)

    Ports 0 pick free ports. Constructing starts nothing; :meth:`start` starts what is not running.
    With ``keeper=True`` the ClickHouse endpoint is started after the keeper and configured for it;
    without, no keeper is started, as before. With ``clickhouse_users`` (name -> password) the
    endpoint takes only those users, checking their passwords as a ClickHouse server does; without,
    any user and password, as before. With ``shards=N`` there are N endpoints (``shards``, shard 1
    being ``clickhouse``), all configured for the keeper and taking the same users; ``shard_ports``
    are the ports of shards 2 to N (missing or 0: free ones).
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
        shards: int = 1,
        shard_ports: Sequence[int] = (),
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        if shards < 1:
            raise ValueError(f"a stack has at least one ClickHouse shard, not {shards}")
        if len(shard_ports) > shards - 1:
            raise ValueError(f"{len(shard_ports)} shard ports for shards 2 to {shards}")
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.broker = EmbeddedBroker(
            kafka_port,
            host,
            log_path=self.data_dir / "logs" / "kafka.log",
            detached=detached,
            storage_dir=self.data_dir / KAFKA_DIR if kafka_on_disk else None,
        )
        ports = [clickhouse_port, *shard_ports, *[0] * (shards - 1 - len(shard_ports))]
        #: The ClickHouse endpoints, shard 1 first.
        self.shards = [
            EmbeddedClickHouse(
                self.data_dir / shard_dir(shard),
                port,
                host,
                log_path=self.data_dir / "logs" / f"{shard_dir(shard)}.log",
                detached=detached,
                users=clickhouse_users,
                shard=shard,
            )
            for shard, port in enumerate(ports, start=1)
        ]
        self.clickhouse = self.shards[0]
        self.cluster_name = cluster
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
        """Start every ClickHouse endpoint (shard) not running (with a keeper: the keeper first);
        returns shard 1's."""
        for shard in range(1, len(self.shards) + 1):
            self.start_shard(shard)
        return self.clickhouse

    def start_shard(self, shard: int) -> EmbeddedClickHouse:
        """Start the ClickHouse endpoint of shard ``shard`` (1-based) unless it runs, configured for
        the keeper (started first) and the cluster; returns it."""
        if not 1 <= shard <= len(self.shards):
            raise ValueError(f"this stack has shards 1 to {len(self.shards)}, not {shard}")
        endpoint = self.shards[shard - 1]
        if not endpoint.running():
            if self.keeper is not None:
                endpoint.keeper = self.start_keeper().address
            endpoint.cluster = self.cluster
            endpoint.stop()
            endpoint.start()
        return endpoint

    def pin_ports(self) -> None:
        """With more than one shard: pick a free port now for every shard left to pick one, and keep
        every shard on its port from then on (every shard's configuration names them all)."""
        if len(self.shards) == 1:
            return
        taken = {e.requested_port for e in self.shards if e.requested_port}
        for endpoint in self.shards:
            if endpoint.requested_port:
                endpoint.port = endpoint.requested_port
                continue
            port = free_port(self.host)
            while port in taken:
                port = free_port(self.host)
            taken.add(port)
            endpoint.requested_port = endpoint.port = port

    @property
    def cluster(self) -> Cluster | None:
        """The cluster the shards are configured with (their ports pinned, see :meth:`pin_ports`);
        None with one shard, which has no cluster."""
        if len(self.shards) == 1:
            return None
        self.pin_ports()
        return Cluster(self.cluster_name, tuple(f"{e.host}:{e.port}" for e in self.shards))

    def stop(self) -> None:
        """Stop the servers; returns once no process of the stack is left. Idempotent."""
        try:
            with ExitStack() as stopping:  # every shard's stop runs, the last shard's first
                for endpoint in self.shards:
                    stopping.callback(endpoint.stop)
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
    def shard_urls(self) -> list[str]:
        """``http://127.0.0.1:PORT`` of every shard, shard 1 first, for ``CHTXN_CLICKHOUSE_SHARDS``."""
        for endpoint in self.shards:
            self._require(endpoint)
        return [endpoint.url for endpoint in self.shards]

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
        its address, for tools that talk to it; with shards, ``CHTXN_CLICKHOUSE_SHARDS``: every shard's
        URL, comma-separated, shard 1 first)."""
        env = {
            "CHTXN_KAFKA_BOOTSTRAP_SERVERS": self.kafka_bootstrap,
            "CHTXN_CLICKHOUSE_URL": self.clickhouse_url,
        }
        if self.clickhouse.users:
            user, password = next(iter(self.clickhouse.users.items()))
            env.update(CHTXN_CLICKHOUSE_USER=user, CHTXN_CLICKHOUSE_PASSWORD=password)
        if len(self.shards) > 1:
            env["CHTXN_CLICKHOUSE_SHARDS"] = ",".join(self.shard_urls)
        if self.keeper is not None:
            env["CHTXN_EMBEDDED_KEEPER"] = self.keeper_address
        return env

    @staticmethod
    def _require(service: LoopbackService) -> None:
        if not service.running():
            raise RuntimeError(f"{service.title} is not running: call start() first")
