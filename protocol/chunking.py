"""Chunking rules and chunk bodies: pure, so the same offsets always give the same chunks.

Rules (the deduplication of retried inserts depends on them; see docs/architecture.md §4):

1. Chunks of one partition in one txn are numbered from 0; chunk ``n`` has the token
   ``naming.chunk_token(pipeline, txn, topic, partition, n, first, next)`` (its offset range binds
   the token to its content).
2. A chunk ends after ``chunk_rows`` records, or before the record that would take its payload
   past ``chunk_bytes`` (a record larger than ``chunk_bytes`` forms a chunk of its own), or before
   the record that would start its ``MAX_RUNS + 1``-th run of consecutive offsets (the runs travel
   as query parameters of its insert: ``protocol.framing``). Payload
   bytes are ``len(value)``; ``chunk_rows`` is fixed for the txn (its START may lower it, see
   ``protocol.coordinator.chunk_sizing``). Time never cuts a chunk, and neither do poll batch boundaries: a
   chunk depends only on the sequence of records read from the txn's start offset.
3. A chunk body is its records' values, untouched, framed by their format; ClickHouse fills the
   metadata columns (``protocol.framing``).

Records are anything with confluent-kafka's ``Message`` accessors (``offset()``, ``key()``,
``value()``, ``topic()``, ``partition()``), so polled messages flow through without copies.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import msgspec

from protocol.naming import chunk_token

#: Runs of consecutive offsets a chunk may hold (rule 2): a URL's worth of query parameters.
MAX_RUNS = 1_000

_WHITESPACE = b" \t\r\n"
_OPEN = ord("{")


class RecordLike(Protocol):
    """The accessors of ``confluent_kafka.Message`` the participant uses."""

    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True, eq=False)
class Chunk:
    """Records ``[first_offset, next_offset)`` of one partition, as read, to stage under ``token``.

    Offsets inside may have gaps (transaction markers, compaction); ``next_offset`` is the offset
    of the last record + 1.
    """

    txn: str
    topic: str
    partition: int
    chunk_no: int
    token: str
    records: tuple[RecordLike, ...]
    first_offset: int
    next_offset: int
    bytes: int

    @property
    def rows(self) -> int:
        return len(self.records)


class ChunkBuilder:
    """Cuts the records of one partition in one txn into chunks, by rule 2 above.

    ``next_offset`` is the offset after the last record taken, or where the partition was read to
    past it (``passed``). Records below it (stale deliveries) are skipped, never chunked twice.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        txn: str,
        topic: str,
        partition: int,
        start_offset: int,
        chunk_rows: int,
        chunk_bytes: int,
    ) -> None:
        if chunk_rows <= 0 or chunk_bytes <= 0:
            raise ValueError(f"chunk_rows ({chunk_rows}) and chunk_bytes ({chunk_bytes}) must be > 0")
        self.pipeline, self.txn, self.topic, self.partition = pipeline, txn, topic, partition
        self.chunk_rows, self.chunk_bytes = chunk_rows, chunk_bytes
        self.next_offset = start_offset
        self.chunks_cut = 0
        self.rows_read = 0
        self.bytes_read = 0
        self._open: list[RecordLike] = []
        self._open_bytes = 0
        self._open_first = start_offset
        self._open_runs = 0

    def add(self, records: Sequence[RecordLike], lo: int = 0, hi: int | None = None) -> list[Chunk]:
        """Take ``records[lo:hi]`` (all of this builder's partition, in offset order as Kafka
        delivers them); return the chunks they close."""
        hi = len(records) if hi is None else hi
        if lo >= hi:
            return []
        first = records[lo].offset()
        if first < self.next_offset:  # a stale delivery: sort it out record by record
            return self._add_each(records, lo, hi)
        if records[hi - 1].offset() - first != hi - lo - 1 or (self._open and first != self._open[-1].offset() + 1):
            return self._add_each(records, lo, hi)  # gaps between offsets: count the runs record by record
        taken = records[lo:hi]
        try:  # ends[k]: payload bytes of taken[:k]
            ends = list(accumulate(map(len, [r.value() for r in taken]), initial=0))  # type: ignore[arg-type]  # len(None): below
        except TypeError:  # a null value (tombstone)
            return self._add_each(records, lo, hi)
        closed: list[Chunk] = []
        i, n = 0, len(taken)
        while i < n:
            stop = min(n, i + self.chunk_rows - len(self._open))
            budget = self.chunk_bytes - self._open_bytes
            fit = max(i, bisect_right(ends, ends[i] + budget, i, stop + 1) - 1)
            if fit == i and not self._open:
                fit = i + 1  # a record larger than chunk_bytes forms a chunk of its own
            if fit > i:
                if not self._open:
                    self._open_first = taken[i].offset()
                    self._open_runs = 1
                self._open.extend(taken[i:fit])
                self._open_bytes += ends[fit] - ends[i]
                self.next_offset = taken[fit - 1].offset() + 1
                i = fit
            if i < n or len(self._open) >= self.chunk_rows:  # the next record does not fit, or full
                closed.append(self._cut())
        self.rows_read += n
        self.bytes_read += ends[n]
        return closed

    def _add_each(self, records: Sequence[RecordLike], lo: int, hi: int) -> list[Chunk]:
        """``add`` one record at a time: skips records below ``next_offset``, takes null values."""
        closed: list[Chunk] = []
        open_, rows_cap, bytes_cap = self._open, self.chunk_rows, self.chunk_bytes
        for i in range(lo, hi):
            record = records[i]
            offset = record.offset()
            if offset < self.next_offset:
                continue
            value = record.value()
            size = len(value) if value is not None else 0
            new_run = not open_ or offset != open_[-1].offset() + 1
            if open_ and (self._open_bytes + size > bytes_cap or (new_run and self._open_runs >= MAX_RUNS)):
                closed.append(self._cut())
                open_ = self._open
            if not open_:
                self._open_first = offset
                new_run = True
            self._open_runs += new_run
            open_.append(record)
            self._open_bytes += size
            self.next_offset = offset + 1
            self.rows_read += 1
            self.bytes_read += size
            if len(open_) >= rows_cap:
                closed.append(self._cut())
                open_ = self._open
        return closed

    def passed(self, offset: int) -> None:
        """Every record below ``offset`` was delivered: offsets past the last record taken and below it
        hold none a ``read_committed`` consumer sees (transaction markers, aborted records), so the
        txn's range goes on to ``offset``. Never moves back."""
        self.next_offset = max(self.next_offset, offset)

    def flush(self) -> Chunk | None:
        """Close the open chunk (END); None when it holds no record."""
        return self._cut() if self._open else None

    def _cut(self) -> Chunk:
        next_offset = self._open[-1].offset() + 1  # not ``self.next_offset``: a chunk ends at its records
        chunk = Chunk(
            txn=self.txn,
            topic=self.topic,
            partition=self.partition,
            chunk_no=self.chunks_cut,
            token=chunk_token(
                self.pipeline, self.txn, self.topic, self.partition, self.chunks_cut, self._open_first, next_offset
            ),
            records=tuple(self._open),
            first_offset=self._open_first,
            next_offset=next_offset,
            bytes=self._open_bytes,
        )
        self.chunks_cut += 1
        self._open = []
        self._open_bytes = 0
        self._open_runs = 0
        return chunk


def record_problem(value: bytes | None, *, json_objects: bool) -> str | None:
    """Why ``value`` cannot be one row, found without parsing; None when it may be.

    Empty values would silently become zero rows; in JSONEachRow a record that is not an object
    (an array, a scalar) would become zero or several rows, breaking the row count of the txn.
    """
    if not value:
        return "empty record (null or zero-length value): nothing to insert"
    if json_objects and (_object_start(value) < 0 or len(value.strip(_WHITESPACE)) < 2):
        return "not a JSON object: JSONEachRow takes exactly one {...} object per record"
    return None


def json_problem(value: bytes) -> str | None:
    """Why ``value`` is not one JSON object, found by parsing it (the slow pre-check)."""
    try:
        decoded = msgspec.json.decode(value)
    except msgspec.DecodeError as exc:
        return f"malformed JSON: {exc}"
    if not isinstance(decoded, dict):
        return f"not a JSON object but a {type(decoded).__name__}"
    return None


def _object_start(value: bytes) -> int:
    """Index of the opening brace of a JSON object, or -1."""
    if value[0] == _OPEN:
        return 0
    stripped = value.lstrip(_WHITESPACE)
    return len(value) - len(stripped) if stripped[:1] == b"{" else -1
