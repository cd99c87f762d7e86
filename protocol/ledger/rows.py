"""The ledger: chtxn's commit log, one ClickHouse row per transaction event.

Table ``<database>.chtxn_ledger`` (docs/architecture.md §5), shared by every pipeline in the
database. Events:

- ``EPOCH``: a coordinator claimed leadership generation ``epoch`` (token ``naming.epoch_token``);
- ``STARTED``: START-COMMIT went out for ``txn`` with these start offsets;
- ``COMMITTED``: the commit point; ``commit_seq`` = previous + 1, inserted with token
  ``naming.commit_token`` so that of two leaders racing for one slot exactly one row survives;
- ``PUBLISHED``: the stage table was moved (or copied) into the target and dropped;
- ``ABORTED``: the txn was dropped, with ``reason``;
- ``GAP``: offsets between two commits were gone (retention) and skipped, per ``on_gap = skip``;
- ``LOST``: a committed txn whose stage table was missing at publish (an alarm: ``chtxn verify`` fails);
- ``INITIAL``: the offset a never-committed partition starts from, chosen once (token
  ``<pipeline>/initial/<topic>/<partition>``, first write wins) so a new leader never moves it;
- ``COMMIT_POINT``: slots after ``commit_seq`` are claimed by the commit point named in ``reason``
  (``protocol.ledger.commit_points``): written once, changed only by ``chtxn commit-point switch``;
- ``TOPIC``, ``STOPPED``: the identity of the log a partition's offsets count in, and a partition
  whose log no longer matches it (``protocol.offsets.partition_logs``);
- ``CHECKPOINT``: the head at slot ``commit_seq`` (every partition's committed end offset), for a
  prefix of the chain that is decided and settled (``protocol.ledger.checkpoint``). Readers start
  from the latest one, so what they read does not grow with the chain.

**Resolution rule for readers.** Deduplication makes a commit slot hold one row; past the
deduplication window a slot could hold two, and the **first claim wins for ever**. The reads that
apply the rule are in ``protocol.ledger.sql``, which states it in full.

**Seals.** A new leader claims slot head+1 with an empty COMMITTED row of its own (txn
``e<epoch>_t0``, no stage table, no ranges) before it touches any stage table. A late commit of
an older leader then finds its slot taken and steps down; if the older commit landed first, the
new leader rolls it forward and seals the next slot.

Offsets are Kafka's "next offset to read"; times are unix seconds (0.0 when unknown).
This module (the schema, ``LedgerRow`` and its row codec) and ``protocol.ledger.sql`` (the reads)
are pure: the SQL is text, run by ``coordinator.ledger.store``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec

from protocol.messages import TopicPartition
from protocol.tables import replicated_ddl

TABLE = "chtxn_ledger"

#: Inserted blocks ClickHouse remembers for deduplication. A few ledger inserts happen per txn,
#: so this covers tens of thousands of txns (hours at one txn per second): a stale leader's
#: late claim on a slot within that span is dropped by ClickHouse itself. Beyond it, readers
#: fall back on the resolution rule (``protocol.ledger.sql``).
DEDUP_WINDOW = 100_000


class LedgerEvent(str, enum.Enum):
    STARTED = "STARTED"
    COMMITTED = "COMMITTED"
    PUBLISHED = "PUBLISHED"
    ABORTED = "ABORTED"
    EPOCH = "EPOCH"
    GAP = "GAP"
    LOST = "LOST"  # committed, but its stage table was gone before publish: an alarm, never PUBLISHED
    INITIAL = "INITIAL"  # where a never-committed partition starts, fixed once chosen
    CHECKPOINT = "CHECKPOINT"  # the head at slot commit_seq: readers start from the latest one
    PAUSED = "PAUSED"  # an operator paused the pipeline (chtxn pause): no new txn starts
    RESUMED = "RESUMED"  # an operator resumed it (chtxn resume)
    COMMIT_POINT = (
        "COMMIT_POINT"  # the commit point slots after commit_seq are claimed by (protocol.ledger.commit_points)
    )
    TOPIC = "TOPIC"  # the identity of a source topic's partition logs, from a slot on (protocol.offsets.partition_logs)
    STOPPED = "STOPPED"  # a partition whose log no longer matches the ledger: not read until chtxn reset


#: A txn's state is the first of these it has an event for.
STATE_PRECEDENCE: tuple[str, ...] = ("PUBLISHED", "LOST", "COMMITTED", "ABORTED", "STARTED")


class PartitionRange(msgspec.Struct, frozen=True, kw_only=True):
    """Offsets ``[start, end)`` of one partition in a txn, the rows staged from them and their table.

    Evolution (the Keeper commit point stores rows as JSON, ``protocol.ledger.claims``): fields are
    only appended, each with a default, so a row written by an earlier version still decodes."""

    topic: str
    partition: int
    start: int
    end: int
    rows: int = 0
    #: The target table the range's records were staged into and published to (``protocol.ledger.range_tables``).
    #: "" in rows of earlier versions: readers apply ``range_tables.table_of_range``.
    table: str = ""

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


class LedgerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One ledger row. ``event_time`` is set by the server on insert and ignored when writing."""

    pipeline: str
    txn: str
    event: LedgerEvent
    epoch: int
    commit_seq: int = 0  # 0 except on COMMITTED rows
    coordinator: str = ""
    claim_id: str = ""  # random id of the insert claiming a COMMITTED or EPOCH slot; TOPIC, STOPPED: the topic ID
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
    reason: str = ""
    event_time: float = 0.0
    #: COMMITTED rows of a sharded ClickHouse: ``host:port`` of every shard the txn staged on
    #: (``protocol.shards.address``), which a leader rolling it forward must all reach.
    shards: tuple[str, ...] = ()


#: Columns written on insert and their ClickHouse types, in the order of ``to_insert_values``.
INSERT_SCHEMA: tuple[tuple[str, str], ...] = (
    ("pipeline", "LowCardinality(String)"),
    ("txn", "String"),
    ("event", "LowCardinality(String)"),
    ("epoch", "UInt64"),
    ("commit_seq", "UInt64"),
    ("coordinator", "String"),
    ("claim_id", "String"),
    ("target", "String"),
    ("stage_table", "String"),
    ("topics", "Array(LowCardinality(String))"),
    ("partitions", "Array(Int32)"),
    ("start_offsets", "Array(Int64)"),
    ("end_offsets", "Array(Int64)"),
    ("rows", "Array(UInt64)"),
    ("total_rows", "UInt64"),
    ("total_bytes", "UInt64"),
    ("dead_letters", "UInt64"),
    ("started_at", "DateTime64(3, 'UTC')"),
    ("ended_at", "DateTime64(3, 'UTC')"),
    ("committed_at", "DateTime64(3, 'UTC')"),
    ("published_at", "DateTime64(3, 'UTC')"),
    ("reason", "String"),
    ("tables", "Array(LowCardinality(String))"),  # per range, its table (``PartitionRange.table``)
    ("shards", "Array(String)"),  # ``LedgerRow.shards``
)
#: Columns added after the first release, with their types: ``chtxn init`` and every coordinator
#: start add them to a ledger made before (``add_column_sql``); rows stored before read as the default.
ADDED_COLUMNS: tuple[tuple[str, str], ...] = (
    ("tables", "Array(LowCardinality(String))"),
    ("shards", "Array(String)"),
)
INSERT_COLUMNS: tuple[str, ...] = tuple(name for name, _ in INSERT_SCHEMA)
INSERT_TYPES: tuple[str, ...] = tuple(kind for _, kind in INSERT_SCHEMA)

_TIMES = ("started_at", "ended_at", "committed_at", "published_at", "event_time")


def qualified(database: str) -> str:
    return f"`{database}`.`{TABLE}`"


def dedup_engine(replicated: bool, window: int, *, database: str, table: str = TABLE) -> tuple[str, str]:
    """(engine, settings) of chtxn table ``database.table`` that remembers ``window`` inserted blocks
    for deduplication. Replicated, its Keeper path is ``/clickhouse/tables/{shard}/<database>/<table>``
    (``protocol.tables.replicated_ddl.keeper_path``): written out rather than the server's default
    ``{uuid}`` path, so that the table made on each replica by hand (without ``ON CLUSTER``) is still
    one replicated table, and its path can be found in Keeper by name."""
    if replicated:
        return replicated_ddl.replicated_engine(database, table), (
            f"replicated_deduplication_window = {window}, replicated_deduplication_window_seconds = 604800"
        )
    return "MergeTree", f"non_replicated_deduplication_window = {window}"


#: Data-skipping indexes: the rows of one txn (``txn IN``) and of a recent time window
#: (``event_time >=``) are found without reading the whole table. ``(name, definition)``.
SKIP_INDEXES: tuple[tuple[str, str], ...] = (
    ("chtxn_txn", "txn TYPE bloom_filter GRANULARITY 1"),
    ("chtxn_time", "event_time TYPE minmax GRANULARITY 1"),
)


def create_table_sql(database: str, *, replicated: bool = False, cluster: str = "") -> str:
    """The ledger DDL (idempotent): ``ReplicatedMergeTree`` when ``replicated`` (``dedup_engine``),
    made on every server of ``cluster`` when given. No partition key: deduplication tokens are per partition."""
    engine, window = dedup_engine(replicated, DEDUP_WINDOW, database=database, table=TABLE)
    columns = ",\n".join(f"    {name:<14}{kind}" for name, kind in INSERT_SCHEMA)
    indexes = "".join(f",\n    INDEX {name} {definition}" for name, definition in SKIP_INDEXES)
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(database)}{replicated_ddl.on_cluster(cluster)}\n(\n{columns},\n"
        f"    {'event_time':<14}DateTime64(3, 'UTC') DEFAULT now64(3){indexes}\n)\n"
        f"ENGINE = {engine}\nORDER BY (pipeline, event, commit_seq, txn)\nSETTINGS {window}"
    )


def existing_indexes_sql() -> str:
    """Names of the skip indexes of table ``{table:String}`` in ``{database:String}``."""
    return "SELECT name FROM system.data_skipping_indices WHERE database = {database:String} AND table = {table:String}"


def add_index_sql(database: str, name: str, *, cluster: str = "") -> list[str]:
    """Add skip index ``name`` to a ledger made before it existed, and build it for the rows already there
    (``ON CLUSTER`` when ``cluster`` is set)."""
    definition = dict(SKIP_INDEXES)[name]
    table = qualified(database) + (f" ON CLUSTER `{cluster}`" if cluster else "")
    return [
        f"ALTER TABLE {table} ADD INDEX IF NOT EXISTS {name} {definition}",
        f"ALTER TABLE {table} MATERIALIZE INDEX {name}",
    ]


def existing_columns_sql() -> str:
    """Names of the columns of table ``{table:String}`` in ``{database:String}``."""
    return "SELECT name FROM system.columns WHERE database = {database:String} AND table = {table:String}"


def add_column_sql(database: str, name: str, *, cluster: str = "") -> str:
    """Add column ``name`` of ``ADDED_COLUMNS`` to a ledger made before it existed (``ON CLUSTER``
    when ``cluster`` is set); the rows already there read as its default."""
    table = qualified(database) + (f" ON CLUSTER `{cluster}`" if cluster else "")
    return f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {name} {dict(ADDED_COLUMNS)[name]}"


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def to_insert_values(row: LedgerRow) -> list[object]:
    """``row`` as one insert row matching ``INSERT_COLUMNS``."""
    r = row.ranges
    return [
        row.pipeline,
        row.txn,
        row.event.value,
        row.epoch,
        row.commit_seq,
        row.coordinator,
        row.claim_id,
        row.target,
        row.stage_table,
        [p.topic for p in r],
        [p.partition for p in r],
        [p.start for p in r],
        [p.end for p in r],
        [p.rows for p in r],
        row.total_rows,
        row.total_bytes,
        row.dead_letters,
        _dt(row.started_at),
        _dt(row.ended_at),
        _dt(row.committed_at),
        _dt(row.published_at),
        row.reason,
        [p.table for p in r],
        list(row.shards),
    ]


#: Select list matching ``from_result_row``: times come back as unix milliseconds.
SELECT_COLUMNS = ", ".join(
    f"toUnixTimestamp64Milli({c}) AS {c}_ms" if c in _TIMES else c for c in (*INSERT_COLUMNS, "event_time")
)


def from_result_row(values: Sequence[Any]) -> LedgerRow:
    """The ``LedgerRow`` of one result row of ``SELECT {SELECT_COLUMNS}``."""
    v = dict(zip((*INSERT_COLUMNS, "event_time"), values))
    tables = list(v["tables"]) + [""] * (len(v["topics"]) - len(v["tables"]))  # [] in rows of earlier versions
    ranges = tuple(
        PartitionRange(topic=t, partition=int(p), start=int(s), end=int(e), rows=int(n), table=table)
        for t, p, s, e, n, table in zip(
            v["topics"], v["partitions"], v["start_offsets"], v["end_offsets"], v["rows"], tables
        )
    )
    return LedgerRow(
        pipeline=v["pipeline"],
        txn=v["txn"],
        event=LedgerEvent(v["event"]),
        epoch=int(v["epoch"]),
        commit_seq=int(v["commit_seq"]),
        coordinator=v["coordinator"],
        claim_id=v["claim_id"],
        target=v["target"],
        stage_table=v["stage_table"],
        ranges=ranges,
        total_rows=int(v["total_rows"]),
        total_bytes=int(v["total_bytes"]),
        dead_letters=int(v["dead_letters"]),
        reason=v["reason"],
        shards=tuple(v["shards"]),
        **{c: int(v[c]) / 1000 for c in _TIMES},
    )


def state_sql(events: str = "groupArray(event)") -> str:
    """SQL of a txn's state from the array of its events (``STATE_PRECEDENCE``)."""
    arms = ", ".join(f"has({events}, '{s}'), '{s}'" for s in STATE_PRECEDENCE[:-1])
    return f"multiIf({arms}, '{STATE_PRECEDENCE[-1]}')"


def state_of(events: Sequence[str]) -> str:
    """The Python twin of ``state_sql``."""
    return next((s for s in STATE_PRECEDENCE if s in events), STATE_PRECEDENCE[-1])
