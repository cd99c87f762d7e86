"""What ``chtxn status`` finds (``collect``): the coordinators, the last commit and rate, the checks
and each partition's lag, from the ledger (epochs, the head, the latest commits), the tail of the
control topic (``cli.control_tail``), each source partition's log end (``clients.log_ends``:
right on the embedded broker too, whose ListOffsets answer trails the log) and, with
``clickhouse.shards``, each shard's tables (``cli.shard_reads``). The verdicts are
``protocol.status.health``'s and ``protocol.status.shards``'; the standbys are added by
``protocol.status.standbys``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import msgspec

from cli import control_tail
from cli.shard_reads import status_of_shards
from cli.txn import _missing_ledger, open_ledger
from clients import kafka as kafka_clients
from clients.clickhouse import retry_budget_s
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.ledger.history import LedgerHistory
from coordinator.offsets import partition_logs
from protocol import naming, routing
from protocol.checks import Check
from protocol.config.parse import PipelineConfig
from protocol.errors import ClickHouseError
from protocol.ledger.rows import LedgerEvent
from protocol.ledger.view import TxnSummary
from protocol.offsets.partition_logs import stops_check
from protocol.status import health as pipeline_health
from protocol.status.health import Replica
from protocol.status.shards import ShardStatus, shards_check
from protocol.status.standbys import with_standbys


class PartitionStatus(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    committed: int | None  # next offset to read after the last commit; None: never committed
    log_end: int  # the offset the next record will get (clients.log_ends)
    lag: int | None
    participant: str  # "" when no live participant holds it
    table: str  # the target table its route sends it to


class TableStatus(msgspec.Struct, frozen=True, kw_only=True):
    """One target table of the pipeline: its own partitions and commits (``[[route]]``: rows other
    pipelines write into a shared table are not counted)."""

    table: str
    partitions: int
    lag: int | None  # records of its partitions not yet committed; None when one was never committed
    rows_per_s: float | None  # its rows committed per second, over the same commits as the pipeline's


class Status(msgspec.Struct, frozen=True, kw_only=True):
    pipeline: str
    leader: str  # the leader's id; "" when no leader was heard from within the lease
    leader_epoch: int  # the epoch the leader heartbeats; 0 when none was heard
    epoch: int  # the highest epoch claimed in the ledger
    replicas: tuple[Replica, ...]  # every replica heard (leaders and standbys), and the owner of the highest epoch
    last_commit_seq: int
    last_commit_txn: str
    last_commit_at: float  # unix seconds; 0.0 when nothing was committed
    commit_age_s: float | None  # seconds since the last COMMITTED row; None when none
    rows_per_s: float | None  # rows committed per second over the latest ``rate_commits`` commits
    rate_commits: int  # commits the rate was taken over (0: too few for a rate)
    rate_window_s: float  # seconds between the oldest and newest of them
    last_txn: str
    last_txn_state: str
    last_abort_reason: str
    paused: bool  # chtxn pause: the leader starts no txn until chtxn resume
    paused_by: str
    paused_reason: str
    paused_at: float  # unix seconds of the pause; 0.0 when not paused
    partitions: tuple[PartitionStatus, ...]
    tables: tuple[TableStatus, ...]
    shards: tuple[ShardStatus, ...]  # each shard of clickhouse.shards, in shard order; () when not sharded
    checks: tuple[Check, ...]
    failed: tuple[str, ...]  # the names of the checks that failed
    healthy: bool  # no check failed (a warning does not fail)


#: Commits the rows/s figure is taken over, by default.
RATE_COMMITS = 20


def collect(
    cfg: PipelineConfig,
    config_path: str,
    *,
    rate_commits: int = RATE_COMMITS,
    timeout_s: float = kafka_clients.DEFAULT_TIMEOUT_S,
) -> Status:
    ledger = open_ledger(cfg)
    try:
        head_seq, head = ledger.head()
        epoch = ledger.max_epoch()
        owner = (ledger.epoch_owner(epoch) or "") if epoch else ""
        last = ledger.commit_at(head_seq) if head_seq else None
        commits = _latest_commits(ledger, rate_commits)
        latest = ledger.history(limit=1)
        aborted = ledger.last_abort()
        pause = ledger.pause()
        stopped = partition_logs.stops(ledger)
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, config_path) from None
    now = time.time()
    consumer = kafka_clients.KafkaClientFactory(cfg).consumer(
        **{"group.id": naming.status_group(cfg.name), **CONSUMER_PROPERTIES}
    )
    try:
        partitions = kafka_clients.partitions_of(consumer, cfg.source_topics, timeout_s, cfg.kafka.bootstrap_servers)
        leaders, standbys, holders = control_tail.heartbeats(cfg, consumer, now, timeout_s)
        ends = log_ends(consumer, [(tp.topic, tp.partition) for tp in partitions], timeout_s)
    finally:
        consumer.close()
    routed = routing.route(sorted({tp.topic for tp in partitions}), cfg.routes)
    rows = [
        PartitionStatus(
            topic=tp.topic,
            partition=tp.partition,
            committed=head.get(tp),
            log_end=(end := ends[(tp.topic, tp.partition)]),
            lag=max(0, end - head[tp]) if tp in head else None,
            participant=holders.get(tp, ""),
            table=routed.tables.get(tp.topic, ""),
        )
        for tp in partitions
    ]
    lease_s = cfg.coordinator.leader_lease_s
    found = pipeline_health.replicas(leaders, lease_s=lease_s, highest_epoch=epoch, highest_owner=owner)
    leader = next((r for r in found if r.role == pipeline_health.LEADER), None)
    every = with_standbys(found, standbys, lease_s=lease_s)
    committed_at = (last.committed_at or last.event_time) if last else 0.0
    age = round(max(0.0, now - committed_at), 1) if committed_at else None
    rate, window = pipeline_health.rows_per_s([(c.committed_at, c.total_rows) for c in commits])
    checks: tuple[Check, ...] = (
        pipeline_health.leader_check(found, lease_s=lease_s, highest_epoch=epoch, every=every, retry_s=_retry_s(cfg)),
        pipeline_health.participants_check(holders, partitions, timeout_s=cfg.heartbeat_timeout_s),
        _commits_check(age, head_seq, every, cfg),
    )
    paused = pause is not None and pause.event is LedgerEvent.PAUSED
    if paused and pause is not None:  # no commits is what a pause is for: say so instead of failing
        found_pause = f"paused by {pause.coordinator}" + (f": {pause.reason}" if pause.reason else "")
        checks = (*checks[:2], Check(name="commits", status="warn", found=found_pause, fix="chtxn resume"))
    checks = (*checks, pipeline_health.routes_check(routed.ambiguous))
    checks = (*checks, stops_check({tp: s for tp, s in stopped.items() if tp in set(partitions)}))
    shards = status_of_shards(cfg, timeout_s) if cfg.clickhouse.shards else ()
    if shards:
        checks = (*checks, shards_check(shards))
    failed = tuple(c.name for c in checks if c.status == "fail")
    return Status(
        pipeline=cfg.name,
        leader=leader.id if leader else "",
        leader_epoch=leader.epoch if leader else 0,
        epoch=epoch,
        replicas=every,
        last_commit_seq=head_seq,
        last_commit_txn=last.txn if last else "",
        last_commit_at=committed_at,
        commit_age_s=age,
        rows_per_s=None if rate is None else round(rate, 1),
        rate_commits=len(commits) if rate is not None else 0,
        rate_window_s=round(window, 1),
        last_txn=latest[0].txn if latest else "",
        last_txn_state=latest[0].state if latest else "",
        last_abort_reason=aborted.reason if aborted else "",
        paused=paused,
        paused_by=pause.coordinator if paused and pause else "",
        paused_reason=pause.reason if paused and pause else "",
        paused_at=(pause.started_at or pause.event_time) if paused and pause else 0.0,
        partitions=tuple(rows),
        tables=_tables(cfg, rows, commits),
        shards=shards,
        checks=checks,
        failed=failed,
        healthy=not failed,
    )


def _latest_commits(ledger: LedgerHistory, count: int) -> list[TxnSummary]:
    """The latest ``count`` committed txns among the latest txns, oldest first (aborted ones and seals
    come between them: three times as many txns are read)."""
    if count < 2:
        return []
    txns = ledger.latest_txns(limit=3 * count)
    return sorted((t for t in txns if t.committed_at and t.commit_seq), key=lambda t: t.committed_at)[-count:]


def _tables(cfg: PipelineConfig, rows: list[PartitionStatus], commits: list[TxnSummary]) -> tuple[TableStatus, ...]:
    """Each table's partitions, lag and rate: its rows in the pipeline's latest commits, by the topics
    routed to it."""
    by_topic = routing.route(
        sorted({r.topic for r in rows} | {g.topic for c in commits for g in c.ranges}), cfg.routes
    ).tables
    found = []
    for table in cfg.tables:
        lags = [r.lag for r in rows if r.table == table]
        rate, _ = pipeline_health.rows_per_s(
            [(c.committed_at, sum(g.rows for g in c.ranges if by_topic.get(g.topic) == table)) for c in commits]
        )
        found.append(
            TableStatus(
                table=table,
                partitions=len(lags),
                lag=None if None in lags else sum(lag for lag in lags if lag is not None),
                rows_per_s=None if rate is None else round(rate, 1),
            )
        )
    return tuple(found)


def _commits_check(age: float | None, head_seq: int, every: Sequence[Replica], cfg: PipelineConfig) -> Check:
    """``pipeline_health.commits_check``; a failure names the cause the coordinators report, if any."""
    tx = cfg.transaction
    check = pipeline_health.commits_check(
        age,
        head_seq,
        limit_s=pipeline_health.stall_limit_s(tx.interval_s, tx.write_status_timeout_s, tx.idle_interval_s),
    )
    if check.status != "fail":
        return check
    lease_s = cfg.coordinator.leader_lease_s
    return pipeline_health.problem_check("commits", every, lease_s=lease_s, retry_s=_retry_s(cfg)) or check


def _retry_s(cfg: PipelineConfig) -> float:
    """How long a coordinator may say nothing while it retries one ClickHouse operation."""
    return retry_budget_s(cfg.coordinator.clickhouse_retries)
