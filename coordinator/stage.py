"""Stage tables: create (step 2), count (step 5), publish (step 7), drop, and find orphans.

Every call here is idempotent, so a new leader can roll any of them forward after a crash.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from protocol import naming
from protocol.errors import SetupError

log = logging.getLogger(__name__)

#: Blocks a stage table remembers for deduplication: more than the chunks of any one txn.
STAGE_DEDUP_WINDOW = 100_000


def _deduplicates(engine: str, engine_full: str) -> bool:
    """Whether a MergeTree table drops a block it has seen (within its deduplication window)."""
    return "Replicated" in engine or "Shared" in engine or "non_replicated_deduplication_window" in engine_full


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class StageTables:
    """Stage tables of one target table. ``client`` is a clickhouse-connect client."""

    def __init__(self, client: Any, *, database: str, target: str, pipeline: str,
                 publish_mode: Literal["move", "insert-select"] = "move") -> None:
        self.client = client
        self.database = database
        self.target = target
        self.pipeline = pipeline
        self.publish_mode = publish_mode

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
        """A clone of the target (same engine, keys, storage policy, indices, projections), with dedup on."""
        self.client.command(f"CREATE TABLE IF NOT EXISTS {self._q(stage)} AS {self._q(self.target)}")
        self.client.command(
            f"ALTER TABLE {self._q(stage)} MODIFY SETTING non_replicated_deduplication_window = {STAGE_DEDUP_WINDOW}"
        )

    # ---- step 5 -----------------------------------------------------------------------------

    def count(self, stage: str) -> int:
        return int(self.client.command(f"SELECT count() FROM {self._q(stage)}"))

    # ---- step 7 -----------------------------------------------------------------------------

    def publish(self, stage: str, txn: str) -> int:
        """Move the stage table's rows into the target and drop it; returns the rows moved now.

        Safe to repeat at any point: a partition already moved is gone from the stage table, and
        a stage table already dropped means the publish had finished.
        """
        if not self.exists(stage):
            return 0
        rows = self.count(stage)
        if self.publish_mode == "move":
            for partition_id in self._partition_ids(stage):
                self.client.command(
                    f"ALTER TABLE {self._q(stage)} MOVE PARTITION ID '{partition_id}' TO TABLE {self._q(self.target)}"
                )
            left = self.count(stage)
            if left:
                raise RuntimeError(f"stage table {stage} still holds {left} rows after moving every partition")
        else:
            self.client.command(
                f"INSERT INTO {self._q(self.target)} SELECT * FROM {self._q(stage)} ORDER BY ALL",
                settings={
                    "insert_deduplication_token": naming.publish_token(self.pipeline, txn),
                    "insert_deduplicate": 1,
                    "deduplicate_blocks_in_dependent_materialized_views": 1,
                    "async_insert": 0,
                },
            )
        self.drop(stage)
        return rows

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
        """Every stage table of this target now in the database, by txn id."""
        prefix = naming.stage_table_prefix(self.target)
        rows = self.client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND startsWith(name, {p:String})",
            parameters={"db": self.database, "p": prefix},
        ).result_rows
        found = {}
        for (name,) in rows:
            txn = naming.txn_of_stage_table(self.target, name)
            if txn is not None:
                found[txn] = name
        return found
