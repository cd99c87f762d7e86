"""Pauses and resumes (``chtxn pause`` / ``resume``) as facts of the commit chain.

A pause or a resume claims the next commit slot through the commit point, as a txn's commit and
an offset reset do: a COMMITTED row of no ranges and no stage table, txn ``pause_s<slot>`` or
``resume_s<slot>`` (``protocol.naming``). So pauses, resumes, resets and commits are one order,
the chain's: a reset that read "paused" at slot h and claims h + 1 either lands before any resume
(the slot is its) or loses the slot to it, reads the chain again and is refused. A marker moves no
offset, so a leader whose claim lost to one claims the next slot (``moves_nothing``).

After its marker, ``chtxn pause`` appends a PAUSED (or RESUMED) row carrying the marker's slot: the
history of who paused and why, which ledger retention never deletes, while the marker may expire
with the COMMITTED rows of old slots. ``latest`` reads both: the one of the highest slot says
whether the pipeline is paused. A PAUSED / RESUMED row of an older chtxn has slot 0 and is in no
order with commits: it counts only where no marker is retained, and a reset refuses it.
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol import naming
from protocol.ledger.rows import LedgerEvent, LedgerRow


def marker_row(
    *, pipeline: str, commit_seq: int, epoch: int, paused: bool, who: str, reason: str, now: float
) -> LedgerRow:
    """The COMMITTED row of a pause (``paused``) or a resume claiming slot ``commit_seq``."""
    return LedgerRow(
        pipeline=pipeline,
        txn=naming.pause_txn(commit_seq, paused=paused),
        event=LedgerEvent.COMMITTED,
        epoch=epoch,
        commit_seq=commit_seq,
        coordinator=who,
        started_at=now,
        committed_at=now,
        reason=reason,
    )


def is_marker(row: LedgerRow) -> bool:
    return row.event is LedgerEvent.COMMITTED and naming.is_pause_txn(row.txn)


def moves_nothing(row: LedgerRow | None) -> bool:
    """A commit a leader may claim past: a pause's or a resume's marker (no ranges, no stage table)."""
    return row is not None and is_marker(row) and not row.ranges and not row.stage_table


def history_row(marker: LedgerRow) -> LedgerRow:
    """The PAUSED / RESUMED row recorded after ``marker`` won its slot (same slot, who, why and time)."""
    paused = marker.txn.startswith(naming.PAUSE_PREFIX)
    return LedgerRow(
        pipeline=marker.pipeline,
        txn="",
        event=LedgerEvent.PAUSED if paused else LedgerEvent.RESUMED,
        epoch=0,
        commit_seq=marker.commit_seq,
        coordinator=marker.coordinator,
        reason=marker.reason,
        started_at=marker.started_at,
    )


def latest(rows: Iterable[LedgerRow]) -> LedgerRow | None:
    """Of PAUSED / RESUMED rows and winning markers, the one that decides whether the pipeline is
    paused, as a PAUSED or RESUMED row: the highest slot first, then the latest asked."""
    decided = [history_row(r) if is_marker(r) else r for r in rows]
    return max(decided, key=lambda r: (r.commit_seq, r.started_at), default=None)


def in_chain(pause: LedgerRow | None) -> bool:
    """``pause`` (from ``latest``) is a pause that took a commit slot: a reset may rely on it."""
    return pause is not None and pause.event is LedgerEvent.PAUSED and pause.commit_seq > 0
