"""The stage tables of a txn across the pipeline's target tables (``[[route]]``): one txn, many tables.

A txn is known to the leader's state machine by one stage table name, that of its first table (the
"primary"); ``StageSet`` expands it to the txn's stage table in every target table of the routes
(``protocol.naming.stage_table(table, pipeline, txn)``) and answers for them all, with the methods
of ``coordinator.stage.StageTables``:

- ``create``: every table's stage table (commit step 2);
- ``check``: every table's, merged: the rows and per-partition stats of all (the routes send a
  partition to one table, so they never overlap), and the first structural difference found, which
  aborts the whole txn (commit step 5);
- ``publish``: every table's, one after the other in route order (commit step 7); each is safe to
  repeat, so a leader that rolls a half-published txn forward publishes the rest and moves nothing
  twice (failpoint ``leader.between-table-publishes``);
- ``drop``/``drop_all``/``exists``/``count``/``existing``: over every table.

With one table (the one-table form) it is that table's ``StageTables`` and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from clients import failpoints
from clients.clickhouse import error_code
from coordinator.stage import StageCheck, StageTables
from protocol import naming
from protocol.chcodes import UNKNOWN_IDENTIFIER, UNKNOWN_TABLE
from protocol.table_shape import SHAPES_SQL, difference, has_metadata, partition_stats, shapes_of, staged_sql


class StageSet:
    """The stage tables of the pipeline's ``tables`` (``{table: StageTables}``, in route order). No I/O
    in the constructor."""

    def __init__(self, tables: Mapping[str, StageTables], *, coordinator: str = "") -> None:
        if not tables:
            raise ValueError("a StageSet needs at least one target table")
        self.tables = dict(tables)
        self.primary = next(iter(self.tables.values()))
        self.coordinator = coordinator
        # what callers read of a StageTables: the client, the database, the pipeline, how it publishes
        self.client, self.database = self.primary.client, self.primary.database
        self.pipeline, self.publish_mode = self.primary.pipeline, self.primary.publish_mode
        self.target = self.primary.target

    def stages(self, stage: str) -> dict[str, str]:
        """``stage`` (the primary table's stage table of a txn) -> that txn's stage table of every table."""
        txn = naming.txn_of_stage_table(self.primary.target, self.pipeline, stage)
        if txn is None:
            raise ValueError(f"{stage} is not a stage table of {self.pipeline} into {self.primary.target}")
        return {table: naming.stage_table(table, self.pipeline, txn) for table in self.tables}

    def _each(self, stage: str, call: Callable[[StageTables, str], Any]) -> list[Any]:
        return [call(self.tables[table], name) for table, name in self.stages(stage).items()]

    # ---- the commit steps -------------------------------------------------------------------

    def create(self, stage: str) -> None:
        self._each(stage, StageTables.create)

    def check(self, stage: str) -> StageCheck:
        if len(self.tables) == 1:
            return self.primary.check(stage)
        found = self._check_at_once(self.stages(stage))
        if found is not None:
            return found
        checks = self._each(stage, StageTables.check)
        altered = "; ".join(f"{t}: {c.altered}" for t, c in zip(self.tables, checks) if c.altered)
        if len(checks) == 1:
            return checks[0]
        partitions: dict[Any, Any] | None = {}
        for check in checks:
            if check.partitions is None or partitions is None:
                partitions = None
                continue
            partitions.update(check.partitions)
        return StageCheck(altered, sum(c.count for c in checks), partitions)

    def _check_at_once(self, stages: dict[str, str]) -> StageCheck | None:
        """Every table's step-5 reads in one query (one round trip however many tables), once every
        stage table checked before had the metadata columns; None sends the caller to the checks table
        by table, which say what is missing (a stage table gone, metadata columns not there)."""
        if not all(t.metadata_known for t in self.tables.values()):
            return None
        for table, name in stages.items():
            self.tables[table].sync(name)
        staged = " UNION ALL ".join(
            staged_sql(self.tables[t].qualified(name), per_partition=True) for t, name in stages.items()
        )
        try:
            rows = self.client.query(
                f"{SHAPES_SQL} UNION ALL {staged}",
                parameters={"db": self.database, "names": [*stages.values(), *stages]},
            ).result_rows
        except Exception as exc:
            if error_code(exc) not in (UNKNOWN_TABLE, UNKNOWN_IDENTIFIER):
                raise
            return None
        shapes = shapes_of(rows)
        if any(name not in shapes or not has_metadata(shapes[name]) for name in stages.values()):
            return None
        altered = "; ".join(
            f"{table}: {diff}"
            for table, name in stages.items()
            if (diff := difference(shapes[name], shapes.get(table)))
        )
        partitions = partition_stats([r[1:] for r in rows if r[0] == "s"])
        return StageCheck(altered, sum(p.rows for p in partitions.values()), partitions)

    def publish(self, stage: str, txn: str, on_move: Any = None) -> int:
        rows = 0
        for i, (table, name) in enumerate(self.stages(stage).items()):
            if i:
                failpoints.hit("leader.between-table-publishes", self.coordinator)
            rows += self.tables[table].publish(name, txn, on_move)
        return rows

    # ---- clean-up ---------------------------------------------------------------------------

    def drop(self, stage: str) -> None:
        self._each(stage, StageTables.drop)

    def drop_all(self, stage: str) -> None:
        self._each(stage, StageTables.drop_all)

    def exists(self, stage: str) -> bool:
        """Whether the txn's stage table of any table is there."""
        return any(self._each(stage, StageTables.exists))

    def count(self, stage: str) -> int:
        """Rows in the txn's stage tables that exist."""
        return sum(
            t.count(name) for t, name in zip(self.tables.values(), self.stages(stage).values()) if t.exists(name)
        )

    def existing(self) -> dict[str, str]:
        """Every txn with a stage table in some table, by txn id, named by its primary stage table."""
        txns = {txn for tables in self.tables.values() for txn in tables.existing()}
        return {txn: naming.stage_table(self.primary.target, self.pipeline, txn) for txn in sorted(txns)}


#: What the leader, its take-over and its publisher work with: one table's stage tables, or a set.
Stages = StageTables | StageSet
