"""Commit step 2, one txn ahead: the next txn's stage table, made before its START. Pure.

``CoordinatorState`` owns one ``StageAhead``. It names the next txn of this leader's epoch and asks
for its stage table (``CreateStage``); the runner answers ``StageCreated``. A START (alone, or
carried by an END) takes the spare once it is ready, so a txn always starts on a stage table
that exists. A creation that failed is tried again ``retry_s`` later; a spare dropped
(shutdown, target altered) is made anew, under the next txn id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocol import naming
from protocol.coordinator.events import Action, CreateStage, DropStage, StageCreated


@dataclass
class Spare:
    """The next txn's stage table, created ahead of its START."""

    txn: str
    stage_table: str  # ``naming.txn_stages``: one table's, or several comma-separated, or none ("")
    ready: bool = False
    #: The shards that get its stage tables, when partitions are placed on shards: those a partition
    #: with records waiting is placed on (``Flight._shards_due``); () only with no stage table at
    #: all. None: every shard (one server, or rows placed by a sharding key).
    shards: tuple[int, ...] | None = None
    #: The target tables that get its stage tables (``[[route]]``); None: the one-table form's one table.
    tables: tuple[str, ...] | None = None

    def misses(self, tables: tuple[str, ...] | None, shards: tuple[int, ...] | None) -> bool:
        """Whether some of ``tables`` or ``shards`` (``Flight._stages_due``: where records wait) get
        none of its stage tables."""
        if tables is not None and not set(tables) <= set(self.tables or ()):
            return True
        return shards is not None and self.shards is not None and not set(shards) <= set(self.shards)


class StageAhead:
    """At most one spare stage table, and the sequence number of the next txn id."""

    def __init__(self, *, pipeline: str, epoch: int, target: str, retry_s: float) -> None:
        self.pipeline, self.epoch, self.target = pipeline, epoch, target
        self.retry_s = retry_s
        self.spare: Spare | None = None
        self._not_before = 0.0
        self._next_seq = 1

    @property
    def ready(self) -> bool:
        """A spare exists and its stage table was created: a START may take it."""
        return self.spare is not None and self.spare.ready

    def wants(self, now: float) -> bool:
        """``prepare`` would ask for a stage table now: none is kept and no failed creation waits."""
        return self.spare is None and now >= self._not_before

    def prepare(
        self, now: float, tables: Sequence[str] | None = None, shards: tuple[int, ...] | None = None
    ) -> list[Action]:
        """Ask for the next txn's stage table, unless one is kept or a failed creation waits to retry.
        ``tables``: the target tables that get one (``[[route]]``; None: the one target); ``shards``:
        the shards that get them (``Spare.shards``; none: no table gets one)."""
        if not self.wants(now):
            return []
        txn_id = naming.txn_id(self.epoch, self._next_seq)
        self._next_seq += 1
        if shards == ():
            tables = ()
        stages = naming.txn_stages((self.target,) if tables is None else tables, self.pipeline, txn_id)
        self.spare = Spare(txn_id, stages, shards=shards, tables=None if tables is None else tuple(tables))
        return [CreateStage(self.spare.txn, self.spare.stage_table, shards)]

    def created(self, event: StageCreated, now: float) -> None:
        spare = self.spare
        if spare is None or spare.txn != event.txn:
            return  # a spare dropped (shutdown, target altered) while the runner was creating it
        if not event.ok:  # the runner logged why; try again a little later
            self.spare = None
            self._not_before = now + self.retry_s
            return
        spare.ready = True

    def take(self) -> Spare:
        """The ready spare, for a START; none is kept after."""
        spare = self.spare
        assert spare is not None and spare.ready
        self.spare = None
        return spare

    def drop(self) -> list[Action]:
        spare, self.spare = self.spare, None
        return [DropStage(spare.txn, spare.stage_table, spare.shards)] if spare is not None else []
