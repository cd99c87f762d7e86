"""The series a coordinator replica exports as a standby, as a leader, and after it stops leading
(coordinator.metrics), read from its registry."""

from __future__ import annotations

import platform
import time

from coordinator.metrics import CoordinatorMetrics, package_version


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
