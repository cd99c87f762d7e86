"""Commit step 7 of ``coordinator.stage.tables.StageTables``: put a committed txn's stage table rows into
the target (``publish``), then drop it and the tables named after it (``drop_all``). A mixin:
``StageTables`` is the class to use; the guarantees are in ``coordinator.stage.tables``'s docstring.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Literal

from clients import failpoints
from clients.clickhouse import error_code
from protocol import naming
from protocol.chcodes import INCOMPATIBLE_COLUMNS, UNKNOWN_TABLE
from protocol.errors import ChtxnError, SetupError
from protocol.tables.shape import (
    COLUMN_DEFS_SQL,
    PARTITION_IDS_SQL,
    TABLES_STARTING_WITH_SQL,
    Shape,
    alignment,
    difference,
    ident,
    publish_reads_sql,
    shapes_of,
)

log = logging.getLogger("coordinator.stage.tables")  # the stage tables' lines, wherever their code lives

#: Times one ``publish`` call aligns the stage table with a target ALTERed while it moves.
ALIGN_ATTEMPTS = 3

#: What publish reads first: the shapes of the stage table and the target, the rows the stage table
#: holds, and its partition ids (None when read the long way).
PublishReads = tuple[dict[str, Shape], int, list[str] | None]


class StageTableMissing(ChtxnError):
    """A committed txn's stage table is gone before its rows reached the target."""


class StagePublishing(ABC):
    """Publish and drop, for ``StageTables``, which gives them the table, its client and these reads."""

    client: Any
    database: str
    target: str
    pipeline: str
    publish_mode: Literal["move", "insert-select"]
    copy_settings: dict[str, Any]

    @abstractmethod
    def _q(self, table: str) -> str: ...

    @abstractmethod
    def _sync(self, stage: str) -> None: ...

    @abstractmethod
    def _shapes(self, *tables: str) -> dict[str, Shape]: ...

    @abstractmethod
    def _columns(self, table: str, *, insertable: bool = False) -> list[tuple[str, str]]: ...

    @abstractmethod
    def count(self, stage: str) -> int: ...

    @abstractmethod
    def drop(self, stage: str) -> None: ...

    def publish(
        self, stage: str, txn: str, on_move: Any = None, *, reads: PublishReads | None = None, verify: bool = True
    ) -> int:
        """Put the stage table's rows into the target; returns the rows the stage table held.

        Safe to repeat at any point (a partition already moved is gone from the stage table; the
        insert-select is deduplicated). Does not drop the stage table: drop it with
        ``drop_all(stage)`` once the PUBLISHED row is written. Raises ``StageTableMissing`` when
        the stage table does not exist. ``on_move`` is called between partition moves (failpoints).
        A target ALTERed before or during the moves is followed (``_align``) up to
        ``ALIGN_ATTEMPTS`` times in one call; a target that keeps changing fails the call, which
        the caller retries. ``reads``: ``_publish_reads``' answer when the caller read it (``StageSet``
        reads every table's in one query); ``verify`` False leaves the check that nothing is left in the
        stage table to the caller (``StageSet`` makes it for every table in one query).
        """
        self._sync(stage)
        shapes, rows, partition_ids = self._publish_reads(stage, txn) if reads is None else reads
        if self.publish_mode == "insert-select":
            self._insert_select(self.target, stage, naming.publish_token(self.pipeline, txn))
            return rows
        for attempt in range(1, ALIGN_ATTEMPTS + 1):
            altered = difference(shapes[stage], shapes.get(self.target))
            if altered:
                log.warning("the target changed after txn %s was staged (%s): aligning its stage table", txn, altered)
                self._align(stage, shapes[stage], shapes.get(self.target))
                partition_ids = None
            try:
                self._move_all(stage, on_move, partition_ids, verify=verify)
                return rows
            except Exception as exc:
                if error_code(exc) != INCOMPATIBLE_COLUMNS or attempt == ALIGN_ATTEMPTS:
                    raise
                shapes, partition_ids = self._shapes(stage, self.target), None  # ALTERed again mid-move
                if stage not in shapes:
                    raise StageTableMissing(
                        f"stage table {self.database}.{stage} of committed txn {txn} does not exist"
                    ) from None
        raise AssertionError("unreachable")

    def _align(self, stage: str, mine: Shape, target: Shape | None) -> None:
        """Make ``stage``'s columns those of the target (names, types, order, default
        expressions), and its sorting key too unless the target's engine merges rows, so that its
        partitions can be moved. Each statement is idempotent; rows keep their values, and a column
        the target gained reads as the target's default, as rows already in the target do."""
        if target is None:
            raise SetupError(
                f"target table {self.database}.{self.target} does not exist: a committed txn "
                f"({stage}) cannot be published until it is created again"
            )
        if target.partition != mine.partition:
            raise SetupError(
                f"the partition key of {self.database}.{self.target} changed after {stage} was staged "
                f"({mine.partition!r} -> {target.partition!r}); ClickHouse cannot move partitions "
                "between them: restore the key, or move the stage table's rows by hand"
            )
        for clauses in alignment(mine, target, self._column_defs(self.target)):
            if clauses:
                self.client.command(
                    f"ALTER TABLE {self._q(stage)} {', '.join(clauses)}",
                    settings={"mutations_sync": 2, "alter_sync": 2},
                )

    def _column_defs(self, table: str) -> list[tuple[str, str, str, str]]:
        """(name, type, default kind, default expression) of ``table``'s columns, in order."""
        rows = self.client.query(COLUMN_DEFS_SQL, parameters={"db": self.database, "t": table}).result_rows
        return [tuple(r) for r in rows]  # rows of four strings

    def _publish_reads(self, stage: str, txn: str) -> PublishReads:
        """Before publishing, in one query: the shapes of ``stage`` and the target, the rows
        ``stage`` holds and its partition ids (None when read the long way)."""
        try:
            rows = self.client.query(
                publish_reads_sql(self._q(stage)),
                parameters={"db": self.database, "names": [stage, self.target], "stage": stage},
            ).result_rows
        except Exception as exc:
            if error_code(exc) != UNKNOWN_TABLE:
                raise
            shapes, count, partition_ids = self._shapes(stage, self.target), None, None
        else:
            shapes = shapes_of(rows)
            count = sum(int(r[2]) for r in rows if r[0] == "n")
            partition_ids = sorted(r[1] for r in rows if r[0] == "p")
        if stage not in shapes:
            raise StageTableMissing(f"stage table {self.database}.{stage} of committed txn {txn} does not exist")
        return shapes, self.count(stage) if count is None else count, partition_ids

    def _move_all(
        self, source: str, on_move: Any = None, partition_ids: list[str] | None = None, *, verify: bool = True
    ) -> None:
        ids = self._partition_ids(source) if partition_ids is None else partition_ids
        if not ids and partition_ids is not None:
            return  # read empty just before: nothing to move, nothing to check
        for i, partition_id in enumerate(ids):
            if i and on_move is not None:
                on_move()
            # alter_sync 1: a replicated move waits for this replica only before it drops the moved
            # parts from the stage table; waiting for every replica could fail in between.
            self.client.command(
                f"ALTER TABLE {self._q(source)} MOVE PARTITION ID '{partition_id}' TO TABLE {self._q(self.target)}",
                settings={"alter_sync": 1},
            )
        if verify and (left := self.count(source)):
            raise RuntimeError(f"table {source} still holds {left} rows after moving every partition")

    def _insert_select(self, into: str, source: str, token: str) -> None:
        """A deduplicated copy of ``source`` into ``into``, by the columns they share (by name)."""
        theirs = {name for name, _ in self._columns(source)}
        columns = ", ".join(ident(n) for n, _ in self._columns(into, insertable=True) if n in theirs)
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
        rows = self.client.query(TABLES_STARTING_WITH_SQL, parameters={"db": self.database, "p": stage}).result_rows
        return [name for (name,) in rows if naming.is_side_table(stage, name)]

    def _partition_ids(self, stage: str) -> list[str]:
        rows = self.client.query(PARTITION_IDS_SQL, parameters={"db": self.database, "t": stage}).result_rows
        return sorted(r[0] for r in rows)
