"""Partitions placed on shards (``clickhouse.placement = "partition"``): a txn gets stage tables only on
the shards whose partitions have records waiting. The leader's choice (from the heartbeats), the
actions and the START that carry it, and the participant that holds a partition placed on a shard
without one (stages nothing, ends where it started)."""

from __future__ import annotations

import dataclasses

from protocol import naming
from protocol.coordinator.events import Broadcast, CountStage, CreateStage, DropStage, Ready, Received, StageCreated
from protocol.coordinator.state import CoordinatorState
from protocol.messages import EndCommit, Heartbeat, PartitionOffset, PartitionPosition, StartCommit, TopicPartition
from protocol.participant.events import Polled, Received as PReceived, StageChunk
from protocol.participant.state import ParticipantState
from protocol.shards import shard_of
from tests.pure.coordinator_driver import TIMING, ws
from tests.records import Rec

PIPE, EPOCH, SHARDS = "orders", 3, 3  # as ``coordinator_driver``'s ``ws`` sends them
P0, P1, P2 = (TopicPartition(topic="orders", partition=p) for p in range(3))
HEAD = {P0: 40, P1: 10, P2: 5}
ON = {tp: shard_of(tp.topic, tp.partition, SHARDS) for tp in HEAD}  # one partition on each shard


def txn(n: int) -> str:
    return naming.txn_id(EPOCH, n)


def stage(n: int) -> str:
    return naming.stage_table("orders", PIPE, txn(n))


def beat(tp: TopicPartition, log_end: int, *, txn: str = "", continues: bool = False) -> Received:
    """``tp``'s holder (``p-<partition>``) says where it reads, in ``txn``; with ``continues``, it
    understands chained STARTs."""
    position = PartitionPosition(topic=tp.topic, partition=tp.partition, position=HEAD[tp], log_end=log_end)
    return Received(
        Heartbeat(
            pipeline=PIPE, epoch=EPOCH, txn=txn, sender=f"p-{tp.partition}", partitions=(position,), continues=continues
        )
    )


def of(kind: type, actions: list) -> list:
    return [a for a in actions if isinstance(a, kind)]


def leader(shard_count: int = SHARDS) -> CoordinatorState:
    return CoordinatorState(
        pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=TIMING, shard_count=shard_count
    )


def start_of(actions: list) -> StartCommit:
    (start,) = [a.message for a in actions if isinstance(getattr(a, "message", None), StartCommit)]
    return start


def test_only_shards_with_records_waiting_get_stage_tables_and_an_idle_one_joins_once_records_arrive() -> None:
    assert sorted(ON.values()) == [0, 1, 2]
    state = leader()
    state.handle(beat(P0, 50), 0.0)  # 10 records past the committed 40
    state.handle(beat(P1, 10), 0.0)  # nothing past the committed 10
    state.handle(beat(P2, 5), 0.0)
    first = state.handle(Ready(7, HEAD, {}), 0.0)
    assert of(CreateStage, first) == [CreateStage(txn(1), stage(1), (ON[P0],))]

    started = state.handle(StageCreated(txn(1)), 0.0)
    start = start_of(started)
    assert (start.stage_table, start.shards, start.shard_count) == (stage(1), (ON[P0],), SHARDS)
    assert {o.partition: o.offset for o in start.offsets} == {0: 40, 1: 10, 2: 5}  # every partition is in it
    assert [start.stage_table_for(tp) for tp in (P0, P1, P2)] == [stage(1), "", ""]  # P1 and P2 held
    assert of(CreateStage, started) == [CreateStage(txn(2), stage(2), (ON[P0],))]  # the others still idle

    state.handle(StageCreated(txn(2)), 0.1)
    state.handle(beat(P1, 12), 0.5)  # records arrive in P1 while txn 1 runs
    state.handle(beat(P0, 50), 1.1)  # txn 1's END is due
    done = state.handle(ws(txn(1), P0, 40, 50, 10, sender="p-0"), 1.2)
    done += state.handle(ws(txn(1), P1, 10, 10, 0, sender="p-1"), 1.2)
    done += state.handle(ws(txn(1), P2, 5, 5, 0, sender="p-2"), 1.2)
    assert of(CountStage, done) == [CountStage(txn(1), stage(1), (ON[P0],))]
    # txn 2 starts on its spare (P0's shard only); txn 3's is on P1's shard too: records wait there
    assert of(CreateStage, done) == [CreateStage(txn(3), stage(3), tuple(sorted((ON[P0], ON[P1]))))]
    assert state.txn(txn(1)).shards == (ON[P0],)


def test_no_partition_with_records_waiting_is_a_txn_with_no_stage_table_on_any_shard() -> None:
    state = leader()
    for tp, end in HEAD.items():
        state.handle(beat(tp, end), 0.0)
    assert of(CreateStage, state.handle(Ready(7, HEAD, {}), 0.0)) == [CreateStage(txn(1), "", ())]
    start = start_of(state.handle(StageCreated(txn(1)), 0.0))
    assert start.stage_table == "" and {start.stage_table_for(tp) for tp in HEAD} == {""}


def test_placed_by_a_sharding_key_every_shard_gets_the_stage_tables_as_on_one_server() -> None:
    state = leader(shard_count=0)  # what the leader passes for clickhouse.placement = "sharding-key"
    for tp, end in HEAD.items():
        state.handle(beat(tp, end + (tp is P0)), 0.0)
    assert of(CreateStage, state.handle(Ready(7, HEAD, {}), 0.0)) == [CreateStage(txn(1), stage(1), None)]
    start = start_of(state.handle(StageCreated(txn(1)), 0.0))
    assert (start.shards, start.shard_count) == ((), 0)
    assert {start.stage_table_for(tp) for tp in HEAD} == {stage(1)}


def participant(shard_count: int) -> ParticipantState:
    return ParticipantState(
        pipeline=PIPE,
        sender="task-0",
        partitions=[P0, P1],
        chunk_rows=2,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
        shard_count=shard_count,
    )


def start_on_p0s_shard() -> StartCommit:
    return StartCommit(
        pipeline=PIPE,
        epoch=EPOCH,
        txn=txn(1),
        sender="c",
        stage_table=stage(1),
        offsets=(
            PartitionOffset(topic="orders", partition=0, offset=40),
            PartitionOffset(topic="orders", partition=1, offset=10),
        ),
        shards=(ON[P0],),
        shard_count=SHARDS,
    )


def staged_and_held(m: ParticipantState) -> tuple[list, list]:
    """txn 1 of P0 from 40 and P1 from 10, three records of P1 and one of P0 read: the chunks staged
    (stage table, partition) and the WRITE-STATUS reports (partition, start, end, rows) sent at END."""
    m.handle(PReceived(start_on_p0s_shard()), 0)
    read = m.handle(Polled([Rec("orders", 1, o, b'{"o":1}') for o in (10, 11, 12)] + [Rec("orders", 0, 40, b"{}")]), 0)
    ended = read + m.handle(PReceived(EndCommit(pipeline=PIPE, epoch=EPOCH, txn=txn(1), sender="c")), 0)
    reports = [a.message for a in ended if hasattr(a, "message")]
    return (
        [(a.stage_table, a.chunk.partition) for a in of(StageChunk, ended)],
        [(w.partition, w.start_offset, w.end_offset, w.rows) for w in reports],
    )


def test_a_partition_placed_on_a_shard_without_a_stage_table_stages_nothing_and_ends_where_it_started() -> None:
    staged, reported = staged_and_held(participant(SHARDS))
    assert staged == [(stage(1), 0)]
    assert reported == [(1, 10, 10, 0)]


def test_a_participant_placing_over_another_shard_count_holds_every_partition_and_says_why(caplog) -> None:
    """Its ``clickhouse.shards`` (or placement) differs from the leader's: the shard it would insert into
    may have no stage table in this txn, so it stages nothing, rather than failing inserts that abort
    every txn, and logs both counts once per txn."""
    staged, reported = staged_and_held(participant(2))
    assert staged == []
    assert sorted(reported) == [(0, 40, 40, 0), (1, 10, 10, 0)]
    [told] = [r.getMessage() for r in caplog.records if "shards" in r.getMessage()]
    assert "over 3 shards and this participant over 2" in told and "same clickhouse.shards" in told


def test_records_on_a_shard_the_spare_has_no_stage_table_on_end_an_idle_txn_only_once_a_spare_has_one() -> None:
    """With ``idle_interval_s``, a txn that read nothing waits, past its interval, for a spare staging
    on the shard records now wait on, so its END carries a START that reads them."""
    state = CoordinatorState(
        pipeline=PIPE,
        epoch=EPOCH,
        coordinator="c",
        target="orders",
        timing=dataclasses.replace(TIMING, idle_interval_s=30.0),
        shard_count=SHARDS,
    )

    def told(tp: TopicPartition, log_end: int, at: float, txn_: str = "") -> list:
        return state.handle(beat(tp, log_end, txn=txn_, continues=True), at)

    for tp in (P0, P1, P2):
        told(tp, HEAD[tp], 0.0)  # nothing waits anywhere
    assert of(CreateStage, state.handle(Ready(7, HEAD, {}), 0.0)) == [CreateStage(txn(1), "", ())]
    assert of(CreateStage, state.handle(StageCreated(txn(1)), 0.0)) == [CreateStage(txn(2), "", ())]
    state.handle(StageCreated(txn(2)), 0.1)
    arrived = told(P1, 12, 2.0, txn(1))  # past the interval, records arrive in P1
    assert of(Broadcast, arrived) == []
    assert of(DropStage, arrived) == [DropStage(txn(2), "", ())]
    assert of(CreateStage, arrived) == [CreateStage(txn(3), stage(3), (ON[P1],))]
    (end,) = [a.message for a in of(Broadcast, state.handle(StageCreated(txn(3)), 2.1))]
    assert isinstance(end, EndCommit) and end.txn == txn(1) and end.next is not None
    assert (end.next.txn, end.next.shards) == (txn(3), (ON[P1],))
    assert end.next.stage_table_for(P1) == stage(3)
