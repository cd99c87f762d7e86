"""Staging one chunk into ClickHouse, and isolating the records ClickHouse refuses.

``Stager.stage(stage_table, chunk)`` guarantees, for the chunk's records (the code calls these
"stager step N"):

1. Records that cannot be one row become dead letters without being sent to ClickHouse
   (``participant.bad_records``): tombstones (null values, error ``tombstone: null value ...``),
   zero-length values (``empty record: ...``), in JSON object formats anything but one ``{...}``
   object, and records this process found to break a chunk before.
1.5. With ``[schema]`` on (``participant.schema_evolution``; JSON object formats only), the
   top-level fields the records carry that the stage table lacks: with ``evolve =
   "add-columns"`` each becomes a column of the target, then of the stage table, before the
   insert (a failed ALTER fails the chunk, step 6); with ``unknown_fields = "dead-letter"`` the
   records carrying one are letters. Off (the default), the records are not read here at all.
2. The rest go to ClickHouse in one insert of the bytes as read, framed by their format
   (``protocol.framing``): a ``raw_insert``, or, when the table has metadata columns, an
   ``INSERT ... SELECT ... FROM input()`` in which ClickHouse fills them from the chunk's
   coordinates (``MetadataInsert``; placed by a sharding key, sent on to each shard by the server:
   ``protocol.shards.ShardRouter``); with ``insert_deduplication_token = chunk.token`` and
   ``protocol.insert_settings.CHUNK_INSERT_SETTINGS`` (deduplicated, synchronous, no row skipped
   or collapsed); retryable failures are retried with the same token, so a chunk is stored once
   however often it is sent. In JSON object formats, a record holding objects back to back is
   found by one scan of the body first and set aside (no abort).
3. If ClickHouse refuses the data (a ``DATA``-class error code), the bad records are isolated
   (``participant.bisection.isolate_refused``): the records a JSON pre-check in Python finds
   malformed are tried alone, the rest in one part, and a refused part is bisected, each part
   inserted with the sub-token ``<token>/<first offset>-<last offset>``. Only ClickHouse's
   refusal of a record alone makes a letter, with ClickHouse's error and code; everything else
   is staged (the pre-check only orders the tries: msgspec refuses much that ClickHouse reads,
   and it never raises). A letter's error is led by the field whose value its column cannot
   read, when the JSON kind of the value tells (``SchemaEvolution.name_fields``).
   A chunk that still runs out of memory after its retries (a ``MEMORY`` code) is split the same
   way while the server shows memory to spare (a query gets ``CONTROL_BYTES``): parts small
   enough are staged, and a record that fails alone again is a letter (``TOO_BIG_FOR_MEMORY``).
   When the server has no memory to spare, the error fails the chunk (step 6): a server short of
   memory never turns records into letters.
4. The chunk's dead letters are stored in ``chtxn_dead_letters`` under its txn (a token derived
   from the chunk's) before the result says the chunk is staged; the leader publishes them to the
   dead-letter topic once the txn is committed, exactly once (``participant.dead_letters``).
5. If ClickHouse stored a different number of rows than records were sent (``written_rows``),
   the chunk's rows are in the stage table under its token and its txn cannot commit: the
   culprits are isolated without touching the stage table again (``json_problem``, then a
   bisection whose probes go to a Null-engine clone of it: ``participant.not_one_row``),
   remembered in ``remembered``, and the result carries the error, so the coordinator aborts once
   and the txn that reads them again dead-letters them at step 1.
6. Any other failure (permanent error, retries exhausted, a server out of memory, ClickHouse
   unreachable, dead letters not stored, a column step 1.5 could not add) is returned as
   ``ChunkStaged.error``: the WRITE-STATUS carries it and the coordinator aborts, and the records
   are read again. A record is never dead-lettered for a failure that is not its own.

A tombstone (null value) is never dropped silently: it becomes a dead letter with its key, a
null value and the error ``tombstone: null value ...`` (a zero-length value gets
``empty record: ...``), and reaches the dead-letter topic once its txn commits.

Bisection costs about two inserts per bad record per halving, so it is meant for the odd bad
record, not for a topic of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import tenacity

from clients.clickhouse import InsertBody, error_code, is_retryable, retrying
from participant.bad_records import Letter, Remembered, has_joins, json_problem, precheck, split_joined
from participant.bisection import isolate_refused
from participant.dead_letters import DeadLetterSink
from participant.not_one_row import NotOneRow, NotOneRowFinder
from participant.schema_evolution import SchemaEvolution
from participant.tally import Tally
from protocol import insert_settings
from protocol.chcodes import UNKNOWN_TABLE, ErrorClass, classify, is_memory
from protocol.chunking import Chunk, RecordLike
from protocol.config.sections import ClickHouseSection, SchemaSection
from protocol.errors import ChtxnError, ClickHouseError
from protocol.framing import JSON_OBJECT_FORMATS, ROW_ORDER_SETTINGS, Column, MetadataInsert, check_format, frame
from protocol.participant.events import ChunkStaged
from protocol.shards import ShardRouter

log = logging.getLogger(__name__)

#: Memory a control query asks for after a memory error, to tell a record too big for a query's
#: memory from a server short of it: above ClickHouse's untracked allowance per thread (4 MiB).
CONTROL_BYTES = 8 << 20


class _ChunkKey(TypedDict):
    """The fields of a ``ChunkStaged`` that name its chunk."""

    txn: str
    topic: str
    partition: int
    chunk_no: int


class Stager:
    """Stages chunks; thread-safe, so a pool of workers may share one instance."""

    def __init__(
        self,
        *,
        client: Any,
        section: ClickHouseSection,
        dead_letters: DeadLetterSink | None,
        attempts: int,
        sleep: Callable[[float], None] | None = None,
        remembered: Remembered | None = None,
        tally: Tally | None = None,
        schema: SchemaSection | None = None,
        pipeline: str = "",
        router: ShardRouter | None = None,
    ) -> None:
        self.client, self.section, self.dead_letters, self.attempts = client, section, dead_letters, attempts
        self.router = router  # each row to its shard (``clickhouse.placement = "sharding-key"``)
        self.tally = tally or Tally()  # inserts, their time and retries, for the heartbeats' figures
        self.remembered = remembered if remembered is not None else Remembered()
        self._sleep = sleep
        self._inserts: dict[str, tuple[frozenset[str], MetadataInsert | None]] = {}
        self._settings: dict[str, int] | None = None
        self._lock = threading.Lock()
        self.schema = SchemaEvolution(
            client=client,
            section=section,
            schema=schema or SchemaSection(),
            retrying=self._retrying,
            pipeline=pipeline,  # which table a stage table is of, with [[route]] (``SchemaEvolution.target_of``)
        )
        self._not_one_row = NotOneRowFinder(
            client=client,
            section=section,
            remembered=self.remembered,
            retrying=self._retrying,
            settings=self._chunk_settings,
        )

    # ---- the table ------------------------------------------------------------------------

    def metadata_insert(self, table: str) -> MetadataInsert | None:
        """The insert that has ClickHouse fill ``table``'s metadata columns; None when it has none.
        Read from ``system.columns`` once per table, and again when step 1.5 added columns to it."""
        with self._lock:
            cached = self._inserts.get(table)
        if cached is not None and (not self.schema.adds or cached[0] == frozenset(self.schema.columns(table))):
            return cached[1]
        rows = self._retrying(f"read the columns of {self.section.database}.{table}")(
            self.client.query,
            "SELECT name, type, default_kind, default_expression FROM system.columns "
            "WHERE database = %(db)s AND table = %(table)s ORDER BY position",
            parameters={"db": self.section.database, "table": table},
        ).result_rows
        if not rows:
            raise ClickHouseError(
                f"table {self.section.database}.{table} does not exist (or has no columns)", code=UNKNOWN_TABLE
            )
        columns = [Column(*row) for row in rows]
        check_format(self.section.input_format, [c.name for c in columns])
        insert = MetadataInsert(self.section.database, table, columns, self.section.input_format)
        shape = (frozenset(c.name for c in columns), insert if insert.metadata or self.router else None)
        with self._lock:
            if len(self._inserts) >= 16:
                self._inserts.pop(next(iter(self._inserts)))
            self._inserts[table] = shape
        return shape[1]

    # ---- one chunk ------------------------------------------------------------------------

    def stage(self, stage_table: str, chunk: Chunk) -> ChunkStaged:
        """Stage ``chunk`` into ``stage_table``; never raises for what ClickHouse or the data did."""
        result: _ChunkKey = {
            "txn": chunk.txn,
            "topic": chunk.topic,
            "partition": chunk.partition,
            "chunk_no": chunk.chunk_no,
        }
        try:
            json_objects = self.section.input_format in JSON_OBJECT_FORMATS
            # Stager step 1: records that cannot be one row, and those remembered
            remembered = self.remembered.recall(chunk.topic, chunk.partition, chunk.first_offset, chunk.next_offset)
            good, letters = precheck(chunk.records, json_objects=json_objects, remembered=remembered)
            if self.schema.scans:  # Stager step 1.5: fields the stage table lacks, by [schema]
                good, unknown = self.schema.prepare(stage_table, good, chunk.txn)
                letters += unknown
            try:
                rows = self._insert_or_isolate(stage_table, chunk, good, letters)
            except NotOneRow as exc:  # Stager step 5: records that are not one row, found after their insert
                return ChunkStaged(**result, error=self._not_one_row.set_aside(stage_table, chunk, exc))
            letters.sort(key=lambda letter: letter.record.offset())
            if letters:
                log.warning(
                    "%d bad records of chunk %s are dead letters",
                    len(letters),
                    chunk.token,
                    extra={"txn": chunk.txn, "first_error": letters[0].error[:500]},
                )
                # Stager step 4: the letters are stored before the chunk counts as staged
                assert self.dead_letters is not None, "a Stager without a dead-letter sink cannot stage bad records"
                self.dead_letters.write(chunk, letters)
            return ChunkStaged(**result, rows=rows, dead_letters=len(letters))
        except ChtxnError as exc:
            log.error("cannot stage chunk %s into %s: %s", chunk.token, stage_table, exc, extra={"txn": chunk.txn})
            return ChunkStaged(**result, error=str(exc))

    def _insert_or_isolate(self, table: str, chunk: Chunk, records: Sequence[RecordLike], letters: list[Letter]) -> int:
        if not records:
            return 0
        fmt, token = self.section.input_format, chunk.token
        json_objects = fmt in JSON_OBJECT_FORMATS
        body = frame(records, fmt)
        if json_objects and has_joins(body, len(records)):  # Stager step 2: objects back to back
            records, joined = split_joined(records)
            if joined:
                letters += joined
                if not records:
                    return 0
                body = frame(records, fmt)
        metadata = self.metadata_insert(table)

        def insert_as(part: Sequence[RecordLike], part_token: str, part_body: bytes, retry_memory: bool) -> int:
            if metadata is None:
                return self._insert(table, part, part_token, part_body, retry_memory=retry_memory)
            select, params = metadata.select(chunk.topic, chunk.partition, part)
            return self._insert(
                table, part, part_token, part_body, retry_memory=retry_memory, select=(metadata, select, params)
            )

        try:
            return insert_as(records, token, body, True)
        except ClickHouseError as exc:
            if classify(exc.code) is not ErrorClass.DATA and not is_memory(exc.code):
                raise
            refused = exc
        # Stager step 3: isolate the records ClickHouse refuses

        def insert(part: Sequence[RecordLike], retry_memory: bool) -> int:
            sub = f"{token}/{part[0].offset()}-{part[-1].offset()}"
            return insert_as(part, sub, frame(part, fmt), retry_memory)

        def malformed(record: RecordLike) -> bool:
            return json_problem(record.value()) is not None  # type: ignore[arg-type]  # prechecked: never None

        rows, refused_letters = isolate_refused(
            records,
            refused,
            insert,
            self._has_memory,
            suspect=malformed if json_objects else None,
        )
        letters += self.schema.name_fields(table, refused_letters)
        return rows

    def _insert(
        self,
        table: str,
        records: Sequence[RecordLike],
        token: str,
        body: bytes,
        *,
        retry_memory: bool = True,
        select: tuple[MetadataInsert, str, dict[str, object]] | None = None,
    ) -> int:
        """Stager step 2: one deduplicated insert of ``body`` (the ``records``); returns the rows it holds.
        ``select`` is the table's ``MetadataInsert``, its SELECT of the records and its parameters, when
        the table has metadata columns or a ``router`` places the rows on the shards. Without
        ``retry_memory``, a memory error is raised at once (stager step 3 splits the part instead)."""
        settings: dict[str, object] = {**self._chunk_settings(), "insert_deduplication_token": token}
        policy = self._retrying(f"insert chunk {token} into {table}")
        if not retry_memory:
            policy = policy.copy(retry=tenacity.retry_if_exception(_retryable_but_memory))
        started = time.monotonic()
        try:
            if select is None:
                summary = policy(
                    self.client.raw_insert, table, insert_block=body, fmt=self.section.input_format, settings=settings
                )
            else:
                insert, rows, params = select
                routed = self.router.statement(insert, rows, settings) if self.router else ""  # token per shard
                statement = routed or insert.head + rows
                summary = policy(
                    self.client.command,
                    statement,
                    parameters=params,
                    data=InsertBody(body),
                    settings={**settings, **ROW_ORDER_SETTINGS},
                )
        finally:
            self.tally.inserted(time.monotonic() - started)
        written = summary.written_rows
        if written and written != len(records):  # 0: deduplicated, or a server without summaries
            raise NotOneRow(
                f"ClickHouse stored {written} rows for the {len(records)} records of chunk {token}",
                records=records,
                written=written,
            )
        return len(records)

    def _has_memory(self) -> bool:
        """Stager step 3's control after a memory error: whether a query gets ``CONTROL_BYTES`` now.
        Asked once, not retried; any failure (unreachable included) is a no."""
        try:
            retrying(1, "control query after a memory error")(
                self.client.query, f"SELECT length(randomString({CONTROL_BYTES}))"
            )
        except ClickHouseError as exc:
            log.warning(
                "ClickHouse cannot give a query %d bytes now (%s): a memory error is its load, not a record's",
                CONTROL_BYTES,
                exc,
            )
            return False
        return True

    # ---- plumbing -------------------------------------------------------------------------

    def _chunk_settings(self) -> dict[str, int]:
        if self._settings is None:
            self._settings = insert_settings.for_server(
                getattr(self.client, "server_settings", None), add_columns=self.schema.adds
            )
        return self._settings

    def _retrying(self, what: str) -> Any:
        """The retry policy of one ClickHouse call; each retry is logged and counted (``tally``)."""
        policy = (
            retrying(self.attempts, what) if self._sleep is None else retrying(self.attempts, what, sleep=self._sleep)
        )
        log_retry = policy.before_sleep

        def before_sleep(state: tenacity.RetryCallState) -> None:
            self.tally.retried()
            if log_retry is not None:
                log_retry(state)

        return policy.copy(before_sleep=before_sleep)


def _retryable_but_memory(exc: BaseException) -> bool:
    return is_retryable(exc) and not is_memory(error_code(exc))
