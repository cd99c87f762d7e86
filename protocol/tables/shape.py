"""The shape of a ClickHouse table (engine, keys, columns) as chtxn compares a stage table with
its target, and the SQL text with which stage tables and their target are read and aligned. Pure:
no I/O; ``coordinator.stage.tables`` and ``clients.target_table`` run the queries.

A stage table keeps every staged row: for a target whose engine merges rows away
(``merges_rows``) it is the plain ``MergeTree`` of the target's family with the target's columns,
keys and settings (``engine_clause_as``; for a replicated or shared target
``protocol.tables.replicated_ddl.stage_engine``), and only the partition key has to match for a move
(``difference``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.coordinator.events import PartitionStats
from protocol.framing import METADATA_COLUMNS
from protocol.messages import TopicPartition
from protocol.tables.replicated_ddl import base_engine

#: Engines that merge rows away (and their Replicated and Shared forms, ``merges_rows``); their
#: stage tables are plain MergeTree (see the module docstring).
MERGING_ENGINES = frozenset(
    {
        "ReplacingMergeTree",
        "SummingMergeTree",
        "CollapsingMergeTree",
        "VersionedCollapsingMergeTree",
        "AggregatingMergeTree",
        "GraphiteMergeTree",
        "CoalescingMergeTree",
    }
)


def _window(engine_full: str, setting: str) -> int | None:
    match = re.search(rf"\b{setting}\s*=\s*(\d+)", engine_full)
    return int(match.group(1)) if match else None


def deduplicates(engine: str, engine_full: str) -> bool:
    """Whether a MergeTree table drops a block it has seen (a deduplication window above 0)."""
    if "Replicated" in engine or "Shared" in engine:
        return _window(engine_full, "replicated_deduplication_window") != 0  # the default window is > 0
    return (_window(engine_full, "non_replicated_deduplication_window") or 0) > 0


def engine_clause_as(engine_full: str, engine: str) -> str:
    """``engine_full`` with its engine call (name and arguments) replaced by plain ``MergeTree``."""
    rest = engine_full[len(engine) :] if engine_full.startswith(engine) else engine_full
    if rest.startswith("("):
        depth, quote, i = 0, "", 0
        for i, ch in enumerate(rest):
            if quote:
                quote = "" if ch == quote and rest[i - 1] != "\\" else quote
            elif ch in "'`\"":
                quote = ch
            elif ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
                if depth == 0:
                    break
        rest = rest[i + 1 :]
    return "MergeTree" + rest


def merges_rows(engine: str) -> bool:
    """Whether a table of ``engine`` merges rows away: ``ReplacingMergeTree``,
    ``ReplicatedReplacingMergeTree``, ``SharedSummingMergeTree``, ..."""
    return base_engine(engine) in MERGING_ENGINES


@dataclass
class Shape:
    """A table's engine, keys and columns (name, type) in order."""

    engine: str
    partition: str
    sorting: str
    primary: str
    columns: list[tuple[str, str]] = field(default_factory=list)


def difference(stage: Shape | None, target: Shape | None) -> str:
    """How ``target`` differs from ``stage``, "" when a move would work.

    Columns and keys are compared; for targets whose engine merges rows, only the partition
    key: their engines extend the sorting key implicitly (VersionedCollapsing adds its version
    column), which the plain MergeTree stage table does not, and a move between them works.
    """
    if stage is None or target is None:
        return "the stage table or the target is gone"
    merging = merges_rows(target.engine)
    keys = (stage.partition,) if merging else (stage.partition, stage.sorting, stage.primary)
    theirs = (target.partition,) if merging else (target.partition, target.sorting, target.primary)
    if stage.columns == target.columns and keys == theirs:
        return ""
    if stage.columns != target.columns:
        mine, other = dict(stage.columns), dict(target.columns)
        added = [n for n, _ in target.columns if n not in mine]
        gone = [n for n, _ in stage.columns if n not in other]
        parts = ([f"columns added: {', '.join(added)}"] if added else []) + (
            [f"columns dropped: {', '.join(gone)}"] if gone else []
        )
        return "; ".join(parts) or "column types or order changed"
    return "partition, sorting or primary key changed"


#: Columns and keys of the tables ``{names:Array(String)}`` of ``{db:String}``, as tagged rows of six
#: strings: ('c', table, position, column, type, '') and ('t', table, engine, partition key,
#: sorting key, primary key). Other reads are appended to it with UNION ALL under tags of their
#: own: one round trip, and cheaper in ClickHouse than a JOIN or scalar subqueries.
SHAPES_SQL = (
    "SELECT 'c', table, toString(position), name, type, '' FROM system.columns "
    "WHERE database = {db:String} AND table IN {names:Array(String)} "
    "UNION ALL SELECT 't', name, engine, partition_key, sorting_key, primary_key FROM system.tables "
    "WHERE database = {db:String} AND name IN {names:Array(String)}"
)


def shapes_of(rows: list[tuple]) -> dict[str, Shape]:
    """The shapes in ``SHAPES_SQL``'s rows, by table, columns in their order (other tags ignored)."""
    tables = {r[1]: r for r in rows if r[0] == "t"}
    shapes: dict[str, Shape] = {}
    for _, table, _position, name, kind, _ in sorted((r for r in rows if r[0] == "c"), key=lambda r: (r[1], int(r[2]))):
        if table in tables:
            _, _, engine, partition, sorting, primary = tables[table]
            shapes.setdefault(table, Shape(engine, partition, sorting, primary)).columns.append((name, kind))
    return shapes


def has_metadata(shape: Shape) -> bool:
    return set(METADATA_COLUMNS) <= {name for name, _ in shape.columns}


def partition_stats(rows: list[tuple]) -> dict[TopicPartition, PartitionStats]:
    """(topic, partition, rows, min offset, max offset) rows by source partition."""
    return {
        TopicPartition(topic=t, partition=int(p)): PartitionStats(int(n), int(lo), int(hi)) for t, p, n, lo, hi in rows
    }


def ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def alignment(mine: Shape, target: Shape, defs: list[tuple[str, str, str, str]]) -> tuple[list[str], ...]:
    """The ``ALTER TABLE`` clauses, in three statements run in this order, that give a stage table
    of shape ``mine`` the columns of ``target`` (whose columns are ``defs``: name, type, default
    kind, default expression, in order) with their names, types, order and default expressions,
    and its sorting key too unless the target's engine merges rows: columns added (and the sorting
    key), columns whose type changed, columns dropped. Each clause is idempotent."""
    ours = dict(mine.columns)
    adds = []
    for i, (name, kind, default_kind, default) in enumerate(defs):
        if name in ours:
            continue
        where = f"AFTER {ident(defs[i - 1][0])}" if i else "FIRST"
        expression = f" {default_kind} {default}" if default_kind else ""
        adds.append(f"ADD COLUMN IF NOT EXISTS {ident(name)} {kind}{expression} {where}")
    if not merges_rows(target.engine) and target.sorting != mine.sorting:
        adds.append(f"MODIFY ORDER BY ({target.sorting})")
    theirs = {name: kind for name, kind, _, _ in defs}
    changes = [
        f"MODIFY COLUMN {ident(name)} {theirs[name]}"
        for name, kind in mine.columns
        if name in theirs and theirs[name] != kind
    ]
    drops = [f"DROP COLUMN IF EXISTS {ident(name)}" for name, _ in mine.columns if name not in theirs]
    return adds, changes, drops


# ---- SQL text (parameters in braces are bound by the caller; ``stage`` is a qualified name) ----

#: ``engine`` and ``engine_full`` of table ``{t}`` of database ``{db}``.
TABLE_ENGINE_SQL = "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}"
#: ``engine``, ``engine_full``, UUID ("" when the server has none for it) of table ``{t}`` of
#: database ``{db}``, and the engine of ``{db}`` (what a stage table's DDL is made from).
TABLE_DEFINITION_SQL = (
    "SELECT engine, engine_full, if(uuid = toUUID('00000000-0000-0000-0000-000000000000'), '', toString(uuid)), "
    "(SELECT any(engine) FROM system.databases WHERE name = {db:String}) "
    "FROM system.tables WHERE database = {db:String} AND name = {t:String}"
)
#: (name, engine, engine_full, UUID, database engine) of the tables ``{names}`` of database ``{db}``.
TABLE_DEFINITIONS_SQL = (
    "SELECT name, engine, engine_full, if(uuid = toUUID('00000000-0000-0000-0000-000000000000'), '', toString(uuid)), "
    "(SELECT any(engine) FROM system.databases WHERE name = {db:String}) "
    "FROM system.tables WHERE database = {db:String} AND name IN {names:Array(String)}"
)
#: 1 if table ``{t}`` exists in database ``{db}``, else 0.
TABLE_EXISTS_SQL = "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}"
#: The tables of database ``{db}`` whose names start with ``{p}``, by name.
TABLES_STARTING_WITH_SQL = (
    "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String}) ORDER BY name"
)
#: The partition ids of the active parts of table ``{t}`` of database ``{db}``.
PARTITION_IDS_SQL = (
    "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active"
)
#: (name, type, default kind, default expression) of the columns of table ``{t}`` of database ``{db}``, in order.
COLUMN_DEFS_SQL = (
    "SELECT name, type, default_kind, default_expression FROM system.columns "
    "WHERE database = {db:String} AND table = {t:String} ORDER BY position"
)


def columns_sql(*, insertable: bool = False) -> str:
    """(name, type) of the columns of table ``{t}`` of database ``{db}``, in order; with
    ``insertable``, only those an INSERT may name (no MATERIALIZED, ALIAS or EPHEMERAL column)."""
    kinds = " AND default_kind IN ('', 'DEFAULT')" if insertable else ""
    return (
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}"
        f"{kinds} ORDER BY position"
    )


def staged_sql(stage: str, *, per_partition: bool) -> str:
    """The rows staged in ``stage``, in ``SHAPES_SQL``'s tagged rows: per source partition
    ('s', topic, partition, rows, min offset, max offset), or in all ('n', '', rows, '', '', '')."""
    if per_partition:
        return (
            "SELECT 's', toString(_topic), toString(_partition), toString(count()), toString(min(_offset)), "
            f"toString(max(_offset)) FROM {stage} GROUP BY _topic, _partition"
        )
    return f"SELECT 'n', '', toString(count()), '', '', '' FROM {stage}"


def publish_reads_of_sql(stages: Mapping[str, str]) -> str:
    """``publish_reads_sql`` of several stage tables at once (``{names}``: theirs and their targets'):
    ``SHAPES_SQL``, then each stage table's rows ('n', name, rows, ...) and the partition ids of its
    active parts ('p', id, name, ...). ``stages``: unqualified name -> qualified name; the names are
    plain identifiers (``protocol.naming``), safe to quote."""
    rows = " UNION ALL ".join(
        f"SELECT 'n', '{name}', toString(count()), '', '', '' FROM {qualified}" for name, qualified in stages.items()
    )
    return (
        f"{SHAPES_SQL} UNION ALL {rows} "
        "UNION ALL SELECT DISTINCT 'p', partition_id, table, '', '', '' FROM system.parts "
        "WHERE database = {db:String} AND table IN {stages:Array(String)} AND active"
    )


def counts_sql(tables: Sequence[str]) -> str:
    """(rows,) of each of the qualified ``tables``, in their order."""
    return " UNION ALL ".join(f"SELECT {i}, count() FROM {table}" for i, table in enumerate(tables))


def partition_rows_sql(stage: str) -> str:
    """(topic, partition, rows, min offset, max offset) of ``stage`` per source partition."""
    return f"SELECT _topic, _partition, count(), min(_offset), max(_offset) FROM {stage} GROUP BY _topic, _partition"


def publish_reads_sql(stage: str) -> str:
    """``SHAPES_SQL`` of ``{names}``, then the rows ``stage`` holds ('n', '', rows, ...) and the
    partition ids of its active parts ('p', id, ...); ``{stage}`` is its unqualified name."""
    return (
        f"{SHAPES_SQL} UNION ALL SELECT 'n', '', toString(count()), '', '', '' FROM {stage} "
        "UNION ALL SELECT DISTINCT 'p', partition_id, '', '', '', '' FROM system.parts "
        "WHERE database = {db:String} AND table = {stage:String} AND active"
    )
