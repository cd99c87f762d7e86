"""The stage tables of a txn on every shard of a sharded ClickHouse (``clickhouse.shards``): one
txn, one commit point, a stage table on each shard.

Every shard holds a stage set of its own (``coordinator.stage.sets.StageSet``, on that shard's
server) under the same names, so the ledger's ``stage_table`` names a txn's stage tables on all
of them. ``ShardedStages`` answers with the methods of a stage set:

- ``create``: the stage tables on every shard (commit step 2); ``on(shards)`` is the same on some
  shards only: placed by partition, a txn has its stage tables only on the shards whose partitions
  had records waiting (``protocol.coordinator.spare.Spare.shards``), and every step acts on those;
- ``check``: every shard's, merged: rows summed, each source partition's rows, first and last
  offset summed and spanned over the shards (a partition staged on two shards is counted once
  per row), and the first structural difference on any shard aborts the whole txn (commit step 5);
- ``publish``: shard after shard, in shard order (commit step 7). Each shard's publish is safe to
  repeat, so a leader that rolls a half-published txn forward publishes the rest and moves nothing
  twice (failpoint ``leader.between-shard-publishes``);
- ``drop``/``drop_all``/``exists``/``count``/``existing``: over every shard.

The ledger, the dead letters and the commit point stay on the server of ``clickhouse.url``
(``client``): the one commit point of every shard.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from clients import failpoints
from coordinator.stage.sets import StageSet
from coordinator.stage.tables import StageCheck, StageTables
from protocol import shards as shard_rules
from protocol.coordinator.events import PartitionStats
from protocol.messages import TopicPartition


class ShardedStages:
    """The stage sets of every shard (``shards``: ``{protocol.shards.where: StageSet}``, in shard order)
    and the ``client`` of the ledger's server. No I/O in the constructor."""

    def __init__(self, shards: Mapping[str, StageSet], client: Any, *, coordinator: str = "") -> None:
        if not shards:
            raise ValueError("a sharded ClickHouse has at least one shard")
        self.wheres = list(shards)
        self.shards = list(shards.values())
        self.client = client
        self.coordinator = coordinator
        first = self.shards[0]
        self.database, self.pipeline, self.tables = first.database, first.pipeline, first.tables

    def every(self, txn: str) -> str:
        return self.shards[0].every(txn)

    def on(self, shards: Sequence[int]) -> ShardedStages:
        """The stage sets of ``shards`` only (0-based, in shard order; none: a txn with no stage table):
        a txn whose stage tables are on some shards only (``protocol.coordinator.spare.Spare.shards``)."""
        chosen = copy.copy(self)
        chosen.wheres = [self.wheres[i] for i in sorted(set(shards))]
        chosen.shards = [self.shards[i] for i in sorted(set(shards))]
        return chosen

    # ---- the commit steps -------------------------------------------------------------------

    def create(self, stages: str) -> None:
        for shard in self.shards:
            shard.create(stages)

    def check(self, stages: str) -> StageCheck:
        return merged([shard.check(stages) for shard in self.shards], self.wheres)

    def publish(self, stages: str, txn: str, on_move: Any = None) -> int:
        rows = 0
        for i, shard in enumerate(self.shards):
            if i:
                failpoints.hit("leader.between-shard-publishes", self.coordinator)
            rows += shard.publish(stages, txn, on_move)
        return rows

    # ---- clean-up ---------------------------------------------------------------------------

    def drop(self, stages: str) -> None:
        for shard in self.shards:
            shard.drop(stages)

    def drop_all(self, stages: str) -> None:
        for shard in self.shards:
            shard.drop_all(stages)

    def exists(self, stages: str) -> bool:
        return any(shard.exists(stages) for shard in self.shards)

    def count(self, stages: str) -> int:
        return sum(shard.count(stages) for shard in self.shards)

    def existing(self) -> dict[str, str]:
        found: dict[str, str] = {}
        for shard in self.shards:
            found.update(shard.existing())
        return dict(sorted(found.items()))


#: What the leader, its take-over and its publisher work with: one table's stage tables, a set of
#: tables, or the sets of every shard (all with the same methods).
Stages = StageTables | StageSet | ShardedStages


def merged(checks: Sequence[StageCheck], names: Sequence[str] = ()) -> StageCheck:
    """One step-5 check of the shards' ``checks`` (in shard order, named ``names``; by default
    ``shard 1`` on): what the txn staged over all."""
    names = names or [shard_rules.label(i) for i in range(len(checks))]
    altered = "; ".join(f"{name}: {c.altered}" for name, c in zip(names, checks) if c.altered)
    if len(checks) == 1:
        return checks[0]
    if any(c.partitions is None for c in checks):  # a shard's table without the metadata columns
        return StageCheck(altered, sum(c.count for c in checks), None)
    partitions: dict[TopicPartition, PartitionStats] = {}
    for check in checks:
        for tp, stats in (check.partitions or {}).items():
            seen = partitions.get(tp)
            partitions[tp] = (
                stats
                if seen is None
                else PartitionStats(
                    rows=seen.rows + stats.rows,
                    min_offset=min(seen.min_offset, stats.min_offset),
                    max_offset=max(seen.max_offset, stats.max_offset),
                )
            )
    return StageCheck(altered, sum(c.count for c in checks), partitions)


def on_shards(stages: Stages, shards: Sequence[int] | None) -> Stages:
    """``stages`` on ``shards`` only (``ShardedStages.on``); None: every shard."""
    if shards is None or not isinstance(stages, ShardedStages):
        return stages
    return stages.on(shards)


def clients_of(stages: Any) -> list[tuple[str, Any]]:
    """``(shard, client)`` of every shard ``stages`` stage on (``protocol.shards.where``); one ``("",
    client)`` when the ClickHouse is not sharded."""
    if isinstance(stages, ShardedStages):
        return [(where, shard.client) for where, shard in zip(stages.wheres, stages.shards)]
    return [("", stages.client)]


@contextmanager
def adopting_on_shards(stages: Any, adopt: Any) -> Iterator[None]:
    """``adopt(stage_set)`` (``coordinator.stage.sets.adopting`` with its tables) on every shard."""
    if not isinstance(stages, ShardedStages):
        with adopt(stages):
            yield
        return
    with ExitStack() as stack:
        for shard in stages.shards:
            stack.enter_context(adopt(shard))
        yield
