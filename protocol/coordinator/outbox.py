"""The control messages the leader broadcasts (START, END, ACK-COMMIT, ABORT), each stamped with
its pipeline, epoch and coordinator id, so participants can fence a leader of an older epoch. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from protocol import naming, routing
from protocol.coordinator.events import Offsets, Txn
from protocol.messages import (
    Abort,
    AckCommit,
    EndCommit,
    PartitionHolder,
    PartitionOffset,
    StartCommit,
    TopicStage,
)


class Outbox:
    """Builds the messages of one leader (``pipeline``, ``epoch``, ``coordinator``); sends nothing.
    ``shard_count``: the shards partitions are placed on (``clickhouse.placement = "partition"``),
    so that a txn's stage tables may be on some of them only; 0 otherwise."""

    def __init__(
        self,
        *,
        pipeline: str,
        epoch: int,
        coordinator: str,
        routes: Sequence[routing.Route] = (),
        shard_count: int = 0,
    ) -> None:
        self.pipeline, self.epoch, self.coordinator = pipeline, epoch, coordinator
        self.shard_count = shard_count
        self.routes = tuple(routes)
        self.tables = tuple(dict.fromkeys(r.table for r in self.routes))
        self.many = len(self.tables) > 1  # a txn spans several tables
        self._table_of: dict[str, str] = {}  # topic -> its table, as the routes say (fixed for the leader)

    def tables_of(self, topics: Iterable[str]) -> dict[str, str]:
        """Each of ``topics`` with its route's table (``routing.route``, remembered per topic); a topic
        of no route, or of the routes of several tables, has none."""
        if new := sorted(set(topics) - self._table_of.keys()):
            self._table_of.update(routing.route(new, self.routes).tables)
        return {topic: self._table_of[topic] for topic in topics if topic in self._table_of}

    def start(self, txn: Txn, chunk_rows: int) -> StartCommit:
        """Commit step 3's START: where each partition starts, who holds it, the chunk size to cut."""
        holders = tuple(
            PartitionHolder(topic=tp.topic, partition=tp.partition, sender=s) for tp, s in sorted(txn.holders.items())
        )
        return StartCommit(
            **self._envelope(txn.id),
            stage_table=txn.stage_table,
            offsets=_offsets(txn.start),
            holders=holders,
            chunk_rows=chunk_rows,
            stage_tables=self._stage_tables(txn) if self.many else (),
            shards=txn.shards or (),
            shard_count=self.shard_count if txn.shards else 0,
        )

    def _stage_tables(self, txn: Txn) -> tuple[TopicStage, ...]:
        """Each topic of ``txn``'s stage table in its route's table, "" where that table has none in
        this txn, or where the topic has no table (never STARTed: ``CoordinatorState.partitions``)."""
        stages = {naming.table_of_stage(s, self.pipeline, txn.id): s for s in naming.split_stages(txn.stage_table)}
        topics = sorted({tp.topic for tp in txn.start})
        tables = self.tables_of(topics)
        return tuple(TopicStage(topic=topic, stage_table=stages.get(tables.get(topic, ""), "")) for topic in topics)

    def end(self, txn: Txn, next_start: StartCommit | None) -> EndCommit:
        """Commit step 3's END, carrying the START of the txn chained to it, if any."""
        return EndCommit(**self._envelope(txn.id), next=next_start)

    def ack(self, txn: Txn) -> AckCommit:
        """Commit step 7's ACK-COMMIT: the end offsets committed, in commit slot ``txn.commit_seq``."""
        return AckCommit(**self._envelope(txn.id), offsets=_offsets(txn.end), commit_seq=txn.commit_seq)

    def abort(self, txn: Txn, reason: str) -> Abort:
        """Commit step 4's ABORT."""
        return Abort(**self._envelope(txn.id), reason=reason)

    def _envelope(self, txn: str) -> dict:
        return {"pipeline": self.pipeline, "epoch": self.epoch, "txn": txn, "sender": self.coordinator}


def _offsets(offsets: Offsets) -> tuple[PartitionOffset, ...]:
    return tuple(PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in sorted(offsets.items()))
