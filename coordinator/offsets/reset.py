"""An offset reset (``chtxn reset``): where each partition goes, and the commit slot that moves it.

Reset steps 1 to 3 run against one ledger head, read first, and all run again when the claim is
lost, so that a reset is ordered with commits, pauses and resumes by the slot it claims:
Reset step 1: the pipeline must be paused by a pause that took a commit slot
(``protocol.ledger.pauses``), so that no txn is reading the partitions while their offsets move.
Reset step 2: each partition's new offset (``--to-offset``, ``--to-time``, ``--to-earliest`` or
``--to-latest``), which must lie within the partition's log, [earliest, end], looked up after the
head was read: a commit the head holds never ends past a look-up of the log end. A by-time answer
is checked against the records' timestamps (``protocol.offsets.search``).
Reset step 3: the claim. The reset's row (``protocol.ledger.resets``) claims slot head + 1 through
the commit point, as a txn's commit does: it takes effect exactly once, at one place of the chain.
A claim lost to a commit, a pause or a resume that landed first starts again from step 1 with the
new head, up to ``CLAIM_TRIES`` times: a resume there refuses the reset, a commit there (the paused
leader's last txn) is moved from, never over.
Reset step 4 (``cli.reset``): a ``Reset`` message, so that the running leader hands over at once and
the take-over starts from the new offsets. Without it, the leader's next claim loses that slot and
it steps down then: the ledger, not the message, makes the reset safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from confluent_kafka import KafkaError, TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from clients import failpoints, kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.ledger import commit_points
from coordinator.ledger.store import LedgerStore
from coordinator.offsets.source import SourceOffsets
from protocol.config.parse import PipelineConfig
from protocol.errors import ChtxnError
from protocol.ledger import pauses as ledger_pauses
from protocol.ledger.resets import reset_row
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.messages import TopicPartition
from protocol.offsets import search as offset_search

#: Claims of a slot a reset makes before giving up (each lost one means a commit landed first).
CLAIM_TRIES = 5
#: How long a broker has to answer each offset lookup.
LOOKUP_TIMEOUT_S = 10.0

log = logging.getLogger(__name__)


class ResetRefused(ChtxnError):
    """The reset may not happen now (the pipeline runs) or is not possible (offset outside the log)."""


class ResetTo(msgspec.Struct, frozen=True, kw_only=True):
    """Where a reset moves its partitions: an offset, the first offset at or after a time (unix
    milliseconds), or the start or the end of the log."""

    to: Literal["offset", "time", "earliest", "latest"]
    value: int = 0

    def describe(self) -> str:
        return f"--to-{self.to}" + (f" {self.value}" if self.to in ("offset", "time") else "")


class ResetDone(msgspec.Struct, frozen=True, kw_only=True):
    """What a reset did: its ledger row (None when every partition was already there)."""

    row: LedgerRow | None
    moves: dict[str, tuple[int, int]]  # "topic/partition" -> (committed offset found, offset set)


def require_paused(ledger: LedgerStore, pipeline: str) -> None:
    """Reset step 1."""
    pause = ledger.pause()
    if pause is None or pause.event is not LedgerEvent.PAUSED:
        raise ResetRefused(
            f"pipeline {pipeline} is not paused: an offset reset moves offsets only while no txn reads them; "
            "run chtxn pause first (and chtxn resume after the reset)"
        )
    if not ledger_pauses.in_chain(pause):
        raise ResetRefused(
            f"pipeline {pipeline} was paused by an older chtxn, whose pause is in no order with commits: "
            "run chtxn pause again, then the reset"
        )


def targets(
    cfg: PipelineConfig, ledger: LedgerStore, partitions: Sequence[TopicPartition], to: ResetTo
) -> dict[TopicPartition, int]:
    """Reset step 2: the new offset of each of ``partitions``, checked against its log."""
    factory = kafka_clients.KafkaClientFactory(cfg)
    source = SourceOffsets(cfg, factory.admin(), ledger, epoch=0, coordinator="chtxn reset")
    known = set(source.partitions())
    if unknown := [tp for tp in partitions if tp not in known]:
        raise ResetRefused(
            f"{', '.join(f'{tp.topic}/{tp.partition}' for tp in unknown)}: not a partition of the pipeline's topics "
            f"({', '.join(cfg.source_topics)}): check --partition"
        )
    low = source.list_offsets(partitions, OffsetSpec.earliest())
    consumer = factory.consumer(**CONSUMER_PROPERTIES, **{"group.id": f"chtxn-reset-{cfg.name}"})
    try:
        late: set[tuple[str, int]] = set()
        ends = log_ends(
            consumer, [(tp.topic, tp.partition) for tp in partitions], timeout_s=LOOKUP_TIMEOUT_S, unconfirmed=late
        )
        if late:  # the listed end is only a lower bound: a reset must not move to it
            raise BrokerUnreachable(
                f"the log end of {', '.join(f'{t}/{p}' for t, p in sorted(late))} was not confirmed within "
                f"{LOOKUP_TIMEOUT_S:g} s (the broker is slow): nothing was changed; run the command again"
            )
        high = {tp: ends[(tp.topic, tp.partition)] for tp in partitions}
        if to.to == "time":
            answers = source.list_offsets(partitions, OffsetSpec.for_timestamp(to.value))
            return {tp: _by_time(consumer, tp, low[tp], high[tp], to.value, answers[tp]) for tp in partitions}
    finally:
        consumer.close()
    if to.to == "earliest":
        return low
    if to.to == "latest":
        return high
    outside = [tp for tp in partitions if not low[tp] <= to.value <= high[tp]]
    if outside:
        raise ResetRefused(
            f"offset {to.value} is outside the log of "
            + ", ".join(f"{tp.topic}/{tp.partition} [{low[tp]}, {high[tp]}]" for tp in outside)
            + ": pick an offset within it, or --to-earliest / --to-latest"
        )
    return {tp: to.value for tp in partitions}


def plan(
    cfg: PipelineConfig, ledger: LedgerStore, partitions: Sequence[TopicPartition], to: ResetTo
) -> tuple[int, dict[TopicPartition, tuple[int, int]]]:
    """Reset steps 1 and 2 against one head: the head's slot, and per partition (committed offset
    found, offset to set). The head is read first, the pause and the log after it."""
    head_seq, head = ledger.head()
    require_paused(ledger, cfg.name)  # Reset step 1
    offsets = targets(cfg, ledger, partitions, to)  # Reset step 2
    initial = ledger.initial_offsets()
    return head_seq, {tp: (head.get(tp, initial.get(tp, offset)), offset) for tp, offset in offsets.items()}


def claim(
    cfg: PipelineConfig,
    ledger: LedgerStore,
    partitions: Sequence[TopicPartition],
    to: ResetTo,
    *,
    who: str,
    reason: str,
) -> ResetDone:
    """Reset steps 1 to 3: the reset's row in the next commit slot, unless every partition is there.
    Refuses (``CommitPointMismatch``) when ``ledger`` claims by another commit point than the
    ledger records."""
    commit_points.ensure(ledger, who)
    for _ in range(CLAIM_TRIES):
        head_seq, found = plan(cfg, ledger, partitions, to)
        moves = {f"{tp.topic}/{tp.partition}": move for tp, move in sorted(found.items())}
        if all(start == end for start, end in found.values()):
            return ResetDone(row=None, moves=moves)
        row = reset_row(
            pipeline=cfg.name,
            commit_seq=head_seq + 1,
            epoch=ledger.max_epoch(),
            who=who,
            moves=found,
            how=to.describe(),
            reason=reason,
            now=time.time(),
        )
        failpoints.hit("reset.before-claim", who)
        if ledger.claim_commit(row):  # Reset step 3
            return ResetDone(row=ledger.commit_at(row.commit_seq) or row, moves=moves)
    raise ResetRefused(
        f"commits kept taking the slot the reset claimed ({CLAIM_TRIES} tries): is the pipeline really paused? "
        "Check chtxn status and run chtxn reset again"
    )


def _by_time(consumer: Any, tp: TopicPartition, low: int, high: int, when_ms: int, answer: int) -> int:
    """The broker's answer to a look-up by time if the records agree with it, else a search of
    their timestamps (``protocol.offsets.search``)."""

    def first_at(offset: int) -> tuple[int, int] | None:
        return _first_record_at(consumer, tp, offset)

    if offset_search.answer_holds(first_at, low, high, when_ms, answer):
        return high if answer < 0 else answer
    found = offset_search.search(first_at, low, high, when_ms)
    log.warning(
        "the broker's offset for a time is not the first record at or after it; searched the log instead",
        extra={"partition": f"{tp.topic}/{tp.partition}", "broker_answer": answer, "offset": found},
    )
    return found


def _first_record_at(consumer: Any, tp: TopicPartition, offset: int) -> tuple[int, int] | None:
    """(offset, timestamp in ms) of the first record at or after ``offset``; None at the log end."""
    consumer.assign([KafkaTP(tp.topic, tp.partition, offset)])
    deadline = time.monotonic() + LOOKUP_TIMEOUT_S
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            if message.error().code() == KafkaError._PARTITION_EOF:
                return None
            raise BrokerUnreachable(f"cannot read {tp.topic}/{tp.partition} at offset {offset}: {message.error()}")
        return message.offset(), message.timestamp()[1]
    raise BrokerUnreachable(
        f"no answer reading {tp.topic}/{tp.partition} at offset {offset} within {LOOKUP_TIMEOUT_S:g} s: "
        "is the broker up?"
    )
