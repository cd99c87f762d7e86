"""Staging one chunk into ClickHouse, and isolating the records ClickHouse refuses.

``Stager.stage(stage_table, chunk)`` guarantees, for the chunk's records:

1. Records that cannot be one row (empty values; in JSONEachRow anything but one object) go to
   the dead-letter topic without being sent to ClickHouse.
2. The rest go to ClickHouse in one ``raw_insert`` of the bytes as read (metadata columns
   spliced in when the table has them), with ``insert_deduplication_token = chunk.token``,
   ``insert_deduplicate = 1`` and ``async_insert = 0``; retryable failures are retried with the
   same token, so a chunk is stored once however often it is sent.
3. If ClickHouse refuses the data (a ``DATA``-class error code), the bad records are isolated:
   first a JSON pre-check in Python (JSON formats), then a deterministic bisection of the rest,
   each part inserted with the sub-token ``<token>/<first offset>-<last offset>``. Single refused
   records go to the dead-letter topic with ClickHouse's error; everything else is staged.
4. Dead letters are acknowledged by the broker before the result says the chunk is staged.
5. Any other failure (permanent error, retries exhausted, dead letters not delivered) is
   returned as ``ChunkStaged.error``: the WRITE-STATUS carries it and the coordinator aborts.

Dead letters are at-least-once: a txn aborted after its dead letters went out sends them again
when its records are read again. Bisection costs about two inserts per bad record per halving,
so it is meant for the odd bad record, not for a topic of them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from clients.clickhouse import retrying
from protocol.chcodes import ErrorClass, classify
from protocol.chunking import (
    METADATA_COLUMNS, BodyBuilder, Chunk, RecordLike, check_format, json_problem, record_problem,
)
from protocol.config import ClickHouseSection
from protocol.errors import ChtxnError, ClickHouseError, SetupError
from protocol.participant_events import ChunkStaged
from participant.dead_letters import DeadLetterSink

log = logging.getLogger(__name__)

#: ClickHouse's UNKNOWN_TABLE.
UNKNOWN_TABLE = 60
_OPEN = ord("{")

Letter = tuple[RecordLike, str, int]  # record, error, ClickHouse error code (0: found in Python)


class Stager:
    """Stages chunks; thread-safe, so a pool of workers may share one instance."""

    def __init__(
        self, *, client: Any, section: ClickHouseSection, dead_letters: DeadLetterSink | None, attempts: int,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.client, self.section, self.dead_letters, self.attempts = client, section, dead_letters, attempts
        self._sleep = sleep
        self._columns: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    # ---- the table ------------------------------------------------------------------------

    def metadata_columns(self, table: str) -> tuple[str, ...]:
        """The metadata columns ``table`` has (read from ``system.columns`` once per table)."""
        with self._lock:
            if table in self._columns:
                return self._columns[table]
        rows = self._retrying(f"read the columns of {self.section.database}.{table}")(
            self.client.query,
            "SELECT name FROM system.columns WHERE database = %(db)s AND table = %(table)s",
            parameters={"db": self.section.database, "table": table},
        ).result_rows
        if not rows:
            raise ClickHouseError(
                f"table {self.section.database}.{table} does not exist (or has no columns)", code=UNKNOWN_TABLE
            )
        names = {row[0] for row in rows}
        present = tuple(c for c in METADATA_COLUMNS if c in names)
        with self._lock:
            if len(self._columns) >= 16:
                self._columns.pop(next(iter(self._columns)))
            self._columns[table] = present
        return present

    # ---- one chunk ------------------------------------------------------------------------

    def stage(self, stage_table: str, chunk: Chunk) -> ChunkStaged:
        """Stage ``chunk`` into ``stage_table``; never raises for what ClickHouse or the data did."""
        result = {"txn": chunk.txn, "topic": chunk.topic, "partition": chunk.partition, "chunk_no": chunk.chunk_no}
        try:
            bodies = BodyBuilder(
                topic=chunk.topic, partition=chunk.partition, input_format=self.section.input_format,
                columns=self.metadata_columns(stage_table),
            )
            good, letters = _precheck(chunk.records, bodies.json_objects)
            rows = self._insert_or_isolate(stage_table, chunk.token, good, bodies, letters)
            if letters:
                log.warning(
                    "%d bad records of chunk %s go to the dead-letter topic", len(letters), chunk.token,
                    extra={"txn": chunk.txn, "first_error": letters[0][1][:500]},
                )
            if letters:
                assert self.dead_letters is not None, "a Stager without a dead-letter sink cannot stage bad records"
                self.dead_letters.send(chunk.txn, letters)
            return ChunkStaged(**result, rows=rows, dead_letters=len(letters))
        except ChtxnError as exc:
            log.error("cannot stage chunk %s into %s: %s", chunk.token, stage_table, exc, extra={"txn": chunk.txn})
            return ChunkStaged(**result, error=str(exc))

    def _insert_or_isolate(
        self, table: str, token: str, records: Sequence[RecordLike], bodies: BodyBuilder, letters: list[Letter]
    ) -> int:
        if not records:
            return 0
        try:
            return self._insert(table, records, token, bodies)
        except ClickHouseError as exc:
            if classify(exc.code) is not ErrorClass.DATA:
                raise
            refused = exc
        # Step 3: isolate the bad records
        rest: Sequence[RecordLike] = records
        if bodies.json_objects:
            rest = []
            for record in records:
                problem = json_problem(record.value())  # type: ignore[arg-type]
                if problem:
                    letters.append((record, f"{problem} (ClickHouse refused its chunk: {refused})", 0))
                else:
                    rest.append(record)
            found = len(rest) < len(records)
        else:
            found = False
        return self._bisect(table, token, rest, bodies, letters, known_bad=not found)

    def _bisect(
        self, table: str, token: str, records: Sequence[RecordLike], bodies: BodyBuilder, letters: list[Letter],
        *, known_bad: bool = False,
    ) -> int:
        if not records:
            return 0
        if not known_bad:
            sub = f"{token}/{records[0].offset()}-{records[-1].offset()}"
            try:
                return self._insert(table, records, sub, bodies)
            except ClickHouseError as exc:
                if classify(exc.code) is not ErrorClass.DATA:
                    raise
                if len(records) == 1:
                    letters.append((records[0], str(exc), exc.code))
                    return 0
        mid = len(records) // 2
        return self._bisect(table, token, records[:mid], bodies, letters) + self._bisect(
            table, token, records[mid:], bodies, letters
        )

    def _insert(self, table: str, records: Sequence[RecordLike], token: str, bodies: BodyBuilder) -> int:
        """Step 2: one deduplicated insert; returns the rows it holds."""
        body = bodies.body(records)
        settings = {"insert_deduplication_token": token, "insert_deduplicate": 1, "async_insert": 0}
        summary = self._retrying(f"insert chunk {token} into {table}")(
            self.client.raw_insert, table, insert_block=body, fmt=self.section.input_format, settings=settings
        )
        written = summary.written_rows
        if written and written != len(records):  # 0: deduplicated, or a server without summaries
            raise ClickHouseError(
                f"ClickHouse stored {written} rows for the {len(records)} records of chunk {token}: some "
                f"record holds more or fewer than one {self.section.input_format} row; the txn will abort"
            )
        return len(records)

    def _retrying(self, what: str) -> Any:
        if self._sleep is None:
            return retrying(self.attempts, what)
        return retrying(self.attempts, what, sleep=self._sleep)


def check_target(stager: Stager, table: str) -> tuple[str, ...]:
    """The metadata columns of the target ``table``; ``SetupError`` when no task could work with it.

    Refused: a missing table, and metadata columns with an input format chtxn cannot fill.
    """
    try:
        columns = stager.metadata_columns(table)
    except ClickHouseError as exc:
        if exc.code != UNKNOWN_TABLE:
            raise
        raise SetupError(
            f"target table {stager.section.database}.{table} does not exist: create it (with optional _topic, "
            "_partition, _offset columns for exactly-once checks) or fix clickhouse.target_table"
        ) from None
    check_format(stager.section.input_format, columns)
    return columns


def _precheck(records: Sequence[RecordLike], json_objects: bool) -> tuple[Sequence[RecordLike], list[Letter]]:
    """Step 1: split off records that cannot be one row, without parsing (fast path: none)."""
    suspects = [
        i for i, r in enumerate(records)
        if not (v := r.value()) or (json_objects and (v[0] != _OPEN or len(v) < 2))
    ]
    if not suspects:
        return records, []
    letters: list[Letter] = []
    bad: set[int] = set()
    for i in suspects:
        problem = record_problem(records[i].value(), json_objects=json_objects)
        if problem:
            letters.append((records[i], problem, 0))
            bad.add(i)
    return [r for i, r in enumerate(records) if i not in bad], letters
