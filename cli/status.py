"""``chtxn status``: the pipeline at a glance — leader, last commit, participants, lag."""

from __future__ import annotations

import argparse
import os
import time

import msgspec
from confluent_kafka import TopicPartition as KafkaTP
from rich.markup import escape

from cli.config_option import add_config_option
from cli.output import Column, Output, Sheet, Styled, add_format_option
from cli.txn import _missing_ledger, open_ledger
from clients import kafka as kafka_clients
from protocol import codec, naming
from protocol.config import PipelineConfig, load_config
from protocol.errors import ClickHouseError
from protocol.messages import Heartbeat, LeaderHeartbeat, TopicPartition

#: How far back the control topic is read for heartbeats.
CONTROL_TAIL = 2_000


class PartitionStatus(msgspec.Struct, frozen=True, kw_only=True):
    topic: str
    partition: int
    committed: int | None  # next offset to read after the last commit; None: never committed
    log_end: int
    lag: int | None
    participant: str  # "" when no live participant holds it


class Status(msgspec.Struct, frozen=True, kw_only=True):
    pipeline: str
    leader: str  # "" when no leader was heard from within the lease
    epoch: int
    last_commit_seq: int
    last_txn: str
    last_txn_state: str
    last_abort_reason: str
    partitions: tuple[PartitionStatus, ...]
    healthy: bool


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the pipeline at a glance: leader, last commit, participants, lag",
        description="Reads the ledger (epoch, last commit), the tail of the control topic (the leader's and the "
        "participants' heartbeats) and the source partitions' ends. Exit code 0 when a leader and a live "
        "participant for every partition were heard from, 1 otherwise.",
        epilog="Examples:\n  chtxn status --config pipeline.toml\n  chtxn status --config pipeline.toml --format tsv\n"
        "  chtxn status --config pipeline.toml --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    add_format_option(parser, rows="one line per source partition (the rest on stderr)")
    parser.set_defaults(func=run)


def collect(cfg: PipelineConfig, config_path: str) -> Status:
    ledger = open_ledger(cfg)
    try:
        head_seq, head = ledger.head()
        epoch = ledger.max_epoch()
        latest = ledger.history(limit=1)
        aborted = ledger.last_abort()
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, config_path) from None
    leader, holders = _heartbeats(cfg)
    consumer = kafka_clients.KafkaClientFactory(cfg).consumer(**{"group.id": naming.status_group(cfg.name)})
    try:
        partitions = kafka_clients.partitions_of(consumer, cfg.pipeline.topics, bootstrap=cfg.kafka.bootstrap_servers)
        rows = []
        for tp in partitions:
            _, high = consumer.get_watermark_offsets(KafkaTP(tp.topic, tp.partition), timeout=10)
            committed = head.get(tp)
            rows.append(
                PartitionStatus(
                    topic=tp.topic,
                    partition=tp.partition,
                    committed=committed,
                    log_end=high,
                    lag=max(0, high - committed) if committed is not None else None,
                    participant=holders.get(tp, ""),
                )
            )
    finally:
        consumer.close()
    return Status(
        pipeline=cfg.name,
        leader=leader,
        epoch=epoch,
        last_commit_seq=head_seq,
        last_txn=latest[0].txn if latest else "",
        last_txn_state=latest[0].state if latest else "",
        last_abort_reason=aborted.reason if aborted else "",
        partitions=tuple(rows),
        healthy=bool(leader) and all(r.participant for r in rows),
    )


def _heartbeats(cfg: PipelineConfig) -> tuple[str, dict[TopicPartition, str]]:
    """The leader and the holder of each partition heard within their timeouts, from the control topic.

    Reads the last ``CONTROL_TAIL`` records up to the end as it was when called: it stops at the
    high watermark sampled first, at a record written after the call, or at the partition's end,
    whichever comes first. It never waits for an end-of-partition event, which a broker whose high
    watermark trails the log (Tansu) never sends while heartbeats keep coming.
    """
    consumer = kafka_clients.KafkaClientFactory(cfg).consumer(
        **{"group.id": naming.status_group(cfg.name), "enable.partition.eof": True}
    )
    try:
        kafka_clients.cluster_metadata(consumer, kafka_clients.DEFAULT_TIMEOUT_S, cfg.kafka.bootstrap_servers)
        control = KafkaTP(cfg.control_topic, 0)
        low, high = consumer.get_watermark_offsets(control, timeout=10)
        leader = ""
        holders: dict[TopicPartition, str] = {}
        if high <= low:
            return leader, holders
        consumer.assign([KafkaTP(cfg.control_topic, 0, max(low, high - CONTROL_TAIL))])
        now_ms = time.time() * 1000
        done = False
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            records = consumer.consume(500, 0.05)
            for record in records:
                if record.error() is not None:
                    done = True  # partition EOF
                    continue
                if record.offset() >= high - 1 or record.timestamp()[1] >= now_ms:  # type: ignore[operator]  # None only on an error record
                    done = True  # the end as it was when called
                message = codec.decode(record.value())
                age_s = (now_ms - record.timestamp()[1]) / 1000
                if isinstance(message, LeaderHeartbeat) and age_s <= cfg.coordinator.leader_lease_s:
                    leader = f"{message.sender} (epoch {message.epoch})"
                elif isinstance(message, Heartbeat) and age_s <= cfg.heartbeat_timeout_s:
                    for pos in message.partitions:
                        holders[pos.tp] = message.sender
            if not records and not done:
                done = consumer.position([control])[0].offset >= high  # past markers that hold no record
        return leader, holders
    finally:
        consumer.close()


#: The columns of ``status``'s partition table.
PARTITION_COLUMNS = (
    Column("topic", "topic"),
    Column("partition", "partition", right=True),
    Column("committed", "committed", right=True),
    Column("log end", "log_end", right=True),
    Column("lag", "lag", right=True),
    Column("participant", "participant"),
)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    status = collect(cfg, args.config)
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(status)).decode())
        return 0 if status.healthy else 1
    out = Output(args.format)
    out.note(
        f"pipeline [bold]{escape(status.pipeline)}[/]: leader {escape(status.leader) or '[red]none heard[/]'}; "
        f"highest epoch {status.epoch}; last commit slot {status.last_commit_seq}; "
        f"latest txn {status.last_txn or '-'} {status.last_txn_state}"
    )
    if status.last_abort_reason:
        out.note(f"last abort: {escape(status.last_abort_reason)}")
    table = Sheet("source partitions", PARTITION_COLUMNS)
    for p in status.partitions:
        table.add(
            p.topic,
            str(p.partition),
            "-" if p.committed is None else str(p.committed),
            str(p.log_end),
            "-" if p.lag is None else str(p.lag),
            p.participant or Styled("none live", "red"),
        )
    out.sheet(table)
    return 0 if status.healthy else 1
