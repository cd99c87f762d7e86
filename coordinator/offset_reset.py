"""An offset reset (``chtxn reset``): where each partition goes, and the commit slot that moves it.

Reset step 1: the pipeline must be paused (the ledger's latest PAUSED / RESUMED row), so that no
txn is reading the partitions while their offsets move.
Reset step 2: each partition's new offset (``--to-offset``, ``--to-time``, ``--to-earliest`` or
``--to-latest``), which must lie within the partition's log, [earliest, end].
Reset step 3: the claim. The ledger head is read and the reset's row (``protocol.ledger_resets``)
claims slot head + 1 through the commit point, as a txn's commit does: it takes effect exactly
once, at one place of the chain. A claim lost to a commit that landed first (the paused leader's
last txn) reads the head again, up to ``CLAIM_TRIES`` times.
Reset step 4 (``cli.reset``): a ``Reset`` message, so that the running leader hands over at once and
the take-over starts from the new offsets. Without it, the leader's next claim loses that slot and
it steps down then: the ledger, not the message, makes the reset safe.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Literal

import msgspec
from confluent_kafka.admin import OffsetSpec

from clients import failpoints, kafka as kafka_clients
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.ledger_store import LedgerStore
from coordinator.source_offsets import SourceOffsets
from protocol.config import PipelineConfig
from protocol.errors import ChtxnError
from protocol.ledger import LedgerEvent, LedgerRow
from protocol.ledger_resets import reset_row
from protocol.messages import TopicPartition

#: Claims of a slot a reset makes before giving up (each lost one means a commit landed first).
CLAIM_TRIES = 5
#: How long a broker has to answer each offset lookup.
LOOKUP_TIMEOUT_S = 10.0


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
        ends = log_ends(consumer, [(tp.topic, tp.partition) for tp in partitions], timeout_s=LOOKUP_TIMEOUT_S)
    finally:
        consumer.close()
    high = {tp: ends[(tp.topic, tp.partition)] for tp in partitions}
    if to.to == "earliest":
        return low
    if to.to == "latest":
        return high
    if to.to == "time":
        found = source.list_offsets(partitions, OffsetSpec.for_timestamp(to.value))
        return {tp: high[tp] if found[tp] < 0 else found[tp] for tp in partitions}  # -1: no record that late
    outside = [tp for tp in partitions if not low[tp] <= to.value <= high[tp]]
    if outside:
        raise ResetRefused(
            f"offset {to.value} is outside the log of "
            + ", ".join(f"{tp.topic}/{tp.partition} [{low[tp]}, {high[tp]}]" for tp in outside)
            + ": pick an offset within it, or --to-earliest / --to-latest"
        )
    return {tp: to.value for tp in partitions}


def claim(
    cfg: PipelineConfig,
    ledger: LedgerStore,
    offsets: dict[TopicPartition, int],
    to: ResetTo,
    *,
    who: str,
    reason: str,
) -> ResetDone:
    """Reset step 3: the reset's row in the next commit slot, unless every partition is there."""
    for _ in range(CLAIM_TRIES):
        head_seq, head = ledger.head()
        initial = ledger.initial_offsets()
        found = {tp: head.get(tp, initial.get(tp, offset)) for tp, offset in offsets.items()}
        moves = {f"{tp.topic}/{tp.partition}": (found[tp], offsets[tp]) for tp in sorted(offsets)}
        if all(found[tp] == offsets[tp] for tp in offsets):
            return ResetDone(row=None, moves=moves)
        row = reset_row(
            pipeline=cfg.name,
            commit_seq=head_seq + 1,
            epoch=ledger.max_epoch(),
            who=who,
            moves={tp: (found[tp], offsets[tp]) for tp in offsets},
            how=to.describe(),
            reason=reason,
            now=time.time(),
        )
        failpoints.hit("reset.before-claim", who)
        if ledger.claim_commit(row):
            return ResetDone(row=ledger.commit_at(row.commit_seq) or row, moves=moves)
    raise ResetRefused(
        f"commits kept taking the slot the reset claimed ({CLAIM_TRIES} tries): is the pipeline really paused? "
        "Check chtxn status and run chtxn reset again"
    )
