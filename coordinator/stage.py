"""Stage tables: create (step 2), count (step 5), publish (step 7), drop, and find orphans.

Every call here is idempotent, so a new leader can roll any of them forward after a crash.
Guarantees:

- A stage table keeps every staged row as inserted until publish: for targets whose engine
  merges rows away (Replacing, Summing, Collapsing, VersionedCollapsing, Aggregating, ...)
  the stage table is a plain ``MergeTree`` with the target's columns, keys and settings, so its
  ``count()`` is the number of rows staged. ``MOVE PARTITION`` into the target is allowed
  across merge modes; the target then collapses the rows in its own merges, as it would rows
  inserted directly (query with ``FINAL`` for the collapsed view).
- ``publish`` never reports rows it did not put in the target: a missing stage table raises
  ``StageTableMissing``. It leaves the (emptied) stage table for the caller to drop *after* the
  PUBLISHED row is written, so "stage table gone, no PUBLISHED row" always means lost rows.
- A target ALTERed after a stage table was made (``check``'s ``altered``) is published by first
  aligning the stage table's columns (and sorting key) with the target's, then moving its
  partitions. Every row is in exactly one of the two tables at any moment (a partition move is
  atomic), so a publish repeated at any point, by any leader, after any number of ALTERs, moves
  each row once: there is no second copy whose deduplication memory could be lost.
- Every name and every clean-up is scoped by the pipeline (``protocol.naming``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from clients import failpoints
from clients.clickhouse import error_code
from protocol import naming
from protocol.chcodes import INCOMPATIBLE_COLUMNS, UNKNOWN_IDENTIFIER, UNKNOWN_TABLE
from protocol.chunking import METADATA_COLUMNS
from protocol.coordinator_events import PartitionStats
from protocol.errors import ChtxnError, SetupError
from protocol.messages import TopicPartition

log = logging.getLogger(__name__)

#: Times one ``publish`` call aligns the stage table with a target ALTERed while it moves.
ALIGN_ATTEMPTS = 3
#: Blocks a stage table remembers for deduplication: more than the chunks of any one txn.
STAGE_DEDUP_WINDOW = 100_000


#: Engines that merge rows away; their stage tables are plain MergeTree (see the module docstring).
MERGING_ENGINES = frozenset({
    "ReplacingMergeTree", "SummingMergeTree", "CollapsingMergeTree", "VersionedCollapsingMergeTree",
    "AggregatingMergeTree", "GraphiteMergeTree", "CoalescingMergeTree",
})


class StageTableMissing(ChtxnError):
    """A committed txn's stage table is gone before its rows reached the target."""


def _window(engine_full: str, setting: str) -> int | None:
    match = re.search(rf"\b{setting}\s*=\s*(\d+)", engine_full)
    return int(match.group(1)) if match else None


def _deduplicates(engine: str, engine_full: str) -> bool:
    """Whether a MergeTree table drops a block it has seen (a deduplication window above 0)."""
    if "Replicated" in engine or "Shared" in engine:
        return _window(engine_full, "replicated_deduplication_window") != 0  # the default window is > 0
    return (_window(engine_full, "non_replicated_deduplication_window") or 0) > 0


def _engine_clause_as(engine_full: str, engine: str) -> str:
    """``engine_full`` with its engine call (name and arguments) replaced by plain ``MergeTree``."""
    rest = engine_full[len(engine):] if engine_full.startswith(engine) else engine_full
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
        rest = rest[i + 1:]
    return "MergeTree" + rest


@dataclass(frozen=True)
class StageCheck:
    """What step 5 reads of a stage table."""

    altered: str  # how the target's structure now differs from the stage table's, "" if it does not
    count: int
    partitions: dict[TopicPartition, PartitionStats] | None  # None without the metadata columns


@dataclass
class _Shape:
    """A table's engine, keys and columns (name, type) in order."""

    engine: str
    partition: str
    sorting: str
    primary: str
    columns: list[tuple[str, str]] = field(default_factory=list)


def _difference(stage: _Shape | None, target: _Shape | None) -> str:
    """How ``target`` differs from ``stage``, "" when a move would work.

    Columns and keys are compared; for targets whose engine merges rows, only the partition
    key: their engines extend the sorting key implicitly (VersionedCollapsing adds its version
    column), which the plain MergeTree stage table does not, and a move between them works.
    """
    if stage is None or target is None:
        return "the stage table or the target is gone"
    keys = (stage.partition,) if target.engine in MERGING_ENGINES else (stage.partition, stage.sorting, stage.primary)
    theirs = (target.partition,) if target.engine in MERGING_ENGINES else (target.partition, target.sorting, target.primary)
    if stage.columns == target.columns and keys == theirs:
        return ""
    if stage.columns != target.columns:
        mine, other = dict(stage.columns), dict(target.columns)
        added = [n for n, _ in target.columns if n not in mine]
        gone = [n for n, _ in stage.columns if n not in other]
        parts = ([f"columns added: {', '.join(added)}"] if added else []) + (
            [f"columns dropped: {', '.join(gone)}"] if gone else [])
        return "; ".join(parts) or "column types or order changed"
    return "partition, sorting or primary key changed"


#: Columns and keys of the tables ``{names:Array(String)}`` of ``{db:String}``, as tagged rows of six
#: strings: ('c', table, position, column, type, '') and ('t', table, engine, partition key,
#: sorting key, primary key). Other reads are appended to it with UNION ALL under tags of their
#: own: one round trip, and cheaper in ClickHouse than a JOIN or scalar subqueries.
_SHAPES_SQL = (
    "SELECT 'c', table, toString(position), name, type, '' FROM system.columns "
    "WHERE database = {db:String} AND table IN {names:Array(String)} "
    "UNION ALL SELECT 't', name, engine, partition_key, sorting_key, primary_key FROM system.tables "
    "WHERE database = {db:String} AND name IN {names:Array(String)}"
)


def _shapes_of(rows: list[tuple]) -> dict[str, _Shape]:
    """The shapes in ``_SHAPES_SQL``'s rows, by table, columns in their order (other tags ignored)."""
    tables = {r[1]: r for r in rows if r[0] == "t"}
    shapes: dict[str, _Shape] = {}
    for _, table, position, name, kind, _ in sorted((r for r in rows if r[0] == "c"), key=lambda r: (r[1], int(r[2]))):
        if table in tables:
            _, _, engine, partition, sorting, primary = tables[table]
            shapes.setdefault(table, _Shape(engine, partition, sorting, primary)).columns.append((name, kind))
    return shapes


def _has_metadata(shape: _Shape) -> bool:
    return set(METADATA_COLUMNS) <= {name for name, _ in shape.columns}


def _partition_stats(rows: list[tuple]) -> dict[TopicPartition, PartitionStats]:
    """(topic, partition, rows, min offset, max offset) rows by source partition."""
    return {
        TopicPartition(topic=t, partition=int(p)): PartitionStats(int(n), int(lo), int(hi))
        for t, p, n, lo, hi in rows
    }


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class StageTables:
    """Stage tables of one target table. ``client`` is a clickhouse-connect client.

    ``copy_settings`` go with every ``insert-select`` copy, on top of the client's own: the
    coordinator's client runs ahead of other queries (``coordinator.clickhouse_nice``), a bulk copy
    does not.
    """

    def __init__(self, client: Any, *, database: str, target: str, pipeline: str,
                 publish_mode: Literal["move", "insert-select"] = "move",
                 copy_settings: dict[str, Any] | None = None) -> None:
        self.client = client
        self.copy_settings = copy_settings or {}
        self.database = database
        self.target = target
        self.pipeline = pipeline
        self.publish_mode = publish_mode
        self._metadata: bool | None = None  # whether the last stage table checked had the metadata columns

    def _q(self, table: str) -> str:
        return f"{_ident(self.database)}.{_ident(table)}"

    # ---- checks done once at take-over ----------------------------------------------------

    def check_target(self) -> None:
        """Refuse what cannot work: a missing target, ``move`` into a table with views, and
        ``insert-select`` into a target (or a view's table) that would store a repeated publish twice."""
        rows = self.client.query(
            "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": self.target},
        ).result_rows
        if not rows:
            raise SetupError(
                f"target table {self.database}.{self.target} does not exist: create it (with optional "
                "_topic String, _partition Int32, _offset Int64 columns for exactly-once checks), then restart"
            )
        engine, engine_full = rows[0]
        if "MergeTree" not in engine:
            raise SetupError(f"target table {self.database}.{self.target} has engine {engine}; chtxn needs a MergeTree-family table")
        views = self.dependent_views()
        if views and self.publish_mode == "move":
            raise SetupError(
                f"target table {self.database}.{self.target} has dependent materialized views ({', '.join(views)}), "
                "which do not fire on ALTER TABLE ... MOVE PARTITION: set transaction.publish_mode = \"insert-select\""
            )
        if self.publish_mode == "insert-select" and not _deduplicates(engine, engine_full):
            raise SetupError(
                f"publish_mode insert-select needs deduplication on {self.database}.{self.target} so that a repeated "
                f"publish stores rows once: ALTER TABLE {self.database}.{self.target} MODIFY SETTING "
                "non_replicated_deduplication_window = 1000"
            )
        unsafe = self._view_tables_without_dedup(views) if self.publish_mode == "insert-select" else []
        if unsafe:
            view, table = unsafe[0]
            raise SetupError(
                f"materialized view {view} on {self.database}.{self.target} writes to {table}, which does not "
                "deduplicate, so a repeated publish would count its rows twice there: ALTER TABLE "
                f"{table} MODIFY SETTING non_replicated_deduplication_window = 1000"
            )

    def dependent_views(self) -> list[str]:
        """Materialized views that read from the target (``db.view``), which fire on INSERT only."""
        rows = self.client.query(
            "SELECT dependencies_database, dependencies_table FROM system.tables "
            "WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": self.target},
        ).result_rows
        return sorted(f"{db}.{name}" for dbs, names in rows for db, name in zip(dbs, names))

    def _view_tables_without_dedup(self, views: list[str]) -> list[tuple[str, str]]:
        """(view, its table) for each view whose table would store a repeated publish twice.

        Newer ClickHouse servers (26.x at least) pass a block deduplicated in the target on to the
        views, where only the view's own table can drop it again. Servers whose ``system.tables``
        has no ``target_table`` column are not checked.
        """
        if not views or not int(self.client.command(
            "SELECT count() FROM system.columns WHERE database = 'system' AND table = 'tables' AND name = 'target_table'"
        )):
            return []
        rows = self.client.query(
            "SELECT concat(v.database, '.', v.name), concat(t.database, '.', t.name), t.engine, t.engine_full "
            "FROM system.tables AS v INNER JOIN system.tables AS t "
            "ON t.database = v.target_database AND t.name = v.target_table "
            "WHERE concat(v.database, '.', v.name) IN {views:Array(String)}",
            parameters={"views": views},
        ).result_rows
        return [(view, table) for view, table, engine, full in sorted(rows)
                if "MergeTree" in engine and not _deduplicates(engine, full)]

    # ---- step 2 -----------------------------------------------------------------------------

    def create(self, stage: str) -> None:
        """A clone of the target (columns, keys, storage policy, indices, projections), with dedup
        on; a plain MergeTree when the target's engine merges rows away."""
        self._create_like_target(stage)

    def _create_like_target(self, table: str) -> None:
        engine, engine_full = self._engine(self.target)
        clause = f" ENGINE = {_engine_clause_as(engine_full, engine)}" if engine in MERGING_ENGINES else ""
        self.client.command(f"CREATE TABLE IF NOT EXISTS {self._q(table)} AS {self._q(self.target)}{clause}")
        self.client.command(
            f"ALTER TABLE {self._q(table)} MODIFY SETTING non_replicated_deduplication_window = {STAGE_DEDUP_WINDOW}"
        )

    def _engine(self, table: str) -> tuple[str, str]:
        rows = self.client.query(
            "SELECT engine, engine_full FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": table},
        ).result_rows
        if not rows:
            raise SetupError(f"table {self.database}.{table} does not exist")
        return rows[0][0], rows[0][1]

    # ---- step 5 -----------------------------------------------------------------------------

    def check(self, stage: str) -> StageCheck:
        """Step 5's reads in one query: how the target's structure now differs from ``stage``'s,
        and the rows staged (per source partition when the stage table has the metadata columns).
        A stage table that is gone, or whose metadata columns are not what the last one had, is
        read again by ``_check_slowly``, which says what is missing."""
        per_partition = self._metadata is not False
        staged = (
            "SELECT 's', toString(_topic), toString(_partition), toString(count()), toString(min(_offset)), "
            f"toString(max(_offset)) FROM {self._q(stage)} GROUP BY _topic, _partition"
            if per_partition else f"SELECT 'n', '', toString(count()), '', '', '' FROM {self._q(stage)}"
        )
        try:
            rows = self.client.query(
                f"{_SHAPES_SQL} UNION ALL {staged}", parameters={"db": self.database, "names": [stage, self.target]},
            ).result_rows
        except Exception as exc:
            if error_code(exc) not in (UNKNOWN_TABLE, UNKNOWN_IDENTIFIER):
                raise
            return self._check_slowly(stage)
        shapes = _shapes_of(rows)
        if stage not in shapes or _has_metadata(shapes[stage]) != per_partition:
            return self._check_slowly(stage)
        altered = _difference(shapes[stage], shapes.get(self.target))
        if not per_partition:
            return StageCheck(altered, sum(int(r[2]) for r in rows if r[0] == "n"), None)
        partitions = _partition_stats([r[1:] for r in rows if r[0] == "s"])
        return StageCheck(altered, sum(s.rows for s in partitions.values()), partitions)

    def _check_slowly(self, stage: str) -> StageCheck:
        """``check`` in two queries, whatever the stage table holds."""
        shapes = self._shapes(stage, self.target)
        if stage not in shapes:
            raise StageTableMissing(f"stage table {self.database}.{stage} does not exist")
        altered = _difference(shapes[stage], shapes.get(self.target))
        self._metadata = _has_metadata(shapes[stage])
        if not self._metadata:
            return StageCheck(altered, self.count(stage), None)
        partitions = _partition_stats(self.client.query(
            f"SELECT _topic, _partition, count(), min(_offset), max(_offset) FROM {self._q(stage)} "
            "GROUP BY _topic, _partition"
        ).result_rows)
        return StageCheck(altered, sum(s.rows for s in partitions.values()), partitions)

    def count(self, stage: str) -> int:
        return int(self.client.command(f"SELECT count() FROM {self._q(stage)}"))

    def _shapes(self, *tables: str) -> dict[str, _Shape]:
        """Columns and keys of those of ``tables`` that exist, in one query."""
        return _shapes_of(self.client.query(
            _SHAPES_SQL, parameters={"db": self.database, "names": list(tables)},
        ).result_rows)

    def _columns(self, table: str, *, insertable: bool = False) -> list[tuple[str, str]]:
        kinds = " AND default_kind IN ('', 'DEFAULT')" if insertable else ""
        return [(n, t) for n, t in self.client.query(
            "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}"
            f"{kinds} ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows]

    # ---- step 7 -----------------------------------------------------------------------------

    def publish(self, stage: str, txn: str, on_move: Any = None) -> int:
        """Put the stage table's rows into the target; returns the rows the stage table held.

        Safe to repeat at any point (a partition already moved is gone from the stage table; the
        insert-select is deduplicated). Does not drop the stage table: drop it with
        ``drop_all(stage)`` once the PUBLISHED row is written. Raises ``StageTableMissing`` when
        the stage table does not exist. ``on_move`` is called between partition moves (failpoints).
        A target ALTERed before or during the moves is followed (``_align``) up to
        ``ALIGN_ATTEMPTS`` times in one call; a target that keeps changing fails the call, which
        the caller retries.
        """
        shapes, rows, partition_ids = self._publish_reads(stage, txn)
        if self.publish_mode == "insert-select":
            self._insert_select(self.target, stage, naming.publish_token(self.pipeline, txn))
            return rows
        for attempt in range(1, ALIGN_ATTEMPTS + 1):
            altered = _difference(shapes[stage], shapes.get(self.target))
            if altered:
                log.warning("the target changed after txn %s was staged (%s): aligning its stage table", txn, altered)
                self._align(stage, shapes[stage], shapes.get(self.target))
                partition_ids = None
            try:
                self._move_all(stage, on_move, partition_ids)
                return rows
            except Exception as exc:
                if error_code(exc) != INCOMPATIBLE_COLUMNS or attempt == ALIGN_ATTEMPTS:
                    raise
                shapes, partition_ids = self._shapes(stage, self.target), None  # ALTERed again mid-move
                if stage not in shapes:
                    raise StageTableMissing(f"stage table {self.database}.{stage} of committed txn {txn} "
                                            "does not exist") from None
        raise AssertionError("unreachable")

    def _align(self, stage: str, mine: _Shape, target: _Shape | None) -> None:
        """Make ``stage``'s columns those of the target (names, types, order, default
        expressions), and its sorting key too unless the target's engine merges rows, so that its
        partitions can be moved. Each statement is idempotent; rows keep their values, and a column
        the target gained reads as the target's default, as rows already in the target do."""
        if target is None:
            raise SetupError(f"target table {self.database}.{self.target} does not exist: a committed txn "
                             f"({stage}) cannot be published until it is created again")
        if target.partition != mine.partition:
            raise SetupError(f"the partition key of {self.database}.{self.target} changed after {stage} was staged "
                             f"({mine.partition!r} -> {target.partition!r}); ClickHouse cannot move partitions "
                             "between them: restore the key, or move the stage table's rows by hand")
        ours = dict(mine.columns)
        defs = self._column_defs(self.target)
        adds = []
        for i, (name, kind, default_kind, default) in enumerate(defs):
            if name in ours:
                continue
            where = f"AFTER {_ident(defs[i - 1][0])}" if i else "FIRST"
            expression = f" {default_kind} {default}" if default_kind else ""
            adds.append(f"ADD COLUMN IF NOT EXISTS {_ident(name)} {kind}{expression} {where}")
        if target.engine not in MERGING_ENGINES and target.sorting != mine.sorting:
            adds.append(f"MODIFY ORDER BY ({target.sorting})")
        theirs = {name: kind for name, kind, _, _ in defs}
        changes = [f"MODIFY COLUMN {_ident(name)} {theirs[name]}" for name, kind in mine.columns
                   if name in theirs and theirs[name] != kind]
        drops = [f"DROP COLUMN IF EXISTS {_ident(name)}" for name, _ in mine.columns if name not in theirs]
        for clauses in (adds, changes, drops):
            if clauses:
                self.client.command(f"ALTER TABLE {self._q(stage)} {', '.join(clauses)}",
                                    settings={"mutations_sync": 2, "alter_sync": 2})

    def _column_defs(self, table: str) -> list[tuple[str, str, str, str]]:
        """(name, type, default kind, default expression) of ``table``'s columns, in order."""
        return [tuple(r) for r in self.client.query(  # type: ignore[misc] # rows of four strings
            "SELECT name, type, default_kind, default_expression FROM system.columns "
            "WHERE database = {db:String} AND table = {t:String} ORDER BY position",
            parameters={"db": self.database, "t": table},
        ).result_rows]

    def _publish_reads(self, stage: str, txn: str) -> tuple[dict[str, _Shape], int, list[str] | None]:
        """Before publishing, in one query: the shapes of ``stage`` and the target, the rows
        ``stage`` holds and its partition ids (None when read the long way)."""
        try:
            rows = self.client.query(
                f"{_SHAPES_SQL} UNION ALL SELECT 'n', '', toString(count()), '', '', '' FROM {self._q(stage)} "
                "UNION ALL SELECT DISTINCT 'p', partition_id, '', '', '', '' FROM system.parts "
                "WHERE database = {db:String} AND table = {stage:String} AND active",
                parameters={"db": self.database, "names": [stage, self.target], "stage": stage},
            ).result_rows
        except Exception as exc:
            if error_code(exc) != UNKNOWN_TABLE:
                raise
            shapes, count, partition_ids = self._shapes(stage, self.target), None, None
        else:
            shapes = _shapes_of(rows)
            count = sum(int(r[2]) for r in rows if r[0] == "n")
            partition_ids = sorted(r[1] for r in rows if r[0] == "p")
        if stage not in shapes:
            raise StageTableMissing(f"stage table {self.database}.{stage} of committed txn {txn} does not exist")
        return shapes, self.count(stage) if count is None else count, partition_ids

    def _move_all(self, source: str, on_move: Any = None, partition_ids: list[str] | None = None) -> None:
        ids = self._partition_ids(source) if partition_ids is None else partition_ids
        for i, partition_id in enumerate(ids):
            if i and on_move is not None:
                on_move()
            self.client.command(
                f"ALTER TABLE {self._q(source)} MOVE PARTITION ID '{partition_id}' TO TABLE {self._q(self.target)}"
            )
        left = self.count(source)
        if left:
            raise RuntimeError(f"table {source} still holds {left} rows after moving every partition")

    def _insert_select(self, into: str, source: str, token: str) -> None:
        """A deduplicated copy of ``source`` into ``into``, by the columns they share (by name)."""
        theirs = {name for name, _ in self._columns(source)}
        columns = ", ".join(_ident(n) for n, _ in self._columns(into, insertable=True) if n in theirs)
        self.client.command(
            f"INSERT INTO {self._q(into)} ({columns}) SELECT {columns} FROM {self._q(source)} ORDER BY ALL",
            settings={
                "insert_deduplication_token": token,
                "insert_deduplicate": 1,
                "deduplicate_blocks_in_dependent_materialized_views": 1,
                "async_insert": 0,
                **self.copy_settings,
            },
        )

    def drop_all(self, stage: str) -> None:
        """Drop a stage table, then the tables named after it: probe tables a participant made
        while isolating bad records, and restage tables earlier versions made (``naming.is_side_table``).
        The stage table goes first, so nothing is ever left that a publish could copy again."""
        self.drop(stage)
        failpoints.hit("stage.mid-drop")
        for table in self._side_tables(stage):
            self.drop(table)

    def _side_tables(self, stage: str) -> list[str]:
        rows = self.client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String}) ORDER BY name",
            parameters={"db": self.database, "p": stage},
        ).result_rows
        return [name for (name,) in rows if naming.is_side_table(stage, name)]

    def _partition_ids(self, stage: str) -> list[str]:
        rows = self.client.query(
            "SELECT DISTINCT partition_id FROM system.parts WHERE database = {db:String} AND table = {t:String} AND active",
            parameters={"db": self.database, "t": stage},
        ).result_rows
        return sorted(r[0] for r in rows)

    # ---- clean-up ---------------------------------------------------------------------------

    def drop(self, stage: str) -> None:
        self.client.command(f"DROP TABLE IF EXISTS {self._q(stage)}")

    def exists(self, stage: str) -> bool:
        return bool(int(self.client.command(
            "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": self.database, "t": stage},
        )))

    def existing(self) -> dict[str, str]:
        """Every stage table of this pipeline into this target now in the database, by txn id
        (tables named after a stage table, ``naming.is_side_table``, are found through its txn)."""
        prefix = naming.stage_table_prefix(self.target, self.pipeline)
        rows = self.client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String}) ORDER BY name",
            parameters={"db": self.database, "p": prefix},
        ).result_rows
        found = {}
        for (name,) in rows:
            txn = naming.txn_of_stage_table(self.target, self.pipeline, name)
            if txn is not None:
                found[txn] = naming.stage_table(self.target, self.pipeline, txn)
        return found
