"""A txn across several tables (``[[route]]``) gets a stage table only in the tables with records
waiting: the leader's choice (from the heartbeats' log ends), the START that says so, and the
participant that holds a partition of a table without one (stages nothing, ends where it started)."""

from __future__ import annotations

import dataclasses

from protocol import naming
from protocol.config.sections import RouteSection
from protocol.coordinator.events import (
    Broadcast,
    CountStage,
    CreateStage,
    DropStage,
    PartitionsChanged,
    Ready,
    Received,
    StageCreated,
)
from protocol.coordinator.state import CoordinatorState
from protocol.messages import (
    EndCommit,
    Heartbeat,
    PartitionOffset,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    TopicStage,
)
from protocol.participant.events import Polled, Received as PReceived, Seek, StageChunk
from protocol.participant.state import ParticipantState
from tests.pure.coordinator_driver import TIMING, ws
from tests.records import Rec

PIPE, EPOCH = "orders", 3  # as ``coordinator_driver``'s ``ws`` sends them
ORDERS, CLICKS = TopicPartition(topic="orders", partition=0), TopicPartition(topic="clicks", partition=0)
ROUTES = (RouteSection(topics=("orders",), table="orders"), RouteSection(topics=("clicks",), table="clicks"))
HEAD = {ORDERS: 40, CLICKS: 10}


def stages(n: int, *tables: str) -> str:
    return naming.txn_stages(tables, PIPE, naming.txn_id(EPOCH, n))


def beat(tp: TopicPartition, log_end: int, *, txn: str = "", read: int = 0, continues: bool = False) -> Received:
    """``tp``'s holder (``p-<topic>``) says where it reads and what it read into ``txn``; with
    ``continues``, it understands chained STARTs."""
    position = PartitionPosition(
        topic=tp.topic, partition=tp.partition, position=HEAD[tp], log_end=log_end, buffered_rows=read
    )
    return Received(
        Heartbeat(
            pipeline=PIPE, epoch=EPOCH, txn=txn, sender=f"p-{tp.topic}", partitions=(position,), continues=continues
        )
    )


def of(kind: type, actions: list) -> list:
    return [a for a in actions if isinstance(a, kind)]


def test_only_tables_with_records_waiting_get_a_stage_table_and_an_idle_one_joins_once_records_arrive() -> None:
    state = CoordinatorState(pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=TIMING, routes=ROUTES)
    state.handle(beat(ORDERS, 50), 0.0)  # 10 records past the committed 40
    state.handle(beat(CLICKS, 10), 0.0)  # nothing past the committed 10
    first = state.handle(Ready(7, HEAD, {}), 0.0)
    assert of(CreateStage, first) == [CreateStage(naming.txn_id(EPOCH, 1), stages(1, "orders"))]

    started = state.handle(StageCreated(naming.txn_id(EPOCH, 1)), 0.0)
    (start,) = [a.message for a in started if isinstance(getattr(a, "message", None), StartCommit)]
    assert start.stage_tables == (
        TopicStage(topic="clicks", stage_table=""),  # held: stages nothing in txn 1
        TopicStage(topic="orders", stage_table=stages(1, "orders")),
    )
    assert {(o.topic, o.offset) for o in start.offsets} == {("orders", 40), ("clicks", 10)}  # every partition is in it
    assert of(CreateStage, started) == [CreateStage(naming.txn_id(EPOCH, 2), stages(2, "orders"))]  # clicks still idle

    state.handle(StageCreated(naming.txn_id(EPOCH, 2)), 0.1)
    state.handle(beat(CLICKS, 12), 0.5)  # records arrive in clicks while txn 1 runs
    state.handle(beat(ORDERS, 50), 0.5)
    state.handle(beat(ORDERS, 50), 1.1)  # txn 1's END is due
    done = state.handle(ws(naming.txn_id(EPOCH, 1), CLICKS, 10, 10, 0, sender="p-clicks"), 1.2)
    done += state.handle(ws(naming.txn_id(EPOCH, 1), ORDERS, 40, 50, 10, sender="p-orders"), 1.2)
    assert of(CountStage, done) == [CountStage(naming.txn_id(EPOCH, 1), stages(1, "orders"))]
    # txn 2 starts on its spare (orders only); txn 3's has both tables: clicks has records waiting
    assert of(CreateStage, done) == [CreateStage(naming.txn_id(EPOCH, 3), stages(3, "orders", "clicks"))]


def test_a_table_of_no_route_with_records_makes_no_stage_table_and_no_table_at_all_is_a_txn_of_no_stage() -> None:
    state = CoordinatorState(pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=TIMING, routes=ROUTES)
    state.handle(beat(ORDERS, 40), 0.0)
    state.handle(beat(CLICKS, 10), 0.0)
    assert of(CreateStage, state.handle(Ready(7, HEAD, {}), 0.0)) == [CreateStage(naming.txn_id(EPOCH, 1), "")]
    started = state.handle(StageCreated(naming.txn_id(EPOCH, 1)), 0.0)
    (start,) = [a.message for a in started if isinstance(getattr(a, "message", None), StartCommit)]
    assert {s.stage_table for s in start.stage_tables} == {""} and start.stage_table == ""


def test_the_leader_never_starts_a_partition_whose_topic_no_route_names_though_the_ledger_head_has_it() -> None:
    """Issue 35 item 8: ``gone`` left the routes; the ledger head still has its partition (and a
    participant of the old config still heartbeats it). The leader leaves it out of every START,
    and every topic a START lists has its entry in ``stage_tables``."""
    gone = TopicPartition(topic="gone", partition=0)
    state = CoordinatorState(pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=TIMING, routes=ROUTES)
    for tp, log_end in ((ORDERS, 50), (CLICKS, 12)):
        state.handle(beat(tp, log_end), 0.0)
    gone_beat = PartitionPosition(topic="gone", partition=0, position=30, log_end=60)
    state.handle(Received(Heartbeat(pipeline=PIPE, epoch=EPOCH, txn="", sender="p-old", partitions=(gone_beat,))), 0)
    state.handle(Ready(7, {**HEAD, gone: 30}, {}), 0.0)
    assert state.partitions == (CLICKS, ORDERS)
    started = state.handle(StageCreated(naming.txn_id(EPOCH, 1)), 0.0)
    (start,) = [a.message for a in started if isinstance(getattr(a, "message", None), StartCommit)]
    assert {o.topic for o in start.offsets} == {"orders", "clicks"}
    assert {s.topic: s.stage_table for s in start.stage_tables} == {
        "clicks": stages(1, "clicks"),
        "orders": stages(1, "orders"),
    }


def test_a_topic_two_tables_routes_match_is_never_started_and_stops_no_other_topic() -> None:
    """Issue 35 item 10: a partition listing that brings a topic both tables' patterns match (and one of
    one table's) leaves the ambiguous one out of the partitions and of every START; the machine never
    raises for it."""
    routes = (
        RouteSection(topics=("orders", "re:late-.*"), table="orders"),
        RouteSection(topics=("clicks", "re:.*-both"), table="clicks"),
    )
    both, late = TopicPartition(topic="late-both", partition=0), TopicPartition(topic="late-1", partition=0)
    state = CoordinatorState(pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=TIMING, routes=routes)
    state.handle(Ready(7, HEAD, {}), 0.0)
    state.handle(PartitionsChanged((CLICKS, ORDERS, both, late), {both: 0, late: 0}), 0.1)
    assert state.partitions == (CLICKS, late, ORDERS)
    for tp in (ORDERS, CLICKS, late, both):
        position = PartitionPosition(topic=tp.topic, partition=0, position=0, log_end=5)
        state.handle(Received(Heartbeat(pipeline=PIPE, epoch=EPOCH, txn="", sender="p", partitions=(position,))), 0.2)
    started = state.handle(StageCreated(naming.txn_id(EPOCH, 1)), 0.3)
    (start,) = [a.message for a in started if isinstance(getattr(a, "message", None), StartCommit)]
    assert {o.topic for o in start.offsets} == {"orders", "clicks", "late-1"}
    assert {s.topic for s in start.stage_tables} == {"orders", "clicks", "late-1"}


def test_a_held_partition_stages_nothing_keeps_fetching_and_ends_where_it_started() -> None:
    m = _clicks_and_orders()
    start = _start_clicks_at_10_orders_at_40(
        TopicStage(topic="clicks", stage_table=""), TopicStage(topic="orders", stage_table=stages(1, "orders"))
    )
    assert m.handle(PReceived(start), 0) == [Seek("clicks", 0, 10), Seek("orders", 0, 40)]  # both fetch; none paused
    read = m.handle(Polled([Rec("clicks", 0, o, b'{"o":1}') for o in (10, 11)] + [Rec("orders", 0, 40, b'{"o":2}')]), 0)
    assert [(a.stage_table, a.chunk.topic) for a in of(StageChunk, read)] == []  # one orders record: chunk not cut yet
    assert m.consuming
    ended = m.handle(PReceived(_end("e3_t1")), 0)
    assert [(a.stage_table, a.chunk.topic) for a in of(StageChunk, ended)] == [(stages(1, "orders"), "orders")]
    reports = [a.message for a in ended if hasattr(a, "message")]
    assert [(w.topic, w.start_offset, w.end_offset, w.rows) for w in reports] == [("clicks", 10, 10, 0)]
    # the chained START of the next txn goes on from 10, where clicks' records were read but not staged


def test_a_partition_whose_topic_a_start_names_no_stage_table_for_is_held_never_staged_into_another_table() -> None:
    """Issue 35 item 8: a START across several tables that leaves a topic out of ``stage_tables`` (its
    route was removed; the leader still listed it) gives it no stage table: the participant holds its
    partition, stages none of its records into the txn's only stage table, and reports it ending where
    it started, so the txn commits nothing of it."""
    m = _clicks_and_orders()
    start = _start_clicks_at_10_orders_at_40(
        TopicStage(topic="orders", stage_table=stages(1, "orders"))
    )  # clicks: none
    m.handle(PReceived(start), 0)
    read = m.handle(Polled([Rec("clicks", 0, o, b'{"o":1}') for o in (10, 11, 12)] + [Rec("orders", 0, 40, b"{}")]), 0)
    ended = read + m.handle(PReceived(_end("e3_t1")), 0)
    assert [(a.stage_table, a.chunk.topic) for a in of(StageChunk, ended)] == [(stages(1, "orders"), "orders")]
    reports = [a.message for a in ended if hasattr(a, "message")]
    assert [(w.topic, w.start_offset, w.end_offset, w.rows, w.errors) for w in reports] == [("clicks", 10, 10, 0, ())]


def _clicks_and_orders() -> ParticipantState:
    return ParticipantState(
        pipeline=PIPE,
        sender="task-0",
        partitions=[CLICKS, ORDERS],
        chunk_rows=2,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
    )


def _start_clicks_at_10_orders_at_40(*stage_tables: TopicStage) -> StartCommit:
    """txn e3_t1 of clicks/0 from 10 and orders/0 from 40, its only stage table orders'."""
    return StartCommit(
        pipeline=PIPE,
        epoch=EPOCH,
        txn="e3_t1",
        sender="c",
        stage_table=stages(1, "orders"),
        offsets=(
            PartitionOffset(topic="clicks", partition=0, offset=10),
            PartitionOffset(topic="orders", partition=0, offset=40),
        ),
        stage_tables=stage_tables,
    )


def _end(txn: str) -> EndCommit:
    return EndCommit(pipeline=PIPE, epoch=EPOCH, txn=txn, sender="c")


def test_records_wait_in_a_partition_its_holder_read_past_the_committed_offset_even_with_a_stale_log_end() -> None:
    from protocol.coordinator.liveness import Liveness

    liveness = Liveness(heartbeat_timeout_s=3.0)

    def told(tp: TopicPartition, position: int, log_end: int) -> None:
        place = PartitionPosition(topic=tp.topic, partition=tp.partition, position=position, log_end=log_end)
        liveness.heard(Heartbeat(pipeline=PIPE, epoch=EPOCH, txn="", sender="p", partitions=(place,)), 0.0)

    assert liveness.waiting([ORDERS, CLICKS], HEAD.__getitem__) == {ORDERS, CLICKS}  # nothing told yet
    told(ORDERS, 40, 40)
    told(CLICKS, 10, -1)
    assert liveness.waiting([ORDERS, CLICKS], HEAD.__getitem__) == {CLICKS}  # clicks' log end is not known
    told(CLICKS, 13, 10)  # the cached watermark trails what was read
    told(ORDERS, 40, 41)
    assert liveness.waiting([ORDERS, CLICKS], HEAD.__getitem__) == {ORDERS, CLICKS}
    told(CLICKS, 10, 10)
    assert liveness.waiting([ORDERS, CLICKS], HEAD.__getitem__) == {ORDERS}


# ---- a txn that read nothing waits for a spare with the tables records now wait for ---------------

IDLE_TIMING = dataclasses.replace(TIMING, idle_interval_s=30.0)


def told(tp: TopicPartition, log_end: int, *, txn: str = "", read: int = 0) -> Received:
    """``beat`` from a holder that understands chained STARTs."""
    return beat(tp, log_end, txn=txn, read=read, continues=True)


def idle_routed_leader() -> CoordinatorState:
    """Both tables idle: txn 1 runs with no stage table, txn 2's spare (none either) is ready."""
    state = CoordinatorState(
        pipeline=PIPE, epoch=EPOCH, coordinator="c", target="orders", timing=IDLE_TIMING, routes=ROUTES
    )
    state.handle(told(ORDERS, 40), 0.0)
    state.handle(told(CLICKS, 10), 0.0)
    assert of(CreateStage, state.handle(Ready(7, HEAD, {}), 0.0)) == [CreateStage(naming.txn_id(EPOCH, 1), "")]
    started = state.handle(StageCreated(naming.txn_id(EPOCH, 1)), 0.0)
    assert of(CreateStage, started) == [CreateStage(naming.txn_id(EPOCH, 2), "")]
    state.handle(StageCreated(naming.txn_id(EPOCH, 2)), 0.1)
    for tp, log_end in ((ORDERS, 40), (CLICKS, 10)):  # past the interval, nothing to read: it stays open
        assert of(Broadcast, state.handle(told(tp, log_end, txn=naming.txn_id(EPOCH, 1)), 1.5)) == []
    return state


def test_records_for_a_table_the_spare_has_no_stage_table_for_end_an_idle_txn_only_once_a_spare_has_one() -> None:
    state = idle_routed_leader()
    t1, t2, t3 = (naming.txn_id(EPOCH, n) for n in (1, 2, 3))
    arrived = state.handle(told(CLICKS, 12, txn=t1), 2.0)  # records arrive in clicks
    assert of(Broadcast, arrived) == []  # no END yet: txn 2's spare has no stage table for clicks
    assert of(DropStage, arrived) == [DropStage(t2, "", None)]
    assert of(CreateStage, arrived) == [CreateStage(t3, stages(3, "clicks"))]
    ended = state.handle(StageCreated(t3), 2.1)
    (end,) = [a.message for a in of(Broadcast, ended) if isinstance(a.message, EndCommit)]
    assert end.txn == t1 and end.next is not None and end.next.txn == t3
    assert {s.topic: s.stage_table for s in end.next.stage_tables} == {"clicks": stages(3, "clicks"), "orders": ""}


def test_a_txn_that_read_rows_ends_at_once_on_its_spare_though_the_spare_misses_a_table_with_records() -> None:
    state = idle_routed_leader()
    t1, t2 = naming.txn_id(EPOCH, 1), naming.txn_id(EPOCH, 2)
    ended = state.handle(told(ORDERS, 41, txn=t1, read=1), 1.8)  # as if orders had a stage table in txn 1
    (end,) = [a.message for a in of(Broadcast, ended) if isinstance(a.message, EndCommit)]
    assert end.next is not None and end.next.txn == t2  # reading goes on without a pause
    assert of(DropStage, ended) == []


def test_an_idle_txn_waits_for_a_fresh_spare_no_longer_than_idle_interval_s() -> None:
    state = idle_routed_leader()
    t1, t3 = naming.txn_id(EPOCH, 1), naming.txn_id(EPOCH, 3)
    state.handle(told(CLICKS, 12, txn=t1), 2.0)  # txn 3's stage tables are asked for, never created
    late = state.handle(told(CLICKS, 12, txn=t1), 30.5)
    (end,) = [a.message for a in of(Broadcast, late) if isinstance(a.message, EndCommit)]
    assert end.txn == t1 and end.next is None  # goes alone: txn 3 starts once its stage tables exist
    assert t3 not in {a.message.txn for a in of(Broadcast, late)}
