"""The stage tables of a txn across the pipeline's target tables (``[[route]]``): one txn, many tables.

A txn names its stage tables in one text, ``naming.txn_stages``: one per target table that receives
rows in it, comma-separated, "" for none. A table whose partitions have no records waiting gets no
stage table in a txn (``protocol.coordinator.flight``), so idle tables cost a txn nothing.
``StageSet`` answers for the named stage tables with the methods of ``coordinator.stage.tables.StageTables``,
and reads what it can of all of them in one query:

- ``create``: each stage table (commit step 2), after one read of every target's definition;
- ``check``: every one's, merged, in one query: the rows and per-partition stats of all (the routes
  send a partition to one table, so they never overlap), and the first structural difference found,
  which aborts the whole txn (commit step 5);
- ``publish``: each one's, one after the other in route order (commit step 7), after one read of
  what they all hold and before one check that nothing was left behind; each is safe to repeat, so a
  leader that rolls a half-published txn forward publishes the rest and moves nothing twice
  (failpoint ``leader.between-table-publishes``);
- ``drop``/``drop_all``/``exists``/``count``/``existing``: over the named ones, or every table.

With one table (the one-table form) it is that table's ``StageTables`` and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from clients import failpoints
from clients.clickhouse import error_code
from coordinator.stage.publish import PublishReads
from coordinator.stage.tables import Definition, StageCheck, StageTables
from protocol import naming
from protocol.chcodes import SYNTAX_ERROR, UNKNOWN_IDENTIFIER, UNKNOWN_TABLE
from protocol.tables.replicated_ddl import drop_tables_sql
from protocol.tables.shape import (
    SHAPES_SQL,
    TABLE_DEFINITIONS_SQL,
    counts_sql,
    difference,
    has_metadata,
    partition_stats,
    publish_reads_of_sql,
    shapes_of,
    staged_sql,
)


class StageSet:
    """The stage tables of the pipeline's ``tables`` (``{table: StageTables}``, in route order). No I/O
    in the constructor."""

    def __init__(self, tables: Mapping[str, StageTables], *, coordinator: str = "") -> None:
        if not tables:
            raise ValueError("a StageSet needs at least one target table")
        self.tables = dict(tables)
        self.coordinator = coordinator
        first = next(iter(self.tables.values()))
        # what callers read of a StageTables: the client, the database, the pipeline
        self.client, self.database = first.client, first.database
        self.pipeline = first.pipeline
        self._multi_drop: bool | None = None  # whether the server drops several tables in one statement

    def stages(self, stages: str) -> dict[str, str]:
        """``stages`` (``naming.txn_stages``) by target table, in route order."""
        found: dict[str, str] = {}
        marker = f"{naming.STAGE_MARKER}{self.pipeline}__"
        for name in naming.split_stages(stages):
            table = name[: name.rfind(marker)] if marker in name else ""
            if table not in self.tables or not naming.txn_of_stage_table(table, self.pipeline, name):
                raise ValueError(
                    f"{name} is not a stage table of pipeline {self.pipeline} into {', '.join(self.tables)}"
                )
            found[table] = name
        return {table: found[table] for table in self.tables if table in found}

    def every(self, txn: str) -> str:
        """The stage tables ``txn`` would have in every table (for clean-up: which it has is not known)."""
        return naming.txn_stages(self.tables, self.pipeline, txn)

    def _each(self, stages: str, call: Callable[[StageTables, str], Any]) -> list[Any]:
        return [call(self.tables[table], name) for table, name in self.stages(stages).items()]

    # ---- the commit steps -------------------------------------------------------------------

    def create(self, stages: str) -> None:
        named = self.stages(stages)
        if len(named) == 1:
            table, name = next(iter(named.items()))
            self.tables[table].create(name)
            return
        definitions = self._definitions(list(named))
        for table, name in named.items():
            self.tables[table].create(name, definitions.get(table))

    def _definitions(self, tables: list[str]) -> dict[str, Definition]:
        """The definitions of ``tables`` (those that exist), in one query."""
        if not tables:
            return {}
        rows = self.client.query(TABLE_DEFINITIONS_SQL, parameters={"db": self.database, "names": tables}).result_rows
        return {name: (engine, full, uuid, database) for name, engine, full, uuid, database in rows}

    def check(self, stages: str) -> StageCheck:
        named = self.stages(stages)
        if not named:
            return StageCheck("", 0, {})  # no table received rows: nothing staged, nothing to check
        if len(named) == 1:
            table, name = next(iter(named.items()))
            return self.tables[table].check(name)
        found = self._check_at_once(named)
        if found is not None:
            return found
        checks = [self.tables[table].check(name) for table, name in named.items()]
        altered = "; ".join(f"{t}: {c.altered}" for t, c in zip(named, checks) if c.altered)
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
        if not all(self.tables[t].metadata_known for t in stages):
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

    def publish(self, stages: str, txn: str, on_move: Any = None) -> int:
        named = self.stages(stages)
        if len(named) <= 1:
            return sum(self.tables[table].publish(name, txn, on_move) for table, name in named.items())
        reads = self._publish_reads(named)
        rows = 0
        for i, (table, name) in enumerate(named.items()):
            if i:
                failpoints.hit("leader.between-table-publishes", self.coordinator)
            given = reads.get(name) if reads is not None else None
            rows += self.tables[table].publish(name, txn, on_move, reads=given, verify=reads is None)
        if reads is not None:  # insert-select copies: only the moved stage tables are empty now
            self._verify_emptied({t: n for t, n in named.items() if self.tables[t].publish_mode == "move"})
        return rows

    def _publish_reads(self, stages: dict[str, str]) -> dict[str, PublishReads] | None:
        """What each stage table's publish reads first, for all in one query; None when some stage table
        is missing (each table's publish then reads its own, and says which)."""
        qualified = {name: self.tables[table].qualified(name) for table, name in stages.items()}
        try:
            rows = self.client.query(
                publish_reads_of_sql(qualified),
                parameters={"db": self.database, "names": [*stages.values(), *stages], "stages": list(qualified)},
            ).result_rows
        except Exception as exc:
            if error_code(exc) != UNKNOWN_TABLE:
                raise
            return None
        shapes = shapes_of(rows)
        return {
            name: (
                {name: shapes[name], **({table: shapes[table]} if table in shapes else {})},
                sum(int(r[2]) for r in rows if r[0] == "n" and r[1] == name),
                sorted(r[1] for r in rows if r[0] == "p" and r[2] == name),
            )
            for table, name in stages.items()
            if name in shapes
        }

    def _verify_emptied(self, stages: dict[str, str]) -> None:
        """After every table's moves: no stage table still holds a row (one query for all)."""
        names = list(stages.values())
        if not names:
            return
        rows = self.client.query(counts_sql([self.tables[t].qualified(n) for t, n in stages.items()])).result_rows
        if left := {names[int(i)]: int(n) for i, n in rows if int(n)}:
            held = ", ".join(f"{name} ({n} rows)" for name, n in left.items())
            raise RuntimeError(f"stage tables still hold rows after moving every partition: {held}")

    # ---- clean-up ---------------------------------------------------------------------------

    def drop(self, stages: str) -> None:
        """Drop the stage tables named: in one ``DROP TABLE a, b, ...`` (ClickHouse 24.2+) on a single
        server, one statement each on a cluster or an older server."""
        named = self.stages(stages)
        one = next(iter(self.tables.values()))
        if len(named) > 1 and not one.cluster and self._multi_drop is not False:
            try:
                self.client.command(drop_tables_sql([self.tables[t].qualified(n) for t, n in named.items()]))
                self._multi_drop = True
                return
            except Exception as exc:
                if error_code(exc) != SYNTAX_ERROR or self._multi_drop:
                    raise
                self._multi_drop = False
        self._each(stages, StageTables.drop)

    def drop_all(self, stages: str) -> None:
        self._each(stages, StageTables.drop_all)

    def exists(self, stages: str) -> bool:
        """Whether any of the stage tables named is there."""
        return any(self._each(stages, StageTables.exists))

    def count(self, stages: str) -> int:
        """Rows in those of the stage tables named that exist."""
        named = [(self.tables[table], name) for table, name in self.stages(stages).items()]
        return sum(tables.count(name) for tables, name in named if tables.exists(name))

    def existing(self) -> dict[str, str]:
        """Every txn with a stage table in some table, by txn id, with its stage tables in every table
        (``every``: which of them it has is for ``drop_all``/``count`` to find)."""
        txns = {txn for tables in self.tables.values() for txn in tables.existing()}
        return {txn: self.every(txn) for txn in sorted(txns)}


#: One table's stage tables, or a set (every shard's, ``coordinator.stage.shards.Stages``, adds the sharded).
OneServer = StageTables | StageSet


@contextmanager
def adopting(
    stages: OneServer, tables: Iterable[str], publish_mode_of: Callable[[str], Literal["move", "insert-select"]]
) -> Iterator[None]:
    """``tables`` are targets of ``stages`` too while the block runs: the take-over of a leader whose
    routes no longer name a table that committed txns still go to (publish them, drop its orphans)."""
    added = [t for t in tables if isinstance(stages, StageTables) or t not in stages.tables]
    if not added:
        yield
        return
    if not isinstance(stages, StageSet):
        raise ValueError(f"one table's stage tables cannot publish into {', '.join(added)}")
    one = next(iter(stages.tables.values()))
    for table in added:
        stages.tables[table] = StageTables(
            one.client,
            database=one.database,
            target=table,
            pipeline=one.pipeline,
            publish_mode=publish_mode_of(table),
            copy_settings=one.copy_settings,
            cluster=one.cluster,
        )
    try:
        yield
    finally:
        for table in added:
            del stages.tables[table]
