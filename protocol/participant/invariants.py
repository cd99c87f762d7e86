"""The invariants of ``ParticipantState``, checked after every event of the pure tests (``check``). Pure.

What the participant's module docstring promises, as facts about its state between two events:

- A partition reads into the txn of the latest START only while that START is open (neither
  ended nor dropped), and an open START is not among the ended txns awaiting ACK-COMMIT.
- Ended txns of a partition wait for their chunks oldest first, and the txn read now is newer than
  all of them, so WRITE-STATUS of one partition go out in txn order.
- A stint's status matches what it holds: STAGING without errors, FAILED with one, ENDING only
  once ended; chunks in flight are chunks it cut; it read from its START offset on (so the end
  offset a WRITE-STATUS reports is at or after the start), and a partition staging is positioned
  at its next offset.
- Reports of the size trigger never run ahead of the rows read, and none is left pending after
  an event; at most ``MAX_UNACKED`` ended txns are remembered, none of an epoch above the highest
  seen.

Checking is O(partitions x txns): meant for tests (after every event), not the hot path.
"""

from __future__ import annotations

from itertools import pairwise

from protocol import naming, size_trigger
from protocol.errors import InvalidTransition
from protocol.participant.state import MAX_UNACKED, ParticipantState
from protocol.participant.stint import Partition, Status, Stint


def check(state: ParticipantState) -> None:
    """Raise ``InvalidTransition`` naming the first invariant ``state`` breaks."""
    if state.current_open and (not state.current or state.current in state.unacked):
        raise _broken(state.current, "an open START not yet ended", "it among the ended txns")
    if len(state.unacked) > MAX_UNACKED:
        raise _broken("", f"at most {MAX_UNACKED} ended txns awaiting ACK-COMMIT", f"{len(state.unacked)}")
    if any(epoch > state.epoch for epoch in state.unacked.values()) or state.current_epoch > state.epoch:
        raise _broken(
            state.current,
            f"no txn of an epoch above the highest seen ({state.epoch})",
            f"epochs {sorted(set(state.unacked.values()) | {state.current_epoch})}",
        )
    if state.partitions.report_now:
        raise _broken(state.current, "no size-trigger report left pending after an event", "one pending")
    for key, p in state.parts.items():
        if key != (p.tp.topic, p.tp.partition):
            raise _broken("", f"partition {key} kept under its own name", f"{p.tp}")
        _check_partition(state, p)


def _broken(txn: str, expected: str, found: str, p: Partition | None = None) -> InvalidTransition:
    where = f", {p.tp.topic}-{p.tp.partition}" if p is not None else ""
    return InvalidTransition(f"participant, txn {txn or '-'}{where}: expected {expected}, found {found}")


def _check_partition(state: ParticipantState, p: Partition) -> None:
    stint = p.open
    if stint is not None:
        if not state.current_open or stint.txn != state.current or stint.epoch != state.current_epoch:
            raise _broken(
                stint.txn,
                f"reading only into the open START ({state.current or 'none'}, "
                f"{'open' if state.current_open else 'not open'})",
                f"{stint.txn} of epoch {stint.epoch}",
                p,
            )
        if stint.status is Status.ENDING:
            raise _broken(stint.txn, "the txn read now staging or failed", "it ending", p)
        if stint.status is Status.STAGING and p.position != stint.builder.next_offset:
            raise _broken(
                stint.txn,
                f"the partition positioned at the next offset {stint.builder.next_offset}",
                f"{p.position}",
                p,
            )
    for ended in p.ending:
        if ended.status is not Status.ENDING:
            raise _broken(ended.txn, "an ended txn ending", ended.status.value, p)
    order = [*p.ending, *([stint] if stint is not None else [])]
    for older, newer in pairwise(order):
        if _rank(newer) <= _rank(older):
            raise _broken(
                newer.txn, f"txns of a partition in START order, after {older.txn}", f"{[s.txn for s in order]}", p
            )
    for s in order:
        _check_stint(s, p)


def _rank(stint: Stint) -> tuple[int, int]:
    epoch, seq = naming.parse_txn_id(stint.txn)
    return epoch, seq


def _check_stint(stint: Stint, p: Partition) -> None:
    b = stint.builder
    if (b.txn, b.topic, b.partition) != (stint.txn, p.tp.topic, p.tp.partition):
        raise _broken(stint.txn, "chunks cut for this txn and partition", f"{b.txn}, {b.topic}-{b.partition}", p)
    if b.next_offset < stint.start_offset:
        raise _broken(
            stint.txn, f"reading from the START offset {stint.start_offset} on", f"next offset {b.next_offset}", p
        )
    if any(not 0 <= n < b.chunks_cut for n in stint.pending):
        raise _broken(stint.txn, f"chunks in flight among the {b.chunks_cut} cut", f"{sorted(stint.pending)}", p)
    if (stint.status is Status.STAGING and stint.errors) or (stint.status is Status.FAILED and not stint.errors):
        raise _broken(stint.txn, "errors exactly when failed", f"{stint.status.value} with {stint.errors}", p)
    if stint.share and (
        stint.reported_share > b.rows_read // stint.share
        or (stint.reported_full and b.rows_read < size_trigger.full_rows(stint.share))
    ):
        raise _broken(
            stint.txn,
            f"size-trigger reports within the {b.rows_read} rows read",
            f"{stint.reported_share} shares, full {stint.reported_full}",
            p,
        )
