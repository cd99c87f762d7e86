"""The participant's dead-letter sink: a chunk's bad records into ClickHouse, as part of its txn.

Letters are not produced to Kafka here: they go to ``<database>.chtxn_dead_letters`` under the
chunk's txn (``protocol.dead_letters.letters``), and the leader publishes them to the dead-letter topic
once that txn is committed, exactly once. A txn that aborts leaves its letters unpublished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from clients.clickhouse import retrying
from participant.bad_records import Letter
from protocol.chcodes import UNKNOWN_TABLE
from protocol.chunking import Chunk
from protocol.dead_letters import letters as dead_letters
from protocol.errors import ChtxnError, ClickHouseError

log = logging.getLogger(__name__)


class DeadLetterError(ChtxnError):
    """A chunk's letters were not stored: the chunk must not count as staged (its txn aborts)."""


class DeadLetterSink:
    """Stores the letters of a chunk in ``<database>.chtxn_dead_letters``. Thread-safe.

    ``write`` returns once ClickHouse has stored every letter (``async_insert = 0``), inserted
    with ``insert_deduplication_token = protocol.dead_letters.letters.letters_token(chunk.token)`` so a
    retried write is stored once; it raises ``DeadLetterError`` otherwise, so a bad record is
    never dropped silently. Each letter keeps the record's key, value (null for a tombstone),
    headers and timestamp, its coordinates, the error and ClickHouse's code (0: found in Python).
    A missing table is created (``chtxn init`` creates it first where participants may not).
    """

    def __init__(
        self,
        client: Any,
        *,
        database: str,
        pipeline: str,
        attempts: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client, self.database, self.pipeline = client, database, pipeline
        self.attempts, self._sleep = attempts, sleep

    def write(self, chunk: Chunk, letters: Sequence[Letter]) -> None:
        if not letters:
            return
        rows = [dead_letters.to_insert_values(self._letter(chunk.txn, letter)) for letter in letters]
        token = dead_letters.letters_token(chunk.token)
        try:
            try:
                self._insert(rows, token)
            except ClickHouseError as exc:
                if exc.code != UNKNOWN_TABLE:
                    raise
                log.warning("creating %s", dead_letters.qualified(self.database))
                retrying(self.attempts, f"create {dead_letters.qualified(self.database)}", sleep=self._sleep)(
                    self.client.command, dead_letters.create_table_sql(self.database)
                )
                self._insert(rows, token)
        except ClickHouseError as exc:
            raise DeadLetterError(
                f"cannot store the {len(letters)} dead letters of chunk {chunk.token} in "
                f"{dead_letters.qualified(self.database)}: {exc}; the txn will be aborted and the records read "
                "again (chtxn init creates the table)"
            ) from None

    def _insert(self, rows: list[list[object]], token: str) -> None:
        retrying(self.attempts, f"store dead letters {token}", sleep=self._sleep)(
            self.client.insert,
            dead_letters.TABLE,
            rows,
            column_names=list(dead_letters.INSERT_COLUMNS),
            column_type_names=list(dead_letters.INSERT_TYPES),
            database=self.database,
            settings={"insert_deduplication_token": token, "insert_deduplicate": 1, "async_insert": 0},
        )

    def _letter(self, txn: str, letter: Letter) -> dead_letters.DeadLetter:
        record = letter.record
        timestamp = getattr(record, "timestamp", None)
        kind, ms = timestamp() if callable(timestamp) else (0, 0)
        headers = getattr(record, "headers", None)
        own = tuple((name, value or b"") for name, value in (headers() or ())) if callable(headers) else ()
        return dead_letters.DeadLetter(
            pipeline=self.pipeline,
            txn=txn,
            topic=record.topic(),
            partition=record.partition(),
            offset=record.offset(),
            key=record.key(),
            value=record.value(),
            headers=own,
            timestamp_ms=ms if kind else 0,
            error=letter.error,
            error_code=letter.code,
        )
