"""Offset resets (``chtxn reset``): a commit of no rows that moves partitions' committed offsets.

A reset is a COMMITTED row of its own in the commit chain (docs/architecture.md §5): it claims the
next commit slot through the commit point, exactly as a txn's commit does, so it takes effect
exactly once and in one place of the chain. Its txn is ``reset_s<slot>`` (``protocol.naming``), it
has no stage table (nothing to publish, as a seal), and each of its ranges is ``[from, to)`` of one
partition: ``from`` the committed offset it found, ``to`` the one it sets (``to < from`` rewinds).
The ranges hold no rows: readers of committed data skip them (``chtxn verify --deep``) and the
chain's audit accepts their jump. Its ``coordinator`` is who asked and its ``reason`` says how and why.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocol import naming
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.messages import TopicPartition


def is_reset(row: LedgerRow) -> bool:
    return row.event is LedgerEvent.COMMITTED and naming.is_reset_txn(row.txn)


def reset_row(
    *,
    pipeline: str,
    commit_seq: int,
    epoch: int,
    who: str,
    moves: Mapping[TopicPartition, tuple[int, int]],
    how: str,
    reason: str,
    now: float,
) -> LedgerRow:
    """The COMMITTED row of a reset in slot ``commit_seq``: ``moves`` maps a partition to its
    (committed offset found, offset set); ``how`` is the request (``--to-offset 100``)."""
    ranges = tuple(
        PartitionRange(topic=tp.topic, partition=tp.partition, start=start, end=end)
        for tp, (start, end) in sorted(moves.items())
    )
    return LedgerRow(
        pipeline=pipeline,
        txn=naming.reset_txn(commit_seq),
        event=LedgerEvent.COMMITTED,
        epoch=epoch,
        commit_seq=commit_seq,
        coordinator=who,
        ranges=ranges,
        started_at=now,
        committed_at=now,
        reason=f"offset reset {how}" + (f": {reason}" if reason else ""),
    )


def describe(row: LedgerRow) -> str:
    """One line for people: what the reset moved, by whom and why."""
    moved = ", ".join(f"{r.topic}/{r.partition} {r.start} -> {r.end}" for r in row.ranges)
    return f"{row.reason} by {row.coordinator} in commit slot {row.commit_seq}: {moved}"
