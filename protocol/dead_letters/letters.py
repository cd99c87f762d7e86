"""Dead letters: the ClickHouse table that holds them per txn, and their form on the dead-letter topic.

A letter travels in two steps, so that it becomes visible exactly once and only for a committed
txn (docs/architecture.md §10):

1. Participants insert the letters of a chunk into ``<database>.chtxn_dead_letters`` (shared by
   the pipelines of the database), synchronously and with a deduplication token derived from the
   chunk's (``letters_token``), before the chunk counts as staged. Letters of a txn that aborts
   stay there under its txn id and are never published; the TTL removes them.
2. After the txn is committed, the leader publishes its letters to the dead-letter topic in one
   Kafka transaction that also moves a marker, the committed offset of group
   ``<pipeline>.chtxn-dlq`` on partition 0 of the dead-letter topic, to the txn's commit slot
   (``coordinator.dead_letters.publisher``). A slot at or below the marker is already published.

On the topic a letter keeps the record's key, value (a tombstone stays null) and headers, and
gets the headers ``HEADERS`` names. This module is pure: SQL is text, run by the callers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from protocol.ledger import rows as ledger
from protocol.tables import replicated_ddl

TABLE = "chtxn_dead_letters"
#: Blocks remembered for deduplication: one block per chunk holding letters.
DEDUP_WINDOW = 10_000
#: Letters are kept this long after their insert (long enough to publish after any outage).
TTL_DAYS = 30

ERROR, ERROR_CODE, PIPELINE, TXN, COMMIT_SEQ = (
    "chtxn.error",
    "chtxn.error_code",
    "chtxn.pipeline",
    "chtxn.txn",
    "chtxn.commit_seq",
)
TOPIC, PARTITION, OFFSET, TIMESTAMP = "chtxn.topic", "chtxn.partition", "chtxn.offset", "chtxn.timestamp"
#: Headers chtxn adds to every letter on the dead-letter topic, in this order.
HEADERS = (ERROR, ERROR_CODE, PIPELINE, TXN, COMMIT_SEQ, TOPIC, PARTITION, OFFSET, TIMESTAMP)


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """One bad record of one txn. ``timestamp_ms`` is the record's Kafka timestamp (0: none)."""

    pipeline: str
    txn: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0
    error: str
    error_code: int = 0


#: Columns written on insert and their ClickHouse types, in ``to_insert_values`` order.
INSERT_SCHEMA: tuple[tuple[str, str], ...] = (
    ("pipeline", "LowCardinality(String)"),
    ("txn", "String"),
    ("topic", "LowCardinality(String)"),
    ("partition", "Int32"),
    ("offset", "Int64"),
    ("key", "Nullable(String)"),
    ("value", "Nullable(String)"),
    ("headers", "Array(Tuple(String, String))"),
    ("timestamp_ms", "Int64"),
    ("error", "String"),
    ("error_code", "Int32"),
)
INSERT_COLUMNS: tuple[str, ...] = tuple(name for name, _ in INSERT_SCHEMA)
INSERT_TYPES: tuple[str, ...] = tuple(kind for _, kind in INSERT_SCHEMA)


def qualified(database: str) -> str:
    return f"`{database}`.`{TABLE}`"


def create_table_sql(database: str, *, replicated: bool = False, cluster: str = "") -> str:
    """The DDL of the letters table (idempotent): ``ReplicatedMergeTree`` when ``replicated``
    (``ledger.dedup_engine``), made on every server of ``cluster`` when given."""
    engine, window = ledger.dedup_engine(replicated, DEDUP_WINDOW, database=database, table=TABLE)
    columns = ",\n".join(f"    {name:<14}{kind}" for name, kind in INSERT_SCHEMA)
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(database)}{replicated_ddl.on_cluster(cluster)}\n(\n{columns},\n"
        f"    {'inserted_at':<14}DateTime DEFAULT now()\n)\n"
        f"ENGINE = {engine}\nORDER BY (pipeline, txn, topic, partition, offset)\n"
        f"TTL inserted_at + INTERVAL {TTL_DAYS} DAY\nSETTINGS {window}"
    )


def letters_token(chunk_token: str) -> str:
    """``insert_deduplication_token`` of a chunk's letters: a retried insert is stored once."""
    return f"{chunk_token}/dead-letters"


def to_insert_values(letter: DeadLetter) -> list[object]:
    return [
        letter.pipeline,
        letter.txn,
        letter.topic,
        letter.partition,
        letter.offset,
        letter.key,
        letter.value,
        [(k, v) for k, v in letter.headers],
        letter.timestamp_ms,
        letter.error,
        letter.error_code,
    ]


#: Select list matching ``from_result_row``.
SELECT_COLUMNS = ", ".join(INSERT_COLUMNS)


def from_result_row(values: Sequence[Any]) -> DeadLetter:
    """The ``DeadLetter`` of one row of ``SELECT {SELECT_COLUMNS}`` read with strings as bytes."""
    v = dict(zip(INSERT_COLUMNS, values))
    text = {name: _text(v[name]) for name in ("pipeline", "txn", "topic", "error")}
    return DeadLetter(
        **text,
        partition=int(v["partition"]),
        offset=int(v["offset"]),
        key=v["key"],
        value=v["value"],
        headers=tuple((_text(k), bytes(h)) for k, h in v["headers"]),
        timestamp_ms=int(v["timestamp_ms"]),
        error_code=int(v["error_code"]),
    )


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def letters_sql(database: str) -> str:
    """Letters of the txns ``{txns:Array(String)}`` of ``{pipeline:String}``, one per record, in order."""
    return (
        f"SELECT {SELECT_COLUMNS} FROM {qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND txn IN {txns:Array(String)} "
        "ORDER BY txn, topic, partition, offset LIMIT 1 BY txn, topic, partition, offset"
    )


def committed_with_letters_sql(database: str) -> str:
    """(commit_seq, txn) of COMMITTED rows in slots ``({after:UInt64}, {upto:UInt64}]`` whose txn holds
    letters and has no PUBLISHED row (its letters went out before that row was written). A slot may
    list two txns past the ledger's deduplication window: the caller keeps the one
    ``LedgerStore.commit_at`` resolves."""
    return (
        f"SELECT DISTINCT commit_seq, txn FROM {ledger.qualified(database)} "
        "WHERE pipeline = {pipeline:String} AND event = 'COMMITTED' "
        "AND commit_seq > {after:UInt64} AND commit_seq <= {upto:UInt64} "
        f"AND txn IN (SELECT DISTINCT txn FROM {qualified(database)} WHERE pipeline = {{pipeline:String}}) "
        f"AND txn NOT IN (SELECT txn FROM {ledger.qualified(database)} WHERE pipeline = {{pipeline:String}} "
        "AND event = 'PUBLISHED' AND commit_seq > {after:UInt64} AND commit_seq <= {upto:UInt64}) "
        "ORDER BY commit_seq, txn"
    )


def kafka_headers(letter: DeadLetter, commit_seq: int, max_error_bytes: int = 4096) -> list[tuple[str, bytes]]:
    """The letter's own headers, then chtxn's (``HEADERS``)."""
    return [
        *letter.headers,
        *zip(
            HEADERS,
            (
                letter.error.encode("utf-8", "replace")[:max_error_bytes],
                b"%d" % letter.error_code,
                letter.pipeline.encode(),
                letter.txn.encode(),
                b"%d" % commit_seq,
                letter.topic.encode(),
                b"%d" % letter.partition,
                b"%d" % letter.offset,
                b"%d" % letter.timestamp_ms,
            ),
        ),
    ]


class PublishedLetter(msgspec.Struct, frozen=True, kw_only=True):
    """A letter as read back from the dead-letter topic (``dlq_partition``/``dlq_offset``: where)."""

    dlq_partition: int
    dlq_offset: int
    pipeline: str
    txn: str
    commit_seq: int
    topic: str
    partition: int
    offset: int
    error_code: int
    error: str
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()  # the record's own headers


def published(
    dlq_partition: int,
    dlq_offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> PublishedLetter | None:
    """The letter of a dead-letter topic message; None when chtxn's headers are missing."""
    own: list[tuple[str, bytes]] = []
    ours: dict[str, str] = {}
    for name, raw in headers or ():
        if name in HEADERS:
            ours[name] = (raw or b"").decode("utf-8", "replace")
        else:
            own.append((name, raw or b""))
    if not all(h in ours for h in (PIPELINE, TOPIC, PARTITION, OFFSET)):
        return None
    try:
        return PublishedLetter(
            dlq_partition=dlq_partition,
            dlq_offset=dlq_offset,
            pipeline=ours[PIPELINE],
            txn=ours.get(TXN, ""),
            commit_seq=int(ours.get(COMMIT_SEQ) or 0),
            topic=ours[TOPIC],
            partition=int(ours[PARTITION]),
            offset=int(ours[OFFSET]),
            error_code=int(ours.get(ERROR_CODE) or 0),
            error=ours.get(ERROR, ""),
            timestamp_ms=int(ours.get(TIMESTAMP) or 0),
            key=key,
            value=value,
            headers=tuple(own),
        )
    except ValueError:
        return None
