"""Stage tables: create (commit step 2), count (commit step 5), publish (commit step 7), drop, and
find orphans. Their shapes are compared by ``protocol.tables.shape``; the target itself is checked
at take-over by ``clients.target_table``.

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
  atomic on one server), so a publish repeated at any point, by any leader, after any number of
  ALTERs, moves each row once: there is no second copy whose deduplication memory could be lost.
  Between replicated tables a move is two Keeper writes, and a ClickHouse crash between them
  leaves the rows in both (docs/clusters.md).
- Every name and every clean-up is scoped by the pipeline (``protocol.naming``).
- A stage table of a ``Replicated*`` or ``Shared*`` target is a table of that family with a Keeper
  path of its own (``protocol.tables.replicated_ddl``), made and dropped ``ON CLUSTER`` when ``cluster`` is
  set, so it exists on every replica of the target. Before step 5 counts it and before publish
  moves it, this replica fetches every part the others have (``SYSTEM SYNC REPLICA ...
  LIGHTWEIGHT``): a count on a lagging replica would miss rows, and a move from one would drop the
  rows it lacks (the move's DROP_RANGE covers the whole partition). Drops are ``SYNC``, so a
  stage table made again after a crash finds its Keeper path free.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from clients.clickhouse import error_code
from coordinator.stage.publish import StagePublishing, StageTableMissing
from protocol import naming
from protocol.chcodes import SYNTAX_ERROR, UNKNOWN_IDENTIFIER, UNKNOWN_SETTING, UNKNOWN_TABLE
from protocol.coordinator.events import PartitionStats
from protocol.errors import SetupError
from protocol.messages import TopicPartition
from protocol.tables import replicated_ddl
from protocol.tables.shape import (
    SHAPES_SQL,
    TABLE_DEFINITION_SQL,
    TABLE_EXISTS_SQL,
    TABLES_STARTING_WITH_SQL,
    Shape,
    columns_sql,
    difference,
    engine_clause_as,
    has_metadata,
    ident,
    merges_rows,
    partition_rows_sql,
    partition_stats,
    shapes_of,
    staged_sql,
)

log = logging.getLogger(__name__)

#: Blocks a stage table remembers for deduplication: more than the chunks of any one txn.
STAGE_DEDUP_WINDOW = 100_000
#: Seconds a replicated stage table remembers a block (the server's default is an hour since 25.10).
STAGE_DEDUP_WINDOW_S = 7 * 86400
#: A stage table merges only when this many of a partition's parts can merge at once
#: (``min_parts_to_merge_at_once``): a txn's few dozen chunks move into the target unmerged and are
#: merged there once, as rows inserted directly would be, instead of twice (measured: the stage
#: tables' merges doubled chtxn's merge CPU, benchmarks/README.md). A txn of many more chunks per
#: partition still merges in its stage table, far from ``parts_to_delay_insert`` (1000).
STAGE_MIN_PARTS_TO_MERGE = 50


#: (engine, engine_full, UUID or "", database engine) of a target table (``TABLE_DEFINITION_SQL``).
Definition = tuple[str, str, str, str]


@dataclass(frozen=True)
class StageCheck:
    """What commit step 5 reads of a stage table."""

    altered: str  # how the target's structure now differs from the stage table's, "" if it does not
    count: int
    partitions: dict[TopicPartition, PartitionStats] | None  # None without the metadata columns


class StageTables(StagePublishing):
    """Stage tables of one target table. ``client`` is a clickhouse-connect client.

    ``copy_settings`` go with every ``insert-select`` copy, on top of the client's own: the
    coordinator's client runs ahead of other queries (``coordinator.clickhouse_nice``), a bulk copy
    does not. ``cluster`` (``clickhouse.cluster``) makes stage tables and drops them ``ON CLUSTER``.
    """

    def __init__(
        self,
        client: Any,
        *,
        database: str,
        target: str,
        pipeline: str,
        publish_mode: Literal["move", "insert-select"] = "move",
        copy_settings: dict[str, Any] | None = None,
        cluster: str = "",
    ) -> None:
        self.client = client
        self.copy_settings = copy_settings or {}
        self.database = database
        self.target = target
        self.pipeline = pipeline
        self.publish_mode = publish_mode
        self.cluster = cluster
        self._metadata: bool | None = None  # whether the last stage table checked had the metadata columns
        self._replicated: bool | None = None  # whether the target keeps its parts in Keeper, once read
        self._settings_in_create: bool | None = None  # whether the server takes CREATE ... AS t SETTINGS
        self._few_merges: bool | None = None  # whether the server knows min_parts_to_merge_at_once

    def _q(self, table: str) -> str:
        return f"{ident(self.database)}.{ident(table)}"

    # ---- commit step 2 ----------------------------------------------------------------------

    def create(self, stage: str, definition: Definition | None = None) -> None:
        """A clone of the target (columns, keys, storage policy, indices, projections), with dedup
        on and few merges (``STAGE_MIN_PARTS_TO_MERGE``, on a server that knows the setting); the
        plain MergeTree of the target's family when the target's engine merges rows away; a Keeper
        path of its own when the target is replicated (module docstring). ``definition``: the
        target's, when the caller read it (``StageSet`` reads every table's in one query)."""
        found = self._definition() if definition is None else self._learn(definition)
        if found is None:
            raise SetupError(f"table {self.database}.{self.target} does not exist")
        try:
            self._create(stage, found, few_merges=self._few_merges is not False)
        except Exception as exc:
            if error_code(exc) != UNKNOWN_SETTING or self._few_merges is not None:
                raise
            self._few_merges = False  # a server before min_parts_to_merge_at_once: merges as the target's
            self._create(stage, found, few_merges=False)
        else:
            self._few_merges = self._few_merges is not False

    def _create(self, stage: str, found: Definition, *, few_merges: bool) -> None:
        merges = {"min_parts_to_merge_at_once": STAGE_MIN_PARTS_TO_MERGE} if few_merges else {}
        clause = self._engine_clause(stage, found, merges)
        create = (
            f"CREATE TABLE IF NOT EXISTS {self._q(stage)}{replicated_ddl.on_cluster(self.cluster)} "
            f"AS {self._q(self.target)}{clause}"
        )
        if self._replicated:
            self.client.command(create)
            return
        ours = {"non_replicated_deduplication_window": STAGE_DEDUP_WINDOW, **merges}
        settings = ", ".join(f"{name} = {value}" for name, value in ours.items())
        if not clause and self._settings_in_create is not False:
            try:  # one statement: the clone's settings with ours added (ClickHouse 26.9 merges them)
                self.client.command(f"{create} SETTINGS {settings}")
                self._settings_in_create = True
                return
            except Exception as exc:
                if error_code(exc) != SYNTAX_ERROR or self._settings_in_create:
                    raise
                self._settings_in_create = False  # an older server: a statement of its own, as below
        self.client.command(create)
        self.client.command(
            f"ALTER TABLE {self._q(stage)}{replicated_ddl.on_cluster(self.cluster)} MODIFY SETTING {settings}"
        )

    def _engine_clause(self, stage: str, found: Definition, merges: dict[str, int]) -> str:
        """`` ENGINE = ...`` of stage table ``stage`` when it cannot be the target's (replicated, or
        merging rows away), else ""."""
        engine, engine_full, uuid, database_engine = found
        if self._replicated:
            text = replicated_ddl.stage_engine(
                engine_full,
                database=self.database,
                table=self.target,
                uuid=uuid,
                stage=stage,
                replicated_database=database_engine == "Replicated",
                settings={
                    "replicated_deduplication_window": STAGE_DEDUP_WINDOW,
                    "replicated_deduplication_window_seconds": STAGE_DEDUP_WINDOW_S,
                    **merges,
                },
            )
            return f" ENGINE = {text}"
        if merges_rows(engine):
            return f" ENGINE = {engine_clause_as(engine_full, engine)}"
        return ""

    def _definition(self) -> Definition | None:
        """(engine, engine_full, UUID, database engine) of the target, None when it is gone."""
        rows = self.client.query(TABLE_DEFINITION_SQL, parameters={"db": self.database, "t": self.target}).result_rows
        return self._learn(tuple(rows[0])) if rows else None

    def _learn(self, definition: Definition) -> Definition:
        self._replicated = bool(replicated_ddl.family(definition[0]))
        return definition

    def _is_replicated(self) -> bool:
        """Whether the target keeps its parts in Keeper (read once, unless ``create`` read it; a
        missing target reads as not: the caller's reads then say what is missing)."""
        if self._replicated is None:
            self._definition()
        return bool(self._replicated)

    def qualified(self, table: str) -> str:
        """``table`` of this target's database, quoted for SQL."""
        return self._q(table)

    @property
    def metadata_known(self) -> bool:
        """Whether the last stage table checked had the metadata columns (False also when none was yet)."""
        return self._metadata is True

    def sync(self, stage: str) -> None:
        """``_sync``: fetch what other replicas have of ``stage`` before it is read."""
        self._sync(stage)

    def _sync(self, stage: str) -> None:
        """On a replicated target, fetch every part of ``stage`` other replicas have (a no-op on a
        single server). A missing stage table is left for the caller's reads to report."""
        if not self._is_replicated():
            return
        try:
            self.client.command(f"SYSTEM SYNC REPLICA {self._q(stage)} LIGHTWEIGHT")
        except Exception as exc:
            if error_code(exc) != UNKNOWN_TABLE:
                raise

    # ---- commit step 5 ----------------------------------------------------------------------

    def check(self, stage: str) -> StageCheck:
        """Commit step 5's reads in one query: how the target's structure now differs from ``stage``'s,
        and the rows staged (per source partition when the stage table has the metadata columns).
        A stage table that is gone, or whose metadata columns are not what the last one had, is
        read again by ``_check_slowly``, which says what is missing."""
        self._sync(stage)
        per_partition = self._metadata is not False
        staged = staged_sql(self._q(stage), per_partition=per_partition)
        try:
            rows = self.client.query(
                f"{SHAPES_SQL} UNION ALL {staged}",
                parameters={"db": self.database, "names": [stage, self.target]},
            ).result_rows
        except Exception as exc:
            if error_code(exc) not in (UNKNOWN_TABLE, UNKNOWN_IDENTIFIER):
                raise
            return self._check_slowly(stage)
        shapes = shapes_of(rows)
        if stage not in shapes or has_metadata(shapes[stage]) != per_partition:
            return self._check_slowly(stage)
        altered = difference(shapes[stage], shapes.get(self.target))
        self._metadata = per_partition
        if not per_partition:
            return StageCheck(altered, sum(int(r[2]) for r in rows if r[0] == "n"), None)
        partitions = partition_stats([r[1:] for r in rows if r[0] == "s"])
        return StageCheck(altered, sum(s.rows for s in partitions.values()), partitions)

    def _check_slowly(self, stage: str) -> StageCheck:
        """``check`` in two queries, whatever the stage table holds."""
        shapes = self._shapes(stage, self.target)
        if stage not in shapes:
            raise StageTableMissing(f"stage table {self.database}.{stage} does not exist")
        altered = difference(shapes[stage], shapes.get(self.target))
        self._metadata = has_metadata(shapes[stage])
        if not self._metadata:
            return StageCheck(altered, self.count(stage), None)
        partitions = partition_stats(self.client.query(partition_rows_sql(self._q(stage))).result_rows)
        return StageCheck(altered, sum(s.rows for s in partitions.values()), partitions)

    def count(self, stage: str) -> int:
        return int(self.client.command(f"SELECT count() FROM {self._q(stage)}"))

    def _shapes(self, *tables: str) -> dict[str, Shape]:
        """Columns and keys of those of ``tables`` that exist, in one query."""
        return shapes_of(
            self.client.query(
                SHAPES_SQL,
                parameters={"db": self.database, "names": list(tables)},
            ).result_rows
        )

    def _columns(self, table: str, *, insertable: bool = False) -> list[tuple[str, str]]:
        sql = columns_sql(insertable=insertable)
        return [(n, t) for n, t in self.client.query(sql, parameters={"db": self.database, "t": table}).result_rows]

    # ---- clean-up ---------------------------------------------------------------------------

    def drop(self, stage: str) -> None:
        """Drop ``stage`` (on every replica with ``cluster``) and wait until it is gone, its Keeper
        path with it."""
        self.client.command(replicated_ddl.drop_table_sql(self._q(stage), cluster=self.cluster))

    def exists(self, stage: str) -> bool:
        return bool(int(self.client.command(TABLE_EXISTS_SQL, parameters={"db": self.database, "t": stage})))

    def existing(self) -> dict[str, str]:
        """Every stage table of this pipeline into this target now in the database, by txn id
        (tables named after a stage table, ``naming.is_side_table``, are found through its txn)."""
        prefix = naming.stage_table_prefix(self.target, self.pipeline)
        rows = self.client.query(TABLES_STARTING_WITH_SQL, parameters={"db": self.database, "p": prefix}).result_rows
        found = {}
        for (name,) in rows:
            txn = naming.txn_of_stage_table(self.target, self.pipeline, name)
            if txn is not None:
                found[txn] = naming.stage_table(self.target, self.pipeline, txn)
        return found
