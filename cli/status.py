"""``chtxn status``: the pipeline at a glance — coordinators, last commit and rate, checks, lag.

Reads the ledger (epochs, the head, the latest commits), the tail of the control topic (leaders',
standbys' and participants' heartbeats) and each source partition's log end (``clients.log_ends``:
right on the embedded broker too, whose ListOffsets answer trails the log). The verdicts are
``protocol.pipeline_health``'s; the standbys are added by ``protocol.standby_replicas``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import msgspec
from confluent_kafka import KafkaException, TopicPartition as KafkaTP
from rich.markup import escape

from cli.broker_timeout import add_broker_timeout_option
from cli.config_option import add_config_option
from cli.output import Column, Output, Sheet, Styled, add_format_option
from cli.txn import _missing_ledger, open_ledger
from clients import kafka as kafka_clients
from clients.clickhouse import retry_budget_s
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator import partition_logs
from coordinator.ledger_history import LedgerHistory
from protocol import codec, naming, pipeline_health, routing
from protocol.config import PipelineConfig, load_config
from protocol.doctor_facts import Check
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger import LedgerEvent
from protocol.ledger_view import TxnSummary
from protocol.messages import Heartbeat, LeaderHeartbeat, StandbyHeartbeat, TopicPartition
from protocol.partition_logs import stops_check
from protocol.pipeline_health import Heard, Replica
from protocol.standby_replicas import STANDBY, with_standbys

#: How far back the control topic is read for heartbeats.
CONTROL_TAIL = 2_000
#: Commits the rows/s figure is taken over, by default.
RATE_COMMITS = 20


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
    checks: tuple[Check, ...]
    failed: tuple[str, ...]  # the names of the checks that failed
    healthy: bool  # no check failed (a warning does not fail)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the pipeline at a glance: coordinators, last commit and rate, checks, lag",
        description="Reads the ledger (epochs, the last commits), the tail of the control topic (the leaders', "
        "the standbys' and the participants' heartbeats) and each source partition's log end. Shows every "
        "coordinator replica with its role (leader, standby; left or silent once stopped) and when it was last "
        "heard (each heartbeats every third of coordinator.leader_lease_s), the age of the last commit and the "
        "rows/s of the latest commits, and four checks: leader (one heard within "
        "coordinator.leader_lease_s), participants (every partition held by one heard within the heartbeat "
        "timeout), commits (one within 2 x (interval_s + write_status_timeout_s)) and routes (no topic that the "
        "routes of several tables match: the leader holds it and reads none of it) and partition logs (no "
        "partition stopped because its log no longer matches the ledger: a topic deleted and created again, "
        "a log that ends before the committed offset). Exit code 0 when no check "
        "failed, 1 otherwise; the failed checks are named.",
        epilog="Examples:\n  chtxn status --config pipeline.toml\n  chtxn status --config pipeline.toml --format tsv\n"
        "  chtxn status --config pipeline.toml --json | jq '{leader, epoch: .leader_epoch, failed}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--rate-commits",
        type=int,
        default=RATE_COMMITS,
        metavar="N",
        help=f"take rows/s over the latest N commits (default {RATE_COMMITS})",
    )
    add_broker_timeout_option(parser)
    add_format_option(parser, rows="one line per source partition (the rest on stderr)")
    parser.set_defaults(func=run)


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
        leaders, standbys, holders = _heartbeats(cfg, consumer, now, timeout_s)
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
        age, head_seq, limit_s=pipeline_health.stall_limit_s(tx.interval_s, tx.write_status_timeout_s)
    )
    if check.status != "fail":
        return check
    lease_s = cfg.coordinator.leader_lease_s
    return pipeline_health.problem_check("commits", every, lease_s=lease_s, retry_s=_retry_s(cfg)) or check


def _retry_s(cfg: PipelineConfig) -> float:
    """How long a coordinator may say nothing while it retries one ClickHouse operation."""
    return retry_budget_s(cfg.coordinator.clickhouse_retries)


def _heartbeats(
    cfg: PipelineConfig, consumer, now: float, timeout_s: float
) -> tuple[dict[str, Heard], dict[str, Heard], dict[TopicPartition, str]]:
    """(leaders, standbys, holders) from the last ``CONTROL_TAIL`` records of the control topic up to its
    end as it was when called: each sender of a LEADER-HEARTBEAT, and each of a STANDBY-HEARTBEAT, with
    the epoch and age (seconds) of its latest one (and whether it said ``leaving``), and the holder of
    each partition heard within the heartbeat timeout.

    Stops at the log end read first (``log_ends``), at a record written after ``now``, or at
    partition EOF, whichever comes first: it never waits for records that keep coming.
    """
    control = (cfg.control_topic, 0)
    try:
        low, _ = consumer.get_watermark_offsets(KafkaTP(*control), timeout=timeout_s)
    except KafkaException as exc:  # no such topic, or no broker
        raise SetupError(
            f"cannot read control topic {cfg.control_topic}: {exc}; run chtxn init --config FILE"
        ) from None
    end = log_ends(consumer, [control], timeout_s)[control]
    leaders: dict[str, Heard] = {}
    standbys: dict[str, Heard] = {}
    holders: dict[TopicPartition, str] = {}
    if end <= low:
        return leaders, standbys, holders
    consumer.assign([KafkaTP(cfg.control_topic, 0, max(low, end - CONTROL_TAIL))])
    now_ms = now * 1000
    done = False
    deadline = time.monotonic() + timeout_s
    try:
        while not done and time.monotonic() < deadline:
            records = consumer.consume(500, 0.05)
            for record in records:
                if record.error() is not None:
                    done = True  # partition EOF
                    continue
                stamp = record.timestamp()[1]
                if record.offset() >= end - 1 or stamp >= now_ms:
                    done = True  # the end as it was when called
                message = codec.decode(record.value())
                if message is None or message.pipeline != cfg.name:
                    continue
                age_s = max(0.0, (now_ms - stamp) / 1000)
                if isinstance(message, LeaderHeartbeat):
                    leaving = bool(getattr(message, "leaving", False))  # leaders older than the field never leave
                    leaders[message.sender] = Heard(epoch=message.epoch, age_s=age_s, leaving=leaving)
                elif isinstance(message, StandbyHeartbeat):
                    standbys[message.sender] = Heard(
                        epoch=message.epoch,
                        age_s=age_s,
                        leaving=message.leaving,
                        problem=message.problem,
                        cause=message.cause,
                    )
                elif isinstance(message, Heartbeat) and age_s <= cfg.heartbeat_timeout_s:
                    for pos in message.partitions:
                        holders[pos.tp] = message.sender
            if not records and not done:
                done = consumer.position([KafkaTP(*control)])[0].offset >= end  # past markers that hold no record
    finally:
        consumer.unassign()
    return leaders, standbys, holders


#: The columns of ``status``'s tables.
PARTITION_COLUMNS = (
    Column("topic", "topic"),
    Column("partition", "partition", right=True),
    Column("committed", "committed", right=True),
    Column("log end", "log_end", right=True),
    Column("lag", "lag", right=True),
    Column("participant", "participant"),
    Column("table", "table"),
)
TABLE_COLUMNS = (
    Column("table", "table"),
    Column("partitions", "partitions", right=True),
    Column("lag", "lag", right=True),
    Column("rows/s", "rows_per_s", right=True),
)
REPLICA_COLUMNS = (
    Column("coordinator", "id"),
    Column("role", "role"),
    Column("epoch", "epoch", right=True),
    Column("last heartbeat", "heard_s", right=True),
)
CHECK_COLUMNS = (
    Column("check", "check"),
    Column("result", "result"),
    Column("found", "found", fold=30),
    Column("what to do", "fix", fold=30),
)
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}
_ROLE_STYLES = {pipeline_health.LEADER: "green", STANDBY: "cyan"}


def run(args: argparse.Namespace) -> int:
    if args.rate_commits < 2:
        raise SetupError(f"--rate-commits {args.rate_commits}: a rate needs at least 2 commits")
    cfg = load_config(args.config, os.environ)
    status = collect(cfg, args.config, rate_commits=args.rate_commits, timeout_s=args.timeout)
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(status)).decode())
        return 0 if status.healthy else 1
    out = Output(args.format)
    verdict = "[green]healthy[/]" if status.healthy else f"[red]failed: {', '.join(status.failed)}[/]"
    out.note(f"pipeline [bold]{escape(status.pipeline)}[/]: {verdict}")
    leader = f"{escape(status.leader)}, epoch {status.leader_epoch}" if status.leader else "[red]none heard[/]"
    out.note(f"leader: {leader}; highest epoch claimed {status.epoch}")
    if status.paused:
        why = f": {escape(status.paused_reason)}" if status.paused_reason else ""
        out.note(f"[yellow]paused[/] by {escape(status.paused_by)}{why} (chtxn resume starts txns again)")
    out.note(f"last commit: {_commit_line(status)}")
    out.note(f"latest txn: {status.last_txn or '-'} {status.last_txn_state}")
    if status.last_abort_reason:
        out.note(f"last abort: {escape(status.last_abort_reason)}")
    if args.format == "tsv":  # stdout holds the partition table alone; the rest is said on stderr
        for r in status.replicas:
            out.note(f"coordinator {escape(r.id)}: {r.role}, {_led(r)}, {_heard(r)}")
        for c in status.checks:
            out.note(f"check {c.name}: {c.status}: {escape(c.found)}" + (f"; {escape(c.fix)}" if c.fix else ""))
    else:
        replicas = Sheet("coordinators (leaders and standbys heartbeat on the control topic)", REPLICA_COLUMNS)
        for r in status.replicas:
            role = Styled(r.role, _ROLE_STYLES.get(r.role, "yellow"))
            replicas.add(r.id, role, str(r.epoch) if r.epoch else "-", _heard(r))
        if status.replicas:
            out.sheet(replicas)
        checks = Sheet("checks", CHECK_COLUMNS)
        for c in status.checks:
            checks.add(c.name, Styled(c.status, _STYLES[c.status]), c.found, c.fix or "-")
        out.sheet(checks)
        if len(status.tables) > 1:  # [[route]]: each table of the pipeline, its partitions only
            tables = Sheet("target tables (this pipeline's partitions and commits)", TABLE_COLUMNS)
            for t in status.tables:
                lag = "-" if t.lag is None else str(t.lag)
                tables.add(t.table, str(t.partitions), lag, "-" if t.rows_per_s is None else f"{t.rows_per_s:g}")
            out.sheet(tables)
    table = Sheet("source partitions", PARTITION_COLUMNS)
    for p in status.partitions:
        table.add(
            p.topic,
            str(p.partition),
            "-" if p.committed is None else str(p.committed),
            str(p.log_end),
            "-" if p.lag is None else str(p.lag),
            p.participant or Styled("none live", "red"),
            p.table,
        )
    out.sheet(table)
    return 0 if status.healthy else 1


def _commit_line(status: Status) -> str:
    if not status.last_commit_seq:
        return "none yet"
    line = f"slot {status.last_commit_seq} ({escape(status.last_commit_txn) or '?'})"
    if status.commit_age_s is not None:
        line += f", {status.commit_age_s:g} s ago"
    if status.rows_per_s is not None:
        line += (
            f"; {status.rows_per_s:,.1f} rows/s over the latest {status.rate_commits} commits "
            f"({status.rate_window_s:g} s)"
        )
    return line


def _led(r: Replica) -> str:
    return f"epoch {r.epoch}" if r.epoch else "never led"


def _heard(r: Replica) -> str:
    return "not in the control topic's tail" if r.heard_s is None else f"{r.heard_s:g} s ago"
