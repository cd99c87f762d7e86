"""What readers make of ledger rows: one summary per txn, and the audit of the commit chain.

Pure functions over ``protocol.ledger.rows.LedgerRow``; ``coordinator.ledger.store`` feeds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from protocol.ledger.resets import is_reset
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange, state_of
from protocol.messages import TopicPartition


class TxnSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One txn as ``chtxn txn list/show`` presents it. Durations are None when not known."""

    txn: str
    state: str  # PUBLISHED, COMMITTED, ABORTED or STARTED
    epoch: int
    commit_seq: int = 0
    coordinator: str = ""
    target: str = ""
    stage_table: str = ""
    ranges: tuple[PartitionRange, ...] = ()
    total_rows: int = 0
    total_bytes: int = 0
    dead_letters: int = 0
    started_at: float = 0.0
    ended_at: float = 0.0
    committed_at: float = 0.0
    published_at: float = 0.0
    aborted_at: float = 0.0
    consume_ms: float | None = None  # START -> END
    commit_ms: float | None = None  # END -> commit point
    publish_ms: float | None = None  # commit point -> published
    total_ms: float | None = None  # START -> published (or aborted, or committed)
    reason: str = ""
    events: tuple[str, ...] = ()
    gaps: tuple[PartitionRange, ...] = ()  # offsets skipped because they were gone


#: Order of events of one txn written within the same millisecond.
_EVENT_ORDER = {
    e: i
    for i, e in enumerate(
        (
            LedgerEvent.EPOCH,
            LedgerEvent.STARTED,
            LedgerEvent.GAP,
            LedgerEvent.ABORTED,
            LedgerEvent.COMMITTED,
            LedgerEvent.LOST,
            LedgerEvent.PUBLISHED,
            LedgerEvent.INITIAL,
            LedgerEvent.CHECKPOINT,
            LedgerEvent.TOPIC,
            LedgerEvent.STOPPED,
        )
    )
}


def _ms(start: float, end: float) -> float | None:
    return round((end - start) * 1000, 1) if start and end and end >= start else None


def summarize(rows: Sequence[LedgerRow]) -> TxnSummary:
    """The summary of one txn from all its rows (any order; at least one row)."""
    if not rows:
        raise ValueError("summarize needs at least one ledger row")
    by_event: dict[LedgerEvent, LedgerRow] = {}
    for row in sorted(rows, key=lambda r: (r.epoch, r.event_time)):
        by_event[row.event] = row  # a duplicated event resolves to the highest epoch
    started = by_event.get(LedgerEvent.STARTED)
    committed = by_event.get(LedgerEvent.COMMITTED)
    published = by_event.get(LedgerEvent.PUBLISHED)
    aborted = by_event.get(LedgerEvent.ABORTED)
    lost = by_event.get(LedgerEvent.LOST)
    main = committed or aborted or started or rows[0]
    if committed:
        ranges = committed.ranges
    elif aborted and aborted.ranges:
        ranges = aborted.ranges
    else:
        ranges = started.ranges if started else ()
    started_at = next(
        (t for t in (started and started.started_at, main.started_at, started and started.event_time) if t), 0.0
    )
    ended_at = max((r.ended_at for r in (committed, aborted, published) if r), default=0.0)
    committed_at = (committed.committed_at or committed.event_time) if committed else 0.0
    published_at = (published.published_at or published.event_time) if published else 0.0
    aborted_at = aborted.event_time if aborted else 0.0
    finished = published_at or aborted_at or committed_at
    events = tuple(r.event.value for r in sorted(rows, key=lambda r: (r.event_time, _EVENT_ORDER[r.event])))
    ended_by = lost or aborted
    return TxnSummary(
        txn=main.txn,
        state=state_of(events),
        epoch=max(r.epoch for r in rows),
        commit_seq=committed.commit_seq if committed else 0,
        coordinator=main.coordinator,
        target=main.target,
        stage_table=main.stage_table,
        ranges=ranges,
        total_rows=main.total_rows,
        total_bytes=main.total_bytes,
        dead_letters=main.dead_letters,
        started_at=started_at,
        ended_at=ended_at,
        committed_at=committed_at,
        published_at=published_at,
        aborted_at=aborted_at,
        consume_ms=_ms(started_at, ended_at),
        commit_ms=_ms(ended_at, committed_at),
        publish_ms=_ms(committed_at, published_at),
        total_ms=_ms(started_at, finished),
        reason=ended_by.reason if ended_by else (committed.reason if committed and is_reset(committed) else ""),
        events=events,
        gaps=tuple(g for r in rows if r.event is LedgerEvent.GAP for g in r.ranges),
    )


def _fmt(tp: TopicPartition) -> str:
    return f"{tp.topic}/{tp.partition}"


def _name(row: LedgerRow) -> str:
    if row.event is LedgerEvent.CHECKPOINT:
        return f"the checkpoint at slot {row.commit_seq}"
    return f"commit {row.commit_seq} (txn {row.txn})"


def audit(
    commits: Sequence[LedgerRow],
    gaps: Sequence[LedgerRow] = (),
    lost: Sequence[LedgerRow] = (),
    *,
    start: LedgerRow | None = None,
    checkpoints: Sequence[LedgerRow] = (),
) -> list[str]:
    """Anomalies of the commit chain, one sentence each; empty when the chain is sound.

    ``commits`` are the resolved COMMITTED rows in slot order (one per slot). Checked: slots
    run 1, 2, 3, ... without holes; per partition, each commit starts where the previous one of
    that partition ended (no overlap: records stored twice; no gap: records never stored) and
    never ends before it starts, except an offset reset's (``protocol.ledger.resets``), which
    moves a partition's offset on purpose, backward or forward. A gap recorded by a GAP row (skipped, ``on_gap = skip``) is
    still reported, with the record of it. Every LOST txn (committed, but its stage table was
    gone at publish) is reported: its rows are not in the target.

    ``start``: the checkpoint the chain is checked from when older slots have expired (None:
    from slot 1); its offsets stand for the commits before it. Each of ``checkpoints`` must
    agree with the chain at its slot.
    """
    recorded: dict[tuple[TopicPartition, int, int], LedgerRow] = {
        (g.tp, g.start, g.end): row for row in gaps for g in row.ranges
    }
    problems: list[str] = []
    expected_seq = start.commit_seq + 1 if start else 1
    last: dict[TopicPartition, tuple[int, LedgerRow]] = {r.tp: (r.end, start) for r in start.ranges} if start else {}
    pending = sorted((c for c in checkpoints if c.commit_seq >= expected_seq), key=lambda c: c.commit_seq)

    def compare_checkpoints(upto: int) -> None:
        while pending and pending[0].commit_seq <= upto:
            checkpoint = pending.pop(0)
            chain = {tp: end for tp, (end, _) in last.items()}
            for tp in sorted(set(chain) | {r.tp for r in checkpoint.ranges}):
                said = next((r.end for r in checkpoint.ranges if r.tp == tp), None)
                if said != chain.get(tp):
                    problems.append(
                        f"{_fmt(tp)}: {_name(checkpoint)} says the committed end is {said}, "
                        f"the chain says {chain.get(tp)}"
                    )

    for commit in commits:
        compare_checkpoints(commit.commit_seq - 1)
        where = _name(commit)
        if commit.commit_seq != expected_seq:
            problems.append(
                f"commit slots {expected_seq}..{commit.commit_seq - 1} are missing before {where}"
                if commit.commit_seq > expected_seq
                else f"{where} repeats or reorders slot {commit.commit_seq}; expected slot {expected_seq}"
            )
        expected_seq = commit.commit_seq + 1
        reset = is_reset(commit)  # moves offsets on purpose: its ranges may go backward or skip
        for r in commit.ranges:
            if r.end < r.start and not reset:
                problems.append(f"{_fmt(r.tp)}: {where} goes backward: end {r.end} < start {r.start}")
            if r.tp in last:
                prev_end, prev = last[r.tp]
                before = _name(prev)
                if r.start < prev_end:
                    problems.append(
                        f"{_fmt(r.tp)}: offsets {r.start}..{prev_end - 1} are committed twice, by {before} and {where}"
                    )
                elif r.start > prev_end:
                    note = recorded.get((r.tp, prev_end, r.start))
                    skipped = (
                        f" (recorded as skipped in txn {note.txn}: {note.reason or 'offsets gone'})" if note else ""
                    )
                    problems.append(
                        f"{_fmt(r.tp)}: offsets {prev_end}..{r.start - 1} were never committed, "
                        f"between {before} and {where}{skipped}"
                    )
            last[r.tp] = (r.end, commit)
    compare_checkpoints(expected_seq - 1)
    for checkpoint in pending:
        problems.append(f"{_name(checkpoint)} is past the last commit, slot {expected_seq - 1}")
    for row in lost:
        problems.append(f"txn {row.txn} (commit {row.commit_seq}) was committed but never published: {row.reason}")
    return problems
