"""Whether each source partition's log is still the log the ledger's offsets were taken from. Pure.

The ledger records, per partition, the identity of the log its offsets count in (a ``TOPIC`` row):
Kafka's topic ID where the broker has one (the embedded broker has), and the log's start and end
as seen when recorded. A partition whose log no longer matches is **stopped**: a ``STOPPED`` row,
written once, after which no txn reads the partition until the operator decides with
``chtxn reset`` (docs/architecture.md §9). A partition's log no longer matches when

- its topic's ID changed: the topic was deleted and created again;
- its committed offset (or recorded initial offset) is past the log end: the topic was re-created
  with fewer records, or the broker lost its log;
- without topic IDs, its log start moved back below the start recorded: the log was replaced.

An offset below the log start is not a mismatch: that is a gap (retention), decided by
``pipeline.on_gap`` as before.

**Rows** (no ``txn``: they belong to no txn). ``TOPIC``: ``claim_id`` the topic ID ("" where the
broker has none), ``commit_seq`` the slot
from which the identity holds, one range per partition accepted (``start`` the log start, ``end``
the log end as seen), ``reason`` why it was recorded. A topic is recorded the first time the
pipeline sees it, and again for the partitions an offset reset moved after the last record (the
operator accepted the log the reset was checked against). ``STOPPED``: one range (``start`` the
offset the ledger holds, ``end`` the log end seen), ``commit_seq`` the head slot when found,
``claim_id`` the topic ID seen, ``reason`` what no longer matches. A stop holds until a ``TOPIC`` row
of a later slot names the partition (recorded after a reset). Both kinds are never expired.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from protocol.checks import Check
from protocol.ledger.rows import SELECT_COLUMNS, LedgerEvent, LedgerRow, PartitionRange, qualified
from protocol.messages import TopicPartition

#: The topic ID a broker without topic IDs answers with (Kafka's ``Uuid.ZERO_UUID`` in base64).
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


@dataclass(frozen=True)
class Seen:
    """A partition's log as the broker shows it now: its topic's ID ("" when none), start and end."""

    topic_id: str
    low: int
    high: int


@dataclass(frozen=True)
class Accepted:
    """The identity the ledger holds for a partition's log: from ``slot`` on."""

    topic_id: str
    low: int
    high: int
    slot: int


@dataclass(frozen=True)
class Stop:
    """A stopped partition: found at head ``slot``, holding ``offset``, because of ``reason``."""

    tp: TopicPartition
    offset: int
    slot: int
    reason: str

    def message(self) -> str:
        """What is wrong and what to do, for logs, ``chtxn status`` and ``chtxn doctor``."""
        return f"{self.tp.topic}/{self.tp.partition} is stopped: {self.reason}; {fix(self.tp)}"


def fix(tp: TopicPartition) -> str:
    """What the operator runs to decide where a stopped partition goes on from."""
    where = f"{tp.topic}/{tp.partition}"
    return (
        f"no txn reads it until you decide where it goes on from in the log it has now: chtxn pause, then "
        f"chtxn reset --partition {where} --to-earliest (read the new log whole) or --to-latest (skip it) "
        f"or --to-offset N, then chtxn resume (docs/troubleshooting.md, a stopped partition)"
    )


def topic_id(raw: str) -> str:
    """A broker's topic ID as the ledger keeps it: "" where the broker has none."""
    return "" if raw in ("", NO_TOPIC_ID) else raw


def mismatches(offset: int, seen: Seen, accepted: Accepted | None) -> list[str]:
    """Why the log ``seen`` is not the one ``offset`` (the partition's committed or initial offset)
    and ``accepted`` were taken from; empty when it may be."""
    why = []
    if accepted is not None and accepted.topic_id and seen.topic_id and accepted.topic_id != seen.topic_id:
        why.append(
            f"its topic was deleted and created again (topic ID {accepted.topic_id} when its offsets were "
            f"recorded, {seen.topic_id} now)"
        )
    if offset > seen.high:
        why.append(
            f"the ledger's offset {offset} is past the log end {seen.high} (the topic was re-created or the "
            "broker lost its log)"
        )
    if accepted is not None and not (accepted.topic_id and seen.topic_id) and seen.low < accepted.low:
        why.append(f"its log start moved back from {accepted.low} to {seen.low} (the log was replaced)")
    return why


def accepted_of(rows: Iterable[LedgerRow]) -> dict[TopicPartition, Accepted]:
    """Per partition, the identity of the latest ``TOPIC`` row naming it (highest slot, then newest)."""
    found: dict[TopicPartition, Accepted] = {}
    for row in sorted(rows, key=lambda r: (r.commit_seq, r.event_time)):
        if row.event is LedgerEvent.TOPIC:
            for g in row.ranges:
                found[g.tp] = Accepted(topic_id=row.claim_id, low=g.start, high=g.end, slot=row.commit_seq)
    return found


def stops_of(rows: Iterable[LedgerRow]) -> dict[TopicPartition, Stop]:
    """The partitions stopped now: a ``STOPPED`` row that no ``TOPIC`` row of a later slot lifts; of
    several, the first since the partition's log was last accepted (a partition stopped, reset and
    stopped again is stopped)."""
    rows = list(rows)
    accepted = accepted_of(rows)
    stops: dict[TopicPartition, Stop] = {}
    for row in sorted(rows, key=lambda r: (r.commit_seq, r.event_time)):
        if row.event is LedgerEvent.STOPPED:
            for g in row.ranges:
                if g.tp not in accepted or accepted[g.tp].slot <= row.commit_seq:
                    stops.setdefault(g.tp, Stop(tp=g.tp, offset=g.start, slot=row.commit_seq, reason=row.reason))
    return stops


def identity_row(
    *, pipeline: str, topic: str, seen: Mapping[int, Seen], slot: int, epoch: int, coordinator: str, reason: str
) -> LedgerRow:
    """The ``TOPIC`` row accepting the logs ``seen`` (partition -> log) of ``topic`` from ``slot`` on."""
    ids = {s.topic_id for s in seen.values()}
    return LedgerRow(
        pipeline=pipeline,
        txn="",
        claim_id=ids.pop() if len(ids) == 1 else "",
        event=LedgerEvent.TOPIC,
        epoch=epoch,
        commit_seq=slot,
        coordinator=coordinator,
        ranges=tuple(
            PartitionRange(topic=topic, partition=p, start=s.low, end=s.high) for p, s in sorted(seen.items())
        ),
        reason=reason,
    )


def stop_row(*, pipeline: str, stop: Stop, seen: Seen, epoch: int, coordinator: str) -> LedgerRow:
    """The ``STOPPED`` row of ``stop``."""
    tp = stop.tp
    return LedgerRow(
        pipeline=pipeline,
        txn="",
        claim_id=seen.topic_id,
        event=LedgerEvent.STOPPED,
        epoch=epoch,
        commit_seq=stop.slot,
        coordinator=coordinator,
        ranges=(PartitionRange(topic=tp.topic, partition=tp.partition, start=stop.offset, end=seen.high),),
        reason=stop.reason,
    )


def token(pipeline: str, row: LedgerRow) -> str:
    """The deduplication token of a ``TOPIC`` or ``STOPPED`` row: two leaders recording the same
    thing at the same slot store one row."""
    parts = ",".join(f"{g.topic}/{g.partition}" for g in row.ranges)
    return f"{pipeline}/{row.event.value.lower()}/{row.commit_seq}/{zlib.crc32(parts.encode()):08x}/{row.claim_id}"


def rows_sql(database: str) -> str:
    """Every ``TOPIC`` and ``STOPPED`` row of ``{pipeline:String}`` (a few per topic)."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event IN ('TOPIC', 'STOPPED') ORDER BY commit_seq, event_time"
    )


def resets_sql(database: str) -> str:
    """The offset resets (``protocol.ledger.resets``) of ``{pipeline:String}`` in slots after ``{after:UInt64}``."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMITTED' AND commit_seq > {after:UInt64} "
        "AND startsWith(txn, 'reset_') ORDER BY commit_seq ASC, event_time ASC, claim_id ASC LIMIT 1 BY commit_seq"
    )


def stops_check(stops: Mapping[TopicPartition, Stop]) -> Check:
    """``chtxn status`` and ``chtxn doctor``: fail while a partition is stopped, naming each and the fix."""
    if not stops:
        return Check(name="partition logs", status="ok", found="every partition's log matches the ledger")
    named = "; ".join(f"{tp.topic}/{tp.partition}: {s.reason}" for tp, s in sorted(stops.items()))
    first = min(stops)
    return Check(
        name="partition logs",
        status="fail",
        found=f"{len(stops)} partition{'' if len(stops) == 1 else 's'} stopped, not read (the other partitions "
        f"flow): {named}",
        fix=fix(first)
        if len(stops) == 1
        else fix(first).replace(
            f"--partition {first.topic}/{first.partition}", "--partition TOPIC/N (each stopped one)"
        ),
    )
