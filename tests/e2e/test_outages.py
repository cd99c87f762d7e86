"""Outages of ClickHouse and Kafka under a running pipeline (docs/architecture.md §13), through a TCP proxy.

Each test points the pipeline's processes at a ``TcpProxy`` in front of one server, cuts or slows it
mid-run, and then requires: the coordinator and the participant job are still running, every
produced row ends up committed, and the exactly-once oracle passes. Aborts during an outage are
allowed. The oracle and the row counts always go to the servers directly, never through the proxy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from embedded.broker import EmbeddedBroker
from procs import free_port
from tests.e2e.processes import Processes, committed, running
from tests.faults.proxied import Addresses, direct, via
from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

pytestmark = pytest.mark.e2e

OUTAGE_S = 10.0
FIRST_COMMIT_S = 180.0


def hold(seconds: float, procs: Processes) -> None:
    """Keep an outage on for ``seconds`` (a timed window, not a synchronisation), failing at once
    if a process exits meanwhile."""
    end = time.monotonic() + seconds
    wait_until(
        lambda: procs.alive() or time.monotonic() >= end, seconds + 30, "the end of the outage window", interval_s=0.2
    )


def still_running(procs: Processes) -> None:
    """Every process of the pipeline is alive: the service kept running through the outage."""
    for name, proc in procs.procs.items():
        assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{procs.tail(name)}"


def first_commit(pipeline: Pipeline, procs: Processes) -> None:
    wait_until(lambda: procs.alive() or pipeline.target_count() > 0, FIRST_COMMIT_S, "the first rows committed")


@pytest.fixture
def clickhouse_proxy(stack) -> Iterator[TcpProxy]:  # the session's TestStack
    """A proxy in front of the session's ClickHouse."""
    with TcpProxy(stack.clickhouse_host, stack.clickhouse_port) as proxy:
        yield proxy


@pytest.fixture
def kafka_proxy(tmp_path: Path) -> Iterator[TcpProxy]:
    """A broker of this test's own whose advertised listener is the proxy: every client, once
    bootstrapped, reaches the broker only through the proxy. The broker stays up throughout (its
    data lives in memory); only the proxy cuts the traffic."""
    port = free_port()
    with (
        TcpProxy("127.0.0.1", port) as proxy,
        EmbeddedBroker(port, advertised_port=proxy.port, log_path=tmp_path / "kafka.log"),
    ):
        yield proxy


def test_clickhouse_cut_for_10s_then_back(stack, tmp_path, clickhouse_proxy):
    proxy = clickhouse_proxy
    pipeline = make_pipeline(
        Addresses(stack.kafka_bootstrap, via(stack.clickhouse_url, proxy)),
        tmp_path,
        unique_name("e2echcut"),
        partitions=2,
        settings={"participant.chunk_rows": 2_000},
    )
    check = direct(pipeline, stack.clickhouse_url)
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        first_commit(check, procs)
        proxy.cut()
        refused_before = proxy.refused
        produced += pipeline.produce(20_000, start_id=produced)  # Kafka is not cut: the participants keep reading
        hold(OUTAGE_S, procs)
        assert proxy.refused > refused_before, "nothing tried to reach ClickHouse during the outage"
        proxy.restore()
        committed(check, produced, procs)
        still_running(procs)
    assert_exactly_once(check, produced)


def test_slow_clickhouse_still_exactly_once(stack, tmp_path, clickhouse_proxy):
    proxy = clickhouse_proxy
    pipeline = make_pipeline(
        Addresses(stack.kafka_bootstrap, via(stack.clickhouse_url, proxy)),
        tmp_path,
        unique_name("e2echslow"),
        partitions=2,
        settings={"participant.chunk_rows": 2_000},
    )
    check = direct(pipeline, stack.clickhouse_url)
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        first_commit(check, procs)
        ledger = check.ledger()
        proxy.delay(0.3)
        commits = len(ledger.commits())
        produced += pipeline.produce(20_000, start_id=produced)
        wait_until(
            lambda: procs.alive() or len(ledger.commits()) >= commits + 2,
            FIRST_COMMIT_S,
            "two commits while every chunk of ClickHouse traffic is held 0.3 s",
        )
        proxy.restore()
        committed(check, produced, procs)
        still_running(procs)
    assert_exactly_once(check, produced)


def test_kafka_cut_for_10s_then_back(stack, tmp_path, kafka_proxy):
    proxy = kafka_proxy
    pipeline = make_pipeline(
        Addresses(proxy.address, stack.clickhouse_url),
        tmp_path,
        unique_name("e2ekcut"),
        partitions=2,
        settings={"participant.chunk_rows": 2_000},
    )
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        first_commit(pipeline, procs)
        produced += pipeline.produce(20_000, start_id=produced)
        proxy.cut()
        refused_before = proxy.refused
        hold(OUTAGE_S, procs)
        assert proxy.refused > refused_before, "nothing tried to reach Kafka during the outage"
        proxy.restore()
        produced += pipeline.produce(10_000, start_id=produced)
        committed(pipeline, produced, procs)
        still_running(procs)
    assert_exactly_once(pipeline, produced)


def test_zookeeper_stopped_for_10s_mid_txn_then_back(keeper_stack, tmp_path):
    """``ledger.commit_point = "keeper"``: the ZooKeeper process is stopped (by PID) while txns run,
    so every claim fails (Keeper session lost) and no commit lands; started again on the same port
    with the same data, the pipeline resumes by itself. Nothing committed twice, nothing lost."""
    pipeline = make_pipeline(
        keeper_stack,
        tmp_path,
        unique_name("e2ezk"),
        partitions=2,
        settings={"participant.chunk_rows": 2_000, "ledger.commit_point": "keeper"},
    )
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        first_commit(pipeline, procs)
        ledger = pipeline.ledger()
        keeper = keeper_stack.keeper
        pid = keeper.pid
        keeper.stop()
        try:
            stopped_at = ledger.head()[0]
            produced += pipeline.produce(20_000, start_id=produced)
            hold(OUTAGE_S, procs)
            assert ledger.head()[0] <= stopped_at + 1, "commits went on without Keeper"  # one claim in flight
        finally:
            keeper_stack.restart_keeper()
        assert keeper_stack.keeper.pid != pid
        committed(pipeline, produced, procs)
        still_running(procs)
    assert_exactly_once(pipeline, produced)
