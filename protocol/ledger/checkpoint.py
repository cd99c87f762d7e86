"""Checkpoints and retention of the ledger (``protocol.ledger.rows``): what a CHECKPOINT row holds,
when one may be written, and what expiry may delete.

A checkpoint at slot S holds, per partition ever committed, the end offset of its latest commit
at or before S (``ranges``, start = end = that offset). It is derived from rows read back, never
from what a leader hoped to write, and only for a prefix of the chain that is

- decided: every slot from the previous checkpoint to S was read back with its winner, and the
  slots run without a hole. A claim of such a slot stored later never owns it (the resolution
  rule of ``protocol.ledger.sql``, and ``slot_winner_sql``'s fence once the slot's rows have expired);
- settled: every txn committed at or before S is PUBLISHED or LOST, or is a seal (no stage table).

So the head is the latest checkpoint folded with the commits after it, and every committed but
unpublished txn lies after the latest checkpoint. Two writers of one slot's checkpoint derive the
same offsets; the token ``<pipeline>/checkpoint/<S>`` keeps one row.

Retention: let K be the newest checkpoint written before now - retention. Expiry deletes the
CHECKPOINT rows before K, the COMMITTED and PUBLISHED rows of slots 1..K.commit_seq, and STARTED
and ABORTED rows stored before K. It never deletes K, anything after it, or any EPOCH, INITIAL,
GAP or LOST row (one per leadership, partition, gap or alarm: few). A pipeline stopped for longer
than the retention therefore restarts from the same head: K is the latest checkpoint or older.
Checkpoints go first, so the oldest checkpoint left is always followed by every later slot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from protocol.ledger.rows import SELECT_COLUMNS, LedgerEvent, LedgerRow, PartitionRange, qualified
from protocol.messages import TopicPartition

#: Default number of commit slots between checkpoints.
DEFAULT_EVERY = 1000


def checkpoint_row(
    pipeline: str, seq: int, offsets: Mapping[TopicPartition, int], *, epoch: int, coordinator: str
) -> LedgerRow:
    """The CHECKPOINT row of the head ``(seq, offsets)``."""
    ranges = tuple(
        PartitionRange(topic=tp.topic, partition=tp.partition, start=end, end=end)
        for tp, end in sorted(offsets.items())
    )
    return LedgerRow(
        pipeline=pipeline,
        txn="",
        event=LedgerEvent.CHECKPOINT,
        epoch=epoch,
        commit_seq=seq,
        coordinator=coordinator,
        ranges=ranges,
        reason=f"the head at commit slot {seq}",
    )


def offsets_of(checkpoint: LedgerRow | None) -> dict[TopicPartition, int]:
    return {r.tp: r.end for r in checkpoint.ranges} if checkpoint else {}


def overlay(checkpoint: LedgerRow | None, head_rows: Sequence[Sequence[Any]]) -> tuple[int, dict[TopicPartition, int]]:
    """The head: ``checkpoint`` overlaid with ``head_rows`` (``protocol.ledger.sql.head_sql`` rows of
    the commits after it: topic, partition, end offset, last slot). Returns the last slot and each
    partition's committed end offset."""
    seq = checkpoint.commit_seq if checkpoint else 0
    offsets = offsets_of(checkpoint)
    for topic, partition, end, last in head_rows:
        seq = max(seq, int(last))
        if topic:
            offsets[TopicPartition(topic=str(topic), partition=int(partition))] = int(end)
    return seq, offsets


def settled_through(after: int, slots: Sequence[int], unpublished: Sequence[int]) -> int:
    """The last slot S >= ``after`` such that slots ``after``+1..S all hold a commit (no hole) and
    none of them is unpublished. ``slots``: the slots holding a commit after ``after``, ascending;
    ``unpublished``: the slots of those committed with a stage table and neither PUBLISHED nor LOST."""
    pending = set(unpublished)
    settled = after
    for slot in slots:
        if slot != settled + 1 or slot in pending:
            break
        settled = slot
    return settled


def chain_slots_sql(database: str) -> str:
    """The slots holding a commit after ``{after:UInt64}``, ascending (one small column)."""
    return (
        f"SELECT DISTINCT commit_seq FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMITTED' AND commit_seq > {after:UInt64} ORDER BY commit_seq"
    )


def checkpoints_sql(database: str, *, newest_first: bool) -> str:
    """CHECKPOINT rows of ``{pipeline:String}`` by slot, at most ``{limit:UInt32}``; of two at one
    slot (identical offsets by construction) the first stored."""
    order = "DESC" if newest_first else "ASC"
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'CHECKPOINT' "
        f"ORDER BY commit_seq {order}, event_time ASC, claim_id ASC LIMIT 1 BY commit_seq LIMIT {{limit:UInt32}}"
    )


def checkpoint_times_sql(database: str) -> str:
    """When the ``{limit:UInt32}`` latest checkpoints of ``{pipeline:String}`` were stored (unix ms), newest first."""
    return (
        f"SELECT toUnixTimestamp64Milli(min(event_time)) FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'CHECKPOINT' "
        "GROUP BY commit_seq ORDER BY commit_seq DESC LIMIT {limit:UInt32}"
    )


def expiry_horizon_sql(database: str) -> str:
    """K: the newest checkpoint of ``{pipeline:String}`` stored before ``{before_ms:Int64}`` (unix ms):
    its slot and time (unix ms). No row: nothing may expire."""
    return (
        f"SELECT commit_seq, toUnixTimestamp64Milli(event_time) FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'CHECKPOINT' "
        "AND event_time < fromUnixTimestamp64Milli({before_ms:Int64}) ORDER BY commit_seq DESC LIMIT 1"
    )


def expire_checkpoints_sql(database: str) -> str:
    """Delete the checkpoints before slot ``{through:UInt64}`` (K's slot). Runs before ``expire_rows_sql``."""
    return (
        f"DELETE FROM {qualified(database)} WHERE pipeline = {{pipeline:String}} AND event = 'CHECKPOINT' "
        "AND commit_seq < {through:UInt64}"
    )


def expire_rows_sql(database: str) -> str:
    """Delete the COMMITTED and PUBLISHED rows of slots 1..``{through:UInt64}`` and the STARTED and
    ABORTED rows stored before ``{before_ms:Int64}`` (K's slot and time)."""
    return (
        f"DELETE FROM {qualified(database)} WHERE pipeline = {{pipeline:String}} AND ("
        "(event IN ('COMMITTED', 'PUBLISHED') AND commit_seq BETWEEN 1 AND {through:UInt64}) "
        "OR (event IN ('STARTED', 'ABORTED') AND event_time < fromUnixTimestamp64Milli({before_ms:Int64})))"
    )
