"""Prometheus metrics of the coordinator (``coordinator.metrics_port``; 0 serves none)."""

from __future__ import annotations

from typing import TypedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from protocol.coordinator_events import (
    ABORT_KINDS,
    AbortTxn,
    Commit,
    CountStage,
    CreateStage,
    DropStage,
    Publish,
    RecordStarted,
)

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: The leader's ClickHouse steps, as its lanes run them (``coordinator.lanes.LANES``), by action:
#: commit step 5's check, commit step 6's commit point, commit step 7's publish, and the work around them.
LEADER_STEPS: dict[type, str] = {
    CountStage: "check",
    Commit: "commit",
    Publish: "publish",
    CreateStage: "create-stage",
    DropStage: "drop-stage",
    RecordStarted: "record-started",
    AbortTxn: "abort",
}


class _PipelineLabel(TypedDict):
    """The keyword arguments of a metric labelled by pipeline alone."""

    labelnames: list[str]
    registry: CollectorRegistry


class CoordinatorMetrics:
    """One registry per service, so tests can run several coordinators in one process."""

    def __init__(self, pipeline: str) -> None:
        self.registry = CollectorRegistry()
        labels: _PipelineLabel = {"labelnames": ["pipeline"], "registry": self.registry}
        self.transactions = Counter(
            "chtxn_transactions", "Transactions by outcome", ["pipeline", "outcome"], registry=self.registry
        )
        self.aborts = Counter(
            "chtxn_aborts", "Aborted transactions by reason", ["pipeline", "reason"], registry=self.registry
        )
        self.commit_latency = Histogram(
            "chtxn_commit_latency_seconds", "END-COMMIT to ACK-COMMIT", buckets=_LATENCY_BUCKETS, **labels
        )
        self.publish_latency = Histogram(
            "chtxn_publish_latency_seconds", "ACK-COMMIT to PUBLISHED", buckets=_LATENCY_BUCKETS, **labels
        )
        self.step_seconds = Histogram(
            "chtxn_leader_step_seconds",
            "One ClickHouse step of the leader, retries included",
            ["pipeline", "step"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rows = Counter("chtxn_rows_committed", "Rows committed", **labels)
        self.bytes = Counter("chtxn_bytes_committed", "Bytes of records committed", **labels)
        self.lost = Counter(
            "chtxn_lost_transactions", "Committed txns whose stage table was gone at publish (alarm)", **labels
        )
        self.dead_letters = Counter("chtxn_dead_letters", "Records sent to the dead-letter topic", **labels)
        self.control_holes = Counter(
            "chtxn_control_holes",
            "Holes in the control topic's offsets this replica read again (a record served "
            "after a later one: the embedded broker)",
            **labels,
        )
        self.participants = Gauge("chtxn_participants_alive", "Partitions held by a live participant", **labels)
        self.leader = Gauge("chtxn_leader", "1 while this replica leads", **labels)
        self.epoch = Gauge("chtxn_epoch", "Epoch this replica leads (0 as standby)", **labels)
        self.lag = Gauge(
            "chtxn_partition_lag",
            "Log end minus last committed offset",
            ["pipeline", "topic", "partition"],
            registry=self.registry,
        )
        self.pipeline = pipeline
        for kind in ABORT_KINDS:  # every series present from the start
            self.aborts.labels(pipeline, kind)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(pipeline, outcome)
        for step in LEADER_STEPS.values():
            self.step_seconds.labels(pipeline, step)
        self.lost.labels(pipeline)
        self.control_holes.labels(pipeline)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        if port:
            start_http_server(port, addr=addr, registry=self.registry)
