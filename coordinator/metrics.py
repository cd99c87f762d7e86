"""Prometheus metrics of the coordinator (``coordinator.metrics_port``; 0 serves none).

Every replica exports every series of its pipeline from its start, a standby included: ``chtxn_leader``
is 0 there, so ``sum by (pipeline) (chtxn_leader)`` counts the leaders of a pipeline (0 or 1). The
leader-only gauges (lag, live partitions) are reset when a replica stops leading, so a former leader
never exports stale figures beside the new one's; so are the participants' own figures, which only
the leader exports (``coordinator.participant_metrics``: one series per participant copy, from its
heartbeats). A sharded ClickHouse (``clickhouse.shards``) adds two series per shard, labelled
``shard`` with ``protocol.shards.where`` (``shard 2 (host:port)``: as few as the shards). The registry also holds prometheus_client's process, platform and garbage-collector
collectors (``process_*``, ``python_*``), which a registry of our own does not get by default.
``docs/operations.md`` lists every series.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import metadata
from typing import TypedDict

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from coordinator.participant_metrics import ParticipantCollector
from protocol import routing, shards as shard_rules
from protocol.config.parse import PipelineConfig
from protocol.coordinator.events import (
    ABORT_KINDS,
    AbortTxn,
    Commit,
    CountStage,
    CreateStage,
    DropStage,
    Publish,
    RecordStarted,
    Txn,
)
from protocol.messages import ParticipantFigures, TopicPartition

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


def package_version() -> str:
    """chtxn's installed version (what ``chtxn --version`` prints), or "unknown" outside an install."""
    try:
        return metadata.version("chtxn")
    except metadata.PackageNotFoundError:
        return "unknown"


class _PipelineLabel(TypedDict):
    """The keyword arguments of a metric labelled by pipeline alone."""

    labelnames: list[str]
    registry: CollectorRegistry


class CoordinatorMetrics:
    """One registry per service, so tests can run several coordinators in one process."""

    @classmethod
    def of(cls, cfg: PipelineConfig) -> CoordinatorMetrics:
        """The metrics of ``cfg``'s pipeline, with a series per target table and per shard from the start."""
        return cls(cfg.name, cfg.tables, [shard_rules.where(i, url) for i, url in enumerate(cfg.clickhouse.shards)])

    def __init__(self, pipeline: str, tables: Sequence[str] = (), shards: Sequence[str] = ()) -> None:
        """``tables``: the pipeline's target tables, ``shards`` its shards (``protocol.shards.where``, in
        shard order), whose series exist from the start."""
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        labels: _PipelineLabel = {"labelnames": ["pipeline"], "registry": self.registry}
        self.build = Info("chtxn_build", "The chtxn version this replica runs (value 1)", **labels)
        self.transactions = Counter(
            "chtxn_transactions", "Transactions by outcome", ["pipeline", "outcome"], registry=self.registry
        )
        self.aborts = Counter(
            "chtxn_aborts", "Aborted transactions by reason", ["pipeline", "reason"], registry=self.registry
        )
        self.last_commit = Gauge(
            "chtxn_last_commit_timestamp_seconds",
            "Unix time at which this replica, leading, last won a commit slot (0: never since it started)",
            **labels,
        )
        self.commit_latency = Histogram(
            "chtxn_commit_latency_seconds", "END-COMMIT to ACK-COMMIT", buckets=_LATENCY_BUCKETS, **labels
        )
        self.flush_latency = Histogram(
            "chtxn_flush_latency_seconds",
            "END-COMMIT to the last WRITE-STATUS: the participants' last inserts, part of the commit latency",
            buckets=_LATENCY_BUCKETS,
            **labels,
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
        self.table_rows = Counter(
            "chtxn_table_rows_committed",
            "Rows committed into each target table (this pipeline's rows only)",
            ["pipeline", "table"],
            registry=self.registry,
        )
        self.shards = list(shards)
        self.tables = list(tables)
        self.shard_rows = Counter(
            "chtxn_shard_rows_committed",
            "Rows committed into each shard of clickhouse.shards, by the shard their source partition is placed on",
            ["pipeline", "shard"],
            registry=self.registry,
        )
        self.shard_rows_published = Counter(
            "chtxn_shard_rows_published",
            "Rows this replica published (moved or copied into the target tables) on each shard of clickhouse.shards",
            ["pipeline", "shard"],
            registry=self.registry,
        )
        self.shard_publish_failures = Counter(
            "chtxn_shard_publish_failures",
            "Attempts to publish a committed txn's stage tables on each shard that failed (each is retried)",
            ["pipeline", "shard"],
            registry=self.registry,
        )
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
        self.live_partitions = Gauge(
            "chtxn_partitions_live",
            "Source partitions some participant heartbeated within the heartbeat timeout (leader only; 0 as standby)",
            **labels,
        )
        self.leader = Gauge("chtxn_leader", "1 while this replica leads, 0 as standby", **labels)
        self.epoch = Gauge("chtxn_epoch", "Epoch this replica leads (0 as standby)", **labels)
        self.lag = Gauge(
            "chtxn_partition_lag",
            "Log end minus last committed offset (leader only)",
            ["pipeline", "topic", "partition"],
            registry=self.registry,
        )
        self.topics_held = Gauge(
            "chtxn_topic_held",
            "1 for each source topic the leader holds and reads nothing of: the routes of several tables match "
            "it, or it is new and its offsets cannot be read (leader only)",
            ["pipeline", "topic"],
            registry=self.registry,
        )
        self.stopped = Gauge(
            "chtxn_partition_stopped",
            "1 for a source partition whose log no longer matches the ledger: not read until chtxn reset (leader only)",
            ["pipeline", "topic", "partition"],
            registry=self.registry,
        )
        self.participants = ParticipantCollector(pipeline)
        self.registry.register(self.participants)
        self.pipeline = pipeline
        # Every series present from the start, a standby's included.
        self.build.labels(pipeline).info({"version": package_version(), "python": platform.python_version()})
        for kind in ABORT_KINDS:
            self.aborts.labels(pipeline, kind)
        for outcome in ("committed", "aborted"):
            self.transactions.labels(pipeline, outcome)
        for step in LEADER_STEPS.values():
            self.step_seconds.labels(pipeline, step)
        self._table_and_shard_series()
        for metric in (
            self.last_commit,
            self.commit_latency,
            self.flush_latency,
            self.publish_latency,
            self.rows,
            self.bytes,
            self.lost,
            self.dead_letters,
            self.control_holes,
        ):
            metric.labels(pipeline)
        self.not_leading()

    def cover(self, cfg: PipelineConfig) -> None:
        """The table and shard series of ``cfg`` as learnt from the server (a Distributed target is its local
        table on its cluster's shards: ``protocol.tables.distributed``), in place of those of the config given."""
        shards = [shard_rules.where(i, url) for i, url in enumerate(cfg.clickhouse.shards)]
        for table in set(self.tables) - set(cfg.tables):
            self.table_rows.remove(self.pipeline, table)
        for shard in set(self.shards) - set(shards):
            self.shard_rows.remove(self.pipeline, shard)
            self.shard_rows_published.remove(self.pipeline, shard)
            self.shard_publish_failures.remove(self.pipeline, shard)
        self.tables, self.shards = list(cfg.tables), shards
        self._table_and_shard_series()

    def _table_and_shard_series(self) -> None:
        for table in self.tables:
            self.table_rows.labels(self.pipeline, table)
        for shard in self.shards:
            self.shard_rows.labels(self.pipeline, shard)
            self.shard_rows_published.labels(self.pipeline, shard)
            self.shard_publish_failures.labels(self.pipeline, shard)

    def leading(self, epoch: int) -> None:
        """This replica has won ``epoch``."""
        self.leader.labels(self.pipeline).set(1)
        self.epoch.labels(self.pipeline).set(epoch)

    def hear_participants(self, figures: Callable[[], Mapping[str, ParticipantFigures]]) -> None:
        """Leading: export the participants' figures ``figures()`` gives at each scrape (by sender)."""
        self.participants.follow(figures)

    def not_leading(self) -> None:
        """This replica is a standby: the leader-only figures go (the new leader exports its own)."""
        self.leader.labels(self.pipeline).set(0)
        self.epoch.labels(self.pipeline).set(0)
        self.live_partitions.labels(self.pipeline).set(0)
        self.lag.clear()
        self.topics_held.clear()
        self.stopped.clear()
        self.participants.stop()

    def hold_topics(self, topics: Iterable[str]) -> None:
        """Leading: ``topics`` are the source topics held now (``SourceOffsets.held``)."""
        self.topics_held.clear()
        for topic in topics:
            self.topics_held.labels(self.pipeline, topic).set(1)

    def set_stopped(self, partitions: Iterable[TopicPartition]) -> None:
        """Leading: ``partitions`` are the stopped ones now (the series of the others go)."""
        self.stopped.clear()
        for tp in partitions:
            self.stopped.labels(self.pipeline, tp.topic, str(tp.partition)).set(1)

    def committed(self) -> None:
        """This replica, leading, has just won a commit slot (commit step 6)."""
        self.transactions.labels(self.pipeline, "committed").inc()
        self.last_commit.labels(self.pipeline).set_to_current_time()

    def count_commit(self, txn: Txn, cfg: PipelineConfig) -> None:
        """What this replica, leading, has just committed in ``txn``: its rows (in all, by target table by
        ``cfg``'s routes, and by shard by placement), bytes and dead letters."""
        self.committed()
        self.rows.labels(self.pipeline).inc(txn.rows)
        by_topic = routing.route({tp.topic for tp in txn.statuses}, cfg.routes).tables
        for tp, ws in txn.statuses.items():
            if ws.rows and tp.topic in by_topic:  # a txn only holds rows of routed topics
                self.table_rows.labels(self.pipeline, by_topic[tp.topic]).inc(ws.rows)
            if ws.rows and self.shards and cfg.clickhouse.placement == "partition":  # by key, a partition spreads
                shard = self.shards[shard_rules.shard_of(tp.topic, tp.partition, len(self.shards))]
                self.shard_rows.labels(self.pipeline, shard).inc(ws.rows)
        self.bytes.labels(self.pipeline).inc(sum(ws.bytes for ws in txn.statuses.values()))
        self.dead_letters.labels(self.pipeline).inc(sum(ws.dead_letters for ws in txn.statuses.values()))

    def shard_published(self, shard: str, rows: int) -> None:
        """A txn's stage tables on ``shard`` (``protocol.shards.where``) were published, ``rows`` moved or copied."""
        self.shard_rows_published.labels(self.pipeline, shard).inc(rows)

    def shard_publish_failed(self, shard: str) -> None:
        """An attempt to publish a txn's stage tables on ``shard`` (``protocol.shards.where``) failed."""
        self.shard_publish_failures.labels(self.pipeline, shard).inc()
