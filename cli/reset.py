"""``chtxn reset``: move partitions' committed offsets while the pipeline is paused.

Reset steps 1-3 are ``coordinator.offsets.reset``'s (paused, the new offsets, the commit slot);
step 4 sends a ``Reset`` message so that the running leader hands over at once and the take-over
starts from the new offsets. Recorded in the ledger with who and why; ``chtxn txn list`` shows it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
from datetime import datetime, timezone

import msgspec

from cli.config_option import add_config_option
from cli.output import Column, Output, Sheet
from clients.clickhouse import make_client
from clients.kafka import KafkaClientFactory
from coordinator.ledger.store import LedgerStore
from coordinator.offsets.reset import ResetTo, claim, plan, require_paused
from coordinator.offsets.source import SourceOffsets
from protocol import codec, topic_patterns
from protocol.config.parse import PipelineConfig, load_config
from protocol.errors import ChtxnError, ConfigError
from protocol.ledger.resets import describe
from protocol.ledger.rows import LedgerRow
from protocol.messages import Reset, TopicPartition

SEND_TIMEOUT_S = 10.0

MOVE_COLUMNS = (
    Column("partition", "partition"),
    Column("committed", "committed", right=True),
    Column("reset to", "reset_to", right=True),
)


class ResetNotSent(ChtxnError):
    """The reset is in the ledger but the control message did not go out."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "reset",
        help="move partitions' committed offsets (rewind or skip) while the pipeline is paused",
        description="Move the committed offsets of source partitions, only while the pipeline is paused "
        "(chtxn pause). The reset takes a commit slot of its own in the ledger, with who and why, so it takes "
        "effect exactly once; the running leader hands over and the next txns start from the new offsets once "
        "the pipeline is resumed. Rewound offsets are read and committed again (chtxn verify --deep expects "
        "them twice); skipped ones are never read.",
        epilog="Examples:\n"
        "  chtxn pause --reason 'replay the last hour'\n"
        "  chtxn reset --partition orders/0 --partition orders/1 --to-time 2026-11-26T07:00:00Z "
        "--reason 'replay the last hour'\n"
        "  chtxn reset --all-partitions --to-latest --dry-run\n"
        "  chtxn resume",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--partition",
        action="append",
        metavar="TOPIC/N",
        help="a partition to reset (repeat for more); N alone when the pipeline reads one topic",
    )
    which.add_argument("--all-partitions", action="store_true", help="every partition of the pipeline's topics")
    to = parser.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-offset", type=int, metavar="N", help="the next offset to read (within the log)")
    to.add_argument(
        "--to-time",
        metavar="TIME",
        help="the first offset whose record is at or after TIME (ISO 8601; UTC unless it says otherwise)",
    )
    to.add_argument("--to-earliest", action="store_true", help="the start of the log")
    to.add_argument("--to-latest", action="store_true", help="the end of the log (skip what is there)")
    parser.add_argument("--reason", default="", help="why, for the ledger")
    parser.add_argument(
        "--by", default="", metavar="WHO", help="who, for the ledger (default <user>@<host> of this shell)"
    )
    parser.add_argument("--dry-run", action="store_true", help="show where each partition would go; change nothing")
    parser.add_argument("--json", action="store_true", help="print what was done as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    to = _reset_to(args)
    ledger = LedgerStore.of(cfg, make_client(cfg.clickhouse))
    require_paused(ledger, cfg.name)  # Reset step 1, early: nothing else is read for a running pipeline
    partitions = _partitions(cfg, args) if not args.all_partitions else None
    factory = KafkaClientFactory(cfg)
    if partitions is None:
        partitions = SourceOffsets(cfg, factory.admin(), ledger, epoch=0, coordinator=who).partitions()
    if args.dry_run:
        found = plan(cfg, ledger, partitions, to)[1]  # Reset steps 1 and 2
        return _report(args, cfg, {f"{tp.topic}/{tp.partition}": m for tp, m in sorted(found.items())}, None, who)
    done = claim(cfg, ledger, partitions, to, who=who, reason=args.reason)  # Reset steps 1 to 3
    if done.row is not None:  # Reset step 4: the running leader hands over at once
        message = Reset(
            pipeline=cfg.name,
            epoch=0,
            txn=done.row.txn,
            sender=who,
            commit_seq=done.row.commit_seq,
            who=who,
            reason=args.reason,
        )
        producer = factory.producer(**{"client.id": "chtxn-reset", "linger.ms": 0})
        producer.produce(cfg.control_topic, key=cfg.name.encode(), value=codec.encode(message))
        if producer.flush(SEND_TIMEOUT_S):
            raise ResetNotSent(
                f"the reset is recorded in the ledger (commit slot {done.row.commit_seq}), but the message to the "
                f"leader did not reach {cfg.kafka.bootstrap_servers} within {SEND_TIMEOUT_S:g} s: the leader steps "
                "down at its next commit and the take-over starts from the new offsets; nothing else to do"
            )
    return _report(args, cfg, done.moves, done.row, who)


def _report(
    args: argparse.Namespace,
    cfg: PipelineConfig,
    moves: dict[str, tuple[int, int]],
    row: LedgerRow | None,
    who: str,
) -> int:
    slot = row.commit_seq if row is not None else None
    if args.json:
        print(
            msgspec.json.encode(
                {
                    "pipeline": cfg.name,
                    "dry_run": args.dry_run,
                    "commit_seq": slot,
                    "by": who,
                    "reason": args.reason,
                    "partitions": [{"partition": k, "committed": a, "reset_to": b} for k, (a, b) in moves.items()],
                }
            ).decode()
        )
        return 0
    out = Output("table")
    sheet = Sheet(
        f"offset reset of pipeline {cfg.name}" + (" (dry run: nothing changed)" if args.dry_run else ""), MOVE_COLUMNS
    )
    for name, (found, offset) in moves.items():
        sheet.add(name, str(found), str(offset))
    out.sheet(sheet)
    if row is not None:
        out.note(describe(row) + "; the next txns start from there once you run chtxn resume")
    elif not args.dry_run:
        out.note("every partition is already there: nothing recorded")
    return 0


def _reset_to(args: argparse.Namespace) -> ResetTo:
    if args.to_offset is not None:
        if args.to_offset < 0:
            raise ConfigError(f"--to-offset {args.to_offset}: an offset is 0 or more", key="--to-offset")
        return ResetTo(to="offset", value=args.to_offset)
    if args.to_time is not None:
        try:
            when = datetime.fromisoformat(args.to_time)
        except ValueError:
            raise ConfigError(
                f"--to-time {args.to_time!r} is not an ISO 8601 time: write e.g. 2026-11-26T07:00:00Z",
                key="--to-time",
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return ResetTo(to="time", value=int(when.timestamp() * 1000))
    return ResetTo(to="earliest" if args.to_earliest else "latest")


def _partitions(cfg: PipelineConfig, args: argparse.Namespace) -> list[TopicPartition]:
    picked = []
    for spec in args.partition:
        topic, slash, number = spec.rpartition("/")
        if not slash:
            if len(cfg.source_topics) != 1 or topic_patterns.is_pattern(cfg.source_topics[0]):
                raise ConfigError(
                    f"--partition {spec}: the pipeline reads more than one topic; write TOPIC/N",
                    key="--partition",
                )
            topic = cfg.source_topics[0]
        if not number.isdigit():
            raise ConfigError(f"--partition {spec}: write TOPIC/N, e.g. orders/0", key="--partition")
        picked.append(TopicPartition(topic=topic, partition=int(number)))
    return sorted(set(picked))
