"""Fixtures shared by every test tier.

The services integration tests talk to are real: a Kafka-protocol broker and a ClickHouse server.
By default they are the embedded stack (Tansu and chDB on loopback), one per test session, each
started the first time a test asks for it, so pure tests start nothing. Real services take over
when named in the environment:

    CHTXN_TEST_KAFKA=broker:9092                        bootstrap servers
    CHTXN_TEST_CLICKHOUSE_URL=http://user:pw@host:8123  ClickHouse HTTP(S) URL
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.helpers import unique_name
from tests.spark_cluster import JVM_JIT

#: Under pytest-xdist (``make test``), the order in which the tiers' modules are handed out to the
#: workers: the slowest first, so that the last module a worker starts is a short one and no worker
#: runs a minutes-long module alone at the end. Directories not named here rank with ``pure``.
XDIST_ORDER = ("e2e", "soak", "faults", "integration", "embedded", "pure")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, sort the items by tier (``XDIST_ORDER``), keeping the order within each:
    every worker collects, and sorts, the same list; the controller hands out whole modules
    (``--dist loadfile``) in that order (with ``--no-loadscope-reorder``)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return

    def tier(item: pytest.Item) -> int:
        parts = item.nodeid.split("/")
        name = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
        return XDIST_ORDER.index(name) if name in XDIST_ORDER else len(XDIST_ORDER) - 1

    items.sort(key=tier)


class TestStack:
    """The Kafka bootstrap servers and ClickHouse URL of this test session.

    Each embedded server starts on first use of its address; real services named by
    ``CHTXN_TEST_KAFKA`` / ``CHTXN_TEST_CLICKHOUSE_URL`` are used as they are.
    """

    __test__ = False  # not a test class, despite its name

    def __init__(self, data_dir: Path, *, keeper: bool = False, kafka: str | None = None) -> None:
        self.external_kafka = kafka or os.environ.get("CHTXN_TEST_KAFKA") or None
        external = None if keeper else os.environ.get("CHTXN_TEST_CLICKHOUSE_URL")
        self.external_clickhouse = (external or "").rstrip("/") or None
        self._keeper = keeper
        self._data_dir = data_dir
        self._embedded = None
        self._lock = threading.Lock()

    def _stack(self):  # EmbeddedStack, imported lazily
        if self._embedded is None:
            from embedded.stack import EmbeddedStack

            self._embedded = EmbeddedStack(self._data_dir, keeper=self._keeper)
        return self._embedded

    @property
    def keeper(self):  # EmbeddedKeeper
        """The ZooKeeper process of a stack made with ``keeper=True`` (start it with ``restart_keeper``)."""
        assert self._keeper, "this stack has no keeper"
        with self._lock:
            return self._stack().keeper

    def restart_keeper(self) -> None:
        """Start the keeper again (same port, same data) after a test stopped it."""
        with self._lock:
            self._stack().start_keeper()

    @property
    def embedded(self):  # EmbeddedStack
        """The embedded stack behind this session (its servers may not be started)."""
        with self._lock:
            return self._stack()

    @property
    def kafka_bootstrap(self) -> str:
        if self.external_kafka:
            return self.external_kafka
        with self._lock:
            return self._stack().start_kafka().bootstrap

    @property
    def clickhouse_url(self) -> str:
        """``http(s)://[user:password@]host:port``, without a trailing slash."""
        if self.external_clickhouse:
            return self.external_clickhouse
        with self._lock:
            return self._stack().start_clickhouse().url

    @property
    def clickhouse_host(self) -> str:
        return urlsplit(self.clickhouse_url).hostname or "localhost"

    @property
    def clickhouse_port(self) -> int:
        url = urlsplit(self.clickhouse_url)
        return url.port or (8443 if url.scheme == "https" else 8123)

    def clickhouse_client(self, database: str | None = None, **kwargs: object):
        """A clickhouse-connect client for this session's ClickHouse (credentials from the URL)."""
        import clickhouse_connect

        url = self.clickhouse_url
        return clickhouse_connect.get_client(dsn=url, secure=url.startswith("https://"), database=database, **kwargs)

    def stop(self) -> None:
        with self._lock:
            if self._embedded is not None:
                self._embedded.stop()


@pytest.fixture(scope="session", autouse=True)
def _embedded_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``chtxn embedded`` run by a test without ``--data-dir`` uses a directory of the session, never
    the user's own stack (``XDG_STATE_HOME`` too, for commands run without the ``CHTXN_*`` variables)."""
    saved = {name: os.environ.get(name) for name in ("CHTXN_EMBEDDED_DIR", "XDG_STATE_HOME")}
    state = tmp_path_factory.mktemp("state")
    os.environ.update(CHTXN_EMBEDDED_DIR=str(state / "chtxn" / "embedded"), XDG_STATE_HOME=str(state))
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session", autouse=True)
def _quick_jvms() -> Iterator[None]:
    """spark-submit's driver JVM (``SPARK_SUBMIT_OPTS``, read by Spark's launcher; in local mode the
    executors run in it) compiles with ``JVM_JIT``, before any options already set there."""
    saved = os.environ.get("SPARK_SUBMIT_OPTS")
    os.environ["SPARK_SUBMIT_OPTS"] = f"{JVM_JIT} {saved or ''}".strip()
    yield
    if saved is None:
        os.environ.pop("SPARK_SUBMIT_OPTS", None)
    else:
        os.environ["SPARK_SUBMIT_OPTS"] = saved


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestStack]:
    """The session's Kafka and ClickHouse: ``.kafka_bootstrap``, ``.clickhouse_url``,
    ``.clickhouse_host``, ``.clickhouse_port``, ``.clickhouse_client(database)``."""
    test_stack = TestStack(tmp_path_factory.mktemp("embedded"))
    yield test_stack
    test_stack.stop()


@pytest.fixture(scope="session")
def keeper_stack(tmp_path_factory: pytest.TempPathFactory, stack: TestStack) -> Iterator[TestStack]:
    """A ClickHouse endpoint configured for a real ZooKeeper (``.keeper``), sharing ``stack``'s broker:
    for ``ledger.commit_point = "keeper"``. Always embedded: a keeper test stops and starts ZooKeeper."""
    test_stack = TestStack(tmp_path_factory.mktemp("embedded-keeper"), keeper=True, kafka=stack.kafka_bootstrap)
    yield test_stack
    test_stack.stop()


@pytest.fixture(scope="session")
def kafka_admin(stack: TestStack):  # confluent_kafka.admin.AdminClient
    """An AdminClient on the session's broker."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": stack.kafka_bootstrap})


@pytest.fixture(scope="module")
def ch_database(stack: TestStack, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh ClickHouse database for the test module, dropped after its last test."""
    module = re.sub(r"[^A-Za-z0-9_]", "_", request.module.__name__.rsplit(".", 1)[-1])
    name = unique_name(f"t_{module}"[:40])
    admin = stack.clickhouse_client()
    admin.command(f"CREATE DATABASE `{name}`")
    yield name
    admin.command(f"DROP DATABASE IF EXISTS `{name}` SYNC")
    admin.close()


@pytest.fixture(scope="module")
def ch_client(stack: TestStack, ch_database: str):  # clickhouse_connect Client
    """A clickhouse-connect client whose default database is the module's fresh database."""
    client = stack.clickhouse_client(ch_database)
    yield client
    client.close()


@pytest.fixture(scope="session")
def executor_archive_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache dir holding the packed executor environment, built once per session (``--cache-dir``)."""
    from cli.packaging import ensure_archive

    cache_dir = tmp_path_factory.mktemp("executor-archives")
    ensure_archive(cache_dir, progress=print)
    return cache_dir


@pytest.fixture(scope="module")
def spark_cluster_of_module(tmp_path_factory: pytest.TempPathFactory):  # SparkCluster
    """A Spark standalone master and two workers of 2 cores on loopback, for the tests of one module."""
    from tests.spark_cluster import SparkCluster

    cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=2, memory="1g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def spark_cluster(spark_cluster_of_module):  # SparkCluster
    """The module's Spark cluster with every worker running and registered (killed ones restarted)."""
    spark_cluster_of_module.ensure_workers()
    return spark_cluster_of_module
