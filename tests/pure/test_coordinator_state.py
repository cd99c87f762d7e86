"""The coordinator state machine on its happy paths: events in, the exact actions out.

Walks docs/architecture.md §4: the stage table made one txn ahead (the spare), START only once every
partition is held, END by interval or size, verify, commit point, ACK and publish, empty commits,
pipelining (END only after the previous txn is committed), shutdown and new partitions. Here the
participants are older ones (no ``continues``), so END goes alone; continuous txns are in
``test_coordinator_chaining.py``, aborts and stepping down in ``test_coordinator_aborts.py``.
"""

from __future__ import annotations

from protocol.coordinator.events import (
    Commit,
    CommitResult,
    Counted,
    CountStage,
    GapFound,
    PartitionsChanged,
    PartitionStats,
    Phase,
    Publish,
    PublishResult,
    Ready,
    RecordStarted,
    Shutdown,
    StageCreated,
    Stopped,
    Tick,
)
from protocol.messages import TopicPartition
from tests.pure.coordinator_driver import (
    HEAD,
    HEAD_SEQ,
    INITIAL,
    LEARNT,
    P0,
    P1,
    P2,
    START_1,
    T0,
    Driver,
    abort,
    ack,
    beats,
    create,
    drop,
    end,
    hb,
    start,
    txn_id,
    ws,
)

END_1 = {P0: 50, P1: 5}
END_2 = {P0: 58, P1: 9}


def complete_1(d: Driver, now: float) -> list:
    """WRITE-STATUS of both partitions of txn 1: 10 + 5 rows, ends ``END_1``."""
    assert d.at(now, ws("e3_t1", P0, 40, 50, 10)) == []
    return d.at(now, ws("e3_t1", P1, 0, 5, 5))


def committed_1(d: Driver) -> None:
    """Txn 1 through START, END, WRITE-STATUS, verify and the commit point; txn 2's stage table
    (the spare) is being created."""
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert complete_1(d, T0 + 1.5) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 1.6, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.7, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]


# ---- step 1-3: START ------------------------------------------------------------------


def test_nothing_starts_before_ready() -> None:
    d = Driver()
    assert d.at(T0, *beats(P0, P1), Tick()) == []


def test_no_start_until_every_partition_is_held_by_a_live_participant() -> None:
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL)) == [create(1)]  # the stage table is made ahead
    assert d.at(T0, StageCreated(txn_id(1))) == []
    assert d.at(T0, hb(P0)) == []
    assert d.at(T0 + 3.5, hb(P1)) == []  # P0's participant has been silent past heartbeat_timeout_s
    actions = d.at(T0 + 4, hb(P0))
    assert actions == [start(1, START_1), RecordStarted(d.txn(1)), create(2)]


def test_start_offsets_are_the_ledger_head_and_initial_for_never_committed_partitions() -> None:
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL), *beats(P0, P1)) == [create(1)]
    spare = d.state.spare
    assert spare is not None and (spare.txn, spare.stage_table, spare.ready) == (
        "e3_t1",
        "shop.orders__chtxn_orders__e3_t1",
        False,
    )
    assert d.at(T0 + 0.2, Tick()) == [] and d.state.txns == []  # no START before the stage table exists
    actions = d.at(T0 + 0.3, StageCreated("e3_t1"))
    t1 = d.txn(1)
    assert actions == [start(1, {P0: 40, P1: 0}), RecordStarted(t1), create(2)]  # and the next spare at once
    assert (t1.phase, t1.started_at, t1.holders) == (Phase.COLLECTING, T0 + 0.3, {P0: "part-0", P1: "part-1"})
    assert (t1.stage_table, t1.after, t1.chained) == ("shop.orders__chtxn_orders__e3_t1", None, False)


# ---- step 3: END ----------------------------------------------------------------------


def test_end_after_the_interval() -> None:
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.5, *beats(P0, P1), Tick()) == []
    assert d.at(T0 + 0.999, Tick()) == []
    assert d.at(T0 + 1.0, Tick()) == [end(1)]
    assert d.txn(1).phase is Phase.ENDING
    assert d.at(T0 + 1.1, Tick()) == []  # END goes out once


def test_end_early_when_heartbeats_report_the_size_trigger() -> None:
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.1, hb(P0, txn="e3_t1", buffered=59)) == []
    assert d.at(T0 + 0.2, hb(P1, txn="e3_t0", buffered=90)) == []  # rows of another txn do not count
    assert d.at(T0 + 0.3, hb(P1, txn="e3_t1", buffered=40)) == []
    assert d.at(T0 + 0.4, hb(P1, txn="e3_t1", buffered=41)) == [end(1)]  # 59 + 41 reaches 100


def test_end_at_once_when_one_partition_reports_itself_full() -> None:
    """Issue 29, defect 7: trigger 100 over two partitions, a share of 50, full at 60. A hot
    partition that is full ends the txn at once (its next txn follows the END), instead of
    waiting with an idle partition beside it until the interval."""
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.1, hb(P0, txn="e3_t1", buffered=59), hb(P1, txn="e3_t1")) == []
    assert d.at(T0 + 0.2, hb(P0, txn="e3_t1", buffered=60)) == [end(1)]


# ---- steps 4-7: WRITE-STATUS, verify, commit point, ACK, publish ------------------------


def test_a_full_transaction_commits_then_publishes() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.2, ws("e3_t1", P0, 40, 50, 10)) == []
    assert t1.phase is Phase.ENDING and t1.missing == [P1]
    d.spare_ready(2, T0 + 1.25)  # no START while txn 1 is still ending
    # The set is complete: verify it, and pipeline txn 2 at once on the spare (and make the next spare).
    actions = d.at(T0 + 1.3, ws("e3_t1", P1, 0, 5, 5))
    t2 = d.txn(2)
    assert actions == [
        CountStage(t1.id, t1.stage_table),
        start(2, END_1, chunk_rows=LEARNT),
        RecordStarted(t2),
        create(3),
    ]
    assert d.at(T0 + 1.4, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert t1.phase is Phase.COMMITTING and d.state.head == HEAD
    assert d.at(T0 + 1.5, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    assert (d.state.head_seq, d.state.head) == (HEAD_SEQ + 1, END_1)
    assert d.at(T0 + 1.6, PublishResult(t1.id, ok=True)) == []
    assert d.state.txn(t1.id) is None and [t.id for t in d.state.txns] == ["e3_t2"]


def test_an_idle_interval_still_commits_an_empty_transaction() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 40, 0)) == []
    assert d.at(T0 + 1.2, ws("e3_t1", P1, 0, 0, 0)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 1.3, Counted(t1.id, 0)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.4, CommitResult(t1.id, won=True)) == [ack(1, START_1, HEAD_SEQ + 1), Publish(t1)]


def test_write_status_before_end_completes_the_set_at_end() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, ws("e3_t1", P0, 40, 50, 10), ws("e3_t1", P1, 0, 5, 5)) == []
    assert d.at(T0 + 1, *beats(P0, P1)) == [end(1), CountStage(t1.id, t1.stage_table)]


def test_a_failed_publish_is_retried_after_publish_retry_s() -> None:
    d = Driver()
    committed_1(d)
    t1 = d.txn(1)
    assert d.at(T0 + 2, PublishResult(t1.id, ok=False, error="Code: 999. Keeper down")) == []
    assert d.at(T0 + 3.9, Tick()) == []
    assert d.at(T0 + 4, Tick()) == [Publish(t1)]
    assert d.at(T0 + 4.5, Tick()) == []  # one retry in flight at a time
    assert d.at(T0 + 5, PublishResult(t1.id, ok=True)) == []
    assert d.state.txn(t1.id) is None


# ---- pipelining -----------------------------------------------------------------------


def test_next_start_goes_out_from_the_reported_ends_and_commits_only_after_the_previous() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert complete_1(d, T0 + 1.1) == [CountStage(t1.id, t1.stage_table)]  # txn 2's spare is not ready yet
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    assert (t2.start, t2.after, t2.chained) == (END_1, t1.id, False)
    d.spare_ready(3, T0 + 1.3)
    # Txn 2's interval is up while txn 1 is still being verified, then committed: its END waits
    # (its participants read on) until txn 1 is committed.
    assert d.at(T0 + 2.2, *beats(P0, P1), Tick()) == []
    assert d.at(T0 + 2.3, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 2.35, *beats(P0, P1), Tick()) == []
    assert t2.phase is Phase.COLLECTING
    assert d.at(T0 + 2.4, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1), end(2)]
    actions = d.at(T0 + 2.5, ws(t2.id, P0, 50, 58, 8), ws(t2.id, P1, 5, 9, 4))
    t3 = d.txn(3)
    assert actions == [
        CountStage(t2.id, t2.stage_table),
        start(3, END_2, chunk_rows=LEARNT),
        RecordStarted(t3),
        create(4),
    ]
    assert d.at(T0 + 2.6, Counted(t2.id, 12)) == [Commit(t2, HEAD_SEQ + 2)]
    # Publishes go in commit order: txn 2's waits until txn 1's is done.
    assert d.at(T0 + 2.7, CommitResult(t2.id, won=True)) == [ack(2, END_2, HEAD_SEQ + 2)]
    assert d.at(T0 + 2.8, PublishResult(t1.id, ok=True)) == [Publish(t2)]


def test_an_abort_at_verify_cascades_to_the_pipelined_txn_and_restarts_from_the_ledger_head() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.1)
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    why = "row-count mismatch: stage table holds 14, participants reported 15"
    assert d.at(T0 + 1.3, Counted(t1.id, 14)) == [
        *abort(t1, why, "row-count-mismatch"),
        *abort(t2, f"cascade: e3_t1 aborted ({why})", "cascade"),
    ]
    actions = d.at(T0 + 1.4, StageCreated(txn_id(3)))
    t3 = d.txn(3)
    assert actions == [start(3, START_1, chunk_rows=LEARNT), RecordStarted(t3), create(4)]
    assert (t3.start, t3.after) == (START_1, None)


def test_an_abort_while_the_spare_is_being_created_keeps_the_spare_for_the_restart() -> None:
    """No txn exists before its stage table: an abort touches only started txns, and the spare
    being created becomes the next txn, from the ledger head."""
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.1)
    why = "could not count the stage table: Code: 210. connection refused"
    assert d.at(T0 + 1.2, Counted(t1.id, None, "Code: 210. connection refused")) == abort(t1, why, "count-failed")
    assert d.state.txns == []
    actions = d.at(T0 + 1.3, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, START_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    assert t2.after is None


def test_an_abort_of_the_pipelined_txn_leaves_the_previous_one_committing() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.1)
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    assert d.at(T0 + 1.3, ws(t2.id, P1, 5, 9, 4, errors=("boom",))) == abort(
        t2, "events-1 failed: boom", "participant-error"
    )
    actions = d.at(T0 + 1.35, StageCreated(txn_id(3)))
    t3 = d.txn(3)
    assert actions == [start(3, END_1, chunk_rows=LEARNT), RecordStarted(t3), create(4)]
    assert (t3.start, t3.after) == (END_1, t1.id)  # still pipelined after txn 1
    assert d.at(T0 + 1.4, Counted(t1.id, 15), CommitResult(t1.id, won=True)) == [
        Commit(t1, HEAD_SEQ + 1),
        ack(1, END_1, HEAD_SEQ + 1),
        Publish(t1),
    ]


# ---- shutdown -------------------------------------------------------------------------


def test_shutdown_aborts_the_open_txn_and_stops_once_the_committed_one_is_published() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.1)
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    # The open txn aborts and the spare being created is dropped.
    assert d.at(T0 + 1.3, Shutdown()) == [*abort(t2, "coordinator shutting down", "shutdown"), drop(3)]
    assert d.at(T0 + 1.35, StageCreated(txn_id(3))) == []  # a late answer for the dropped spare
    assert d.at(T0 + 1.4, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.5, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    assert d.at(T0 + 1.6, *beats(P0, P1), Tick()) == []  # no new txn while stopping
    assert d.at(T0 + 1.7, PublishResult(t1.id, ok=True)) == [Stopped()]


def test_shutdown_with_nothing_committed_stops_at_once() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, Shutdown()) == [*abort(t1, "coordinator shutting down", "shutdown"), drop(2), Stopped()]


def test_shutdown_aborts_a_txn_whose_end_waits_behind_a_commit() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.1)
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    d.spare_ready(3, T0 + 1.3)
    assert d.at(T0 + 2.2, *beats(P0, P1)) == []  # txn 2's END waits for txn 1's commit
    assert d.at(T0 + 2.4, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    # Not ended, so not ended now either: aborted, and the ready spare dropped.
    assert d.at(T0 + 2.5, Shutdown()) == [*abort(t2, "coordinator shutting down", "shutdown"), drop(3)]
    assert d.at(T0 + 2.6, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    assert d.at(T0 + 2.7, PublishResult(t1.id, ok=True)) == [Stopped()]


# ---- partitions -----------------------------------------------------------------------


def test_a_new_partition_joins_the_next_txn_once_it_is_held() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, PartitionsChanged((P0, P1, P2), {P2: 7})) == []
    assert t1.start == START_1  # the open txn keeps its partitions
    assert d.at(T0 + 0.6, ws("e3_t1", P2, 7, 9, 2)) == []  # not a partition of txn 1: ignored
    d.spare_ready(2, T0 + 0.7)
    d.ended(1, T0 + 1)
    assert complete_1(d, T0 + 1.1) == [CountStage(t1.id, t1.stage_table)]  # P2 not held yet
    actions = d.at(T0 + 1.2, hb(P2))
    t2 = d.txn(2)
    assert actions == [start(2, {**END_1, P2: 7}, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    assert d.at(T0 + 1.5, Counted(t1.id, 15), CommitResult(t1.id, won=True)) == [
        Commit(t1, HEAD_SEQ + 1),
        ack(1, END_1, HEAD_SEQ + 1),
        Publish(t1),
    ]
    d.ended(2, T0 + 2.2)  # END needs no heartbeat from P2, but P2 must stay alive
    assert d.at(T0 + 2.3, hb(P2)) == []
    assert d.at(T0 + 2.5, *(ws(t2.id, tp, s, s, 0) for tp, s in t2.start.items())) == [
        CountStage(t2.id, t2.stage_table),
    ]
    assert d.at(T0 + 2.6, Counted(t2.id, 0)) == [Commit(t2, HEAD_SEQ + 2)]


def test_ready_with_no_partitions_starts_nothing() -> None:
    d = Driver()
    assert d.at(T0, Ready(0, {}, {}), hb(TopicPartition(topic="other", partition=0)), Tick()) == []


def test_partitions_changed_never_moves_the_start_of_a_known_never_committed_partition() -> None:
    d = Driver()
    t1 = d.started(T0)  # P1 was never committed: txn 1 reads it from its initial offset, 0
    assert d.at(T0 + 0.5, PartitionsChanged((P0, P1, P2), {P1: 3, P2: 7}), hb(P2)) == []
    d.spare_ready(2, T0 + 0.6)
    d.ended(1, T0 + 1)
    actions = complete_1(d, T0 + 1.1)
    assert actions == [
        CountStage(t1.id, t1.stage_table),
        start(2, {**END_1, P2: 7}, chunk_rows=LEARNT),
        RecordStarted(d.txn(2)),
        create(3),
    ]
    assert d.at(T0 + 1.2, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]  # not an offset mismatch


def test_after_an_abort_a_never_committed_partition_restarts_from_its_first_initial_offset() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, PartitionsChanged((P0, P1), {P1: 3})) == []
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P1, 0, 5, 5, errors=("boom",))) == abort(
        t1, "events-1 failed: boom", "participant-error"
    )
    actions = d.at(T0 + 1.2, StageCreated(txn_id(2)))
    assert actions == [start(2, START_1), RecordStarted(d.txn(2)), create(3)]  # P1's records 0-2 are read again


def test_lag_is_log_end_from_heartbeats_minus_the_committed_offset() -> None:
    from protocol.coordinator.events import Received
    from protocol.messages import Heartbeat, PartitionPosition

    positions = (
        PartitionPosition(topic=P0.topic, partition=0, position=45, log_end=70),
        PartitionPosition(topic=P1.topic, partition=1, position=0, log_end=-1),
    )
    beat = Received(Heartbeat(pipeline="orders", epoch=3, txn="", sender="x", partitions=positions))
    before = Driver()
    before.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL), beat)
    assert before.state.lag() == {P0: 70 - HEAD[P0]}  # P1's log end is unknown
    after = Driver()
    committed_1(after)
    after.at(T0 + 2, beat)
    assert after.state.lag() == {P0: 70 - END_1[P0]}


# ---- publish order, per-partition verify, structure, gaps ------------------------------


def test_a_failed_publish_holds_back_the_publish_of_the_next_commit() -> None:
    """Visibility in commit order: txn 2 is committed but waits until txn 1 is in the target."""
    d = Driver()
    committed_1(d)
    t1 = d.txn(1)
    assert d.at(T0 + 1.8, PublishResult(t1.id, ok=False, error="Code: 999. Keeper down")) == []
    actions = d.at(T0 + 1.8, StageCreated(txn_id(2)))
    t2 = d.txn(2)
    assert actions == [start(2, END_1, chunk_rows=LEARNT), RecordStarted(t2), create(3)]
    d.ended(2, T0 + 2.8)  # txn 1 is committed (publishing): txn 2 may end
    assert d.at(T0 + 2.9, ws(t2.id, P0, 50, 58, 8), ws(t2.id, P1, 5, 9, 4)) == [CountStage(t2.id, t2.stage_table)]
    assert d.at(T0 + 3.0, Counted(t2.id, 12)) == [Commit(t2, HEAD_SEQ + 2)]
    assert d.at(T0 + 3.1, CommitResult(t2.id, won=True)) == [ack(2, END_2, HEAD_SEQ + 2)]  # no Publish(t2)
    assert d.at(T0 + 3.8, Tick()) == [Publish(t1)]  # the retry of txn 1 comes first
    assert d.at(T0 + 3.9, PublishResult(t1.id, ok=True)) == [Publish(t2)]


def test_rows_of_a_partition_that_differ_from_its_write_status_abort_even_when_the_total_matches() -> None:
    """A second writer's chunk can make one partition hold more and another fewer rows."""
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.5)
    stats = {P0: PartitionStats(11, 40, 50), P1: PartitionStats(4, 0, 3)}
    assert d.at(T0 + 1.6, Counted(t1.id, 15, partitions=stats)) == abort(
        t1, "row-count mismatch: events-0: stage table holds 11 rows, its participant reported 10", "row-count-mismatch"
    )


def test_offsets_outside_a_partitions_reported_range_abort() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.5)
    stats = {P0: PartitionStats(10, 39, 48), P1: PartitionStats(5, 0, 4)}
    assert d.at(T0 + 1.6, Counted(t1.id, 15, partitions=stats)) == abort(
        t1,
        "row-count mismatch: events-0: stage table holds offsets 39..48, outside the reported [40, 50)",
        "row-count-mismatch",
    )


def test_matching_partitions_commit() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.5)
    stats = {P0: PartitionStats(10, 40, 49), P1: PartitionStats(5, 0, 4)}
    assert d.at(T0 + 1.6, Counted(t1.id, 15, partitions=stats)) == [Commit(t1, HEAD_SEQ + 1)]


def test_a_target_altered_after_staging_aborts_before_the_commit_point() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.5)
    assert d.at(T0 + 1.6, Counted(t1.id, 15, altered="columns added: note")) == [
        *abort(
            t1,
            "the target table changed after the stage table was made (columns added: note); the next txn "
            "stages in the new structure",
            "target-altered",
        ),
        drop(2),
        create(3),
    ]  # the spare was made like the old target too: a new one, like the new target
    assert d.at(T0 + 1.7, StageCreated(txn_id(2))) == []  # a late answer for the dropped spare
    actions = d.at(T0 + 1.8, StageCreated(txn_id(3)))
    assert actions == [start(3, START_1, chunk_rows=LEARNT), RecordStarted(d.txn(3)), create(4)]


def test_a_skipped_gap_moves_the_start_past_the_head() -> None:
    """on_gap = skip: the next START goes out from where the gap ends, not from the (deleted) head."""
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, {**INITIAL, P0: 70}), *beats(P0, P1)) == [create(1)]
    actions = d.at(T0, StageCreated(txn_id(1)))
    assert actions == [start(1, {P0: 70, P1: 0}), RecordStarted(d.txn(1)), create(2)]


def test_a_gap_found_while_leading_aborts_the_txn_below_it_at_verify_and_restarts_above_it() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, GapFound(P0, 45)) == []
    d.ended(1, T0 + 1)
    complete_1(d, T0 + 1.5)
    assert d.at(T0 + 1.6, Counted(t1.id, 15)) == abort(
        t1, "events-0 started at 40, ledger head is 45", "offset-mismatch"
    )
    actions = d.at(T0 + 1.7, StageCreated(txn_id(2)))
    assert actions == [start(2, {P0: 45, P1: 0}, chunk_rows=LEARNT), RecordStarted(d.txn(2)), create(3)]
