"""The series a coordinator replica exports as a standby, as a leader, and after it stops leading
(coordinator.metrics), read from its registry."""

from __future__ import annotations

import platform
import time

from coordinator.metrics import CoordinatorMetrics, package_version
from protocol import shards as shard_rules
from protocol.config.parse import parse_config
from protocol.coordinator.events import Txn
from protocol.messages import TopicPartition, WriteStatus


def value(metrics: CoordinatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"pipeline": "orders", **labels})


def test_a_standby_exports_every_series_with_leader_0() -> None:
    metrics = CoordinatorMetrics("orders")
    assert value(metrics, "chtxn_leader") == 0
    assert value(metrics, "chtxn_epoch") == 0
    assert value(metrics, "chtxn_partitions_live") == 0
    assert value(metrics, "chtxn_last_commit_timestamp_seconds") == 0
    assert value(metrics, "chtxn_transactions_total", outcome="committed") == 0
    assert value(metrics, "chtxn_commit_latency_seconds_count") == 0
    assert value(metrics, "chtxn_flush_latency_seconds_count") == 0
    assert value(metrics, "chtxn_rows_committed_total") == 0


def test_build_info_names_the_package_and_python_versions() -> None:
    metrics = CoordinatorMetrics("orders")
    labels = {"version": package_version(), "python": platform.python_version()}
    assert value(metrics, "chtxn_build_info", **labels) == 1
    assert package_version() not in ("", "unknown")  # the tests run from an installed checkout


def test_the_process_and_platform_collectors_are_registered() -> None:
    registry = CoordinatorMetrics("orders").registry
    assert (registry.get_sample_value("process_cpu_seconds_total") or 0) > 0
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 0
    names = {family.name for family in registry.collect()}
    assert {"python_info", "python_gc_collections"} <= names


def test_a_commit_counts_and_stamps_the_time() -> None:
    metrics = CoordinatorMetrics("orders")
    before = time.time()
    metrics.committed()
    assert value(metrics, "chtxn_transactions_total", outcome="committed") == 1
    stamped = value(metrics, "chtxn_last_commit_timestamp_seconds")
    assert stamped is not None and before <= stamped <= time.time()


def test_leading_then_not_leading_drops_the_leader_only_figures() -> None:
    metrics = CoordinatorMetrics("orders")
    metrics.leading(4)
    metrics.live_partitions.labels("orders").set(3)
    metrics.lag.labels("orders", "events", "0").set(120)
    assert (value(metrics, "chtxn_leader"), value(metrics, "chtxn_epoch")) == (1, 4)
    metrics.not_leading()
    assert (value(metrics, "chtxn_leader"), value(metrics, "chtxn_epoch")) == (0, 0)
    assert value(metrics, "chtxn_partitions_live") == 0
    assert value(metrics, "chtxn_partition_lag", topic="events", partition="0") is None


SHARDS = ["shard 1 (ch-1:8123)", "shard 2 (ch-2:8123)", "shard 3 (ch-3:8123)"]


def test_a_commit_counts_its_rows_by_table_and_by_the_shard_each_partition_is_placed_on() -> None:
    cfg = parse_config('[pipeline]\nname = "orders"\ntopics = ["events"]\n[clickhouse]\ntarget_table = "t"\n', {})
    metrics = CoordinatorMetrics("orders", cfg.tables, SHARDS)
    assert [value(metrics, "chtxn_shard_rows_committed_total", shard=s) for s in SHARDS] == [0, 0, 0]
    assert [value(metrics, "chtxn_shard_publish_failures_total", shard=s) for s in SHARDS] == [0, 0, 0]
    txn = Txn(id="e1_t1", stage_table="s", start={}, created_at=0.0)
    for partition in range(6):
        txn.statuses[TopicPartition(topic="events", partition=partition)] = WriteStatus(
            pipeline="orders", epoch=1, txn="e1_t1", sender="p", topic="events", partition=partition,
            start_offset=0, end_offset=10, rows=10 * (partition + 1), chunks=1, bytes=5,
        )  # fmt: skip
    metrics.count_commit(txn, cfg)
    placed = [0, 0, 0]
    for partition in range(6):
        placed[shard_rules.shard_of("events", partition, 3)] += 10 * (partition + 1)
    assert [value(metrics, "chtxn_shard_rows_committed_total", shard=s) for s in SHARDS] == placed
    assert value(metrics, "chtxn_rows_committed_total") == sum(placed) == 210
    assert value(metrics, "chtxn_table_rows_committed_total", table="t") == 210
    assert value(metrics, "chtxn_bytes_committed_total") == 30
    assert value(metrics, "chtxn_transactions_total", outcome="committed") == 1
    metrics.shard_publish_failed(SHARDS[1])
    assert [value(metrics, "chtxn_shard_publish_failures_total", shard=s) for s in SHARDS] == [0, 1, 0]


def test_one_server_exports_no_shard_series() -> None:
    metrics = CoordinatorMetrics("orders")
    names = {s.name for family in metrics.registry.collect() for s in family.samples}
    assert not {n for n in names if n.startswith("chtxn_shard_")}


def test_a_distributed_targets_series_become_its_local_tables_and_its_clusters_shards_once_learnt() -> None:
    """The service's metrics are made of the config given (the Distributed table, no shard); ``cover``
    gives the series of the config learnt from the server (``protocol.tables.distributed``) instead."""
    text = '[pipeline]\nname = "orders"\ntopics = ["events"]\n[clickhouse]\ntarget_table = "{table}"\n{more}'
    given = parse_config(text.format(table="events_all", more=""), {})
    shards = 'shards = ["http://ch-1:8123", "http://ch-2:8123", "http://ch-3:8123"]\n'
    learnt = parse_config(text.format(table="events", more=shards), {})
    metrics = CoordinatorMetrics.of(given)
    assert value(metrics, "chtxn_table_rows_committed_total", table="events_all") == 0
    metrics.cover(learnt)
    assert value(metrics, "chtxn_table_rows_committed_total", table="events_all") is None
    assert value(metrics, "chtxn_table_rows_committed_total", table="events") == 0
    assert [value(metrics, "chtxn_shard_rows_committed_total", shard=s) for s in SHARDS] == [0, 0, 0]
    assert metrics.shards == SHARDS
