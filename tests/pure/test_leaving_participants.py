"""Participants that leave cleanly (their job got SIGTERM): the leader's side and the participant's.

The job's driver sends ``Leave(job)``; each task of that job heartbeats ``leaving`` at once,
finishes its part of the txns it is in (stages what it read, sends WRITE-STATUS) and stops once it
owes nothing and has listened for two more heartbeat intervals. The leader ends a txn whose holder
leaves at once (once every older txn is committed), alone, names a leaving copy in no START, and
so never aborts for its silence afterwards. Events in, the exact actions out; the invariants are
checked after every event (``tests/pure/conftest.py``).
"""

from __future__ import annotations

from protocol.coordinator.events import (
    Commit,
    CommitResult,
    Counted,
    CountStage,
    Phase,
    Publish,
    Received,
    RecordStarted,
    Tick,
)
from protocol.messages import (
    EndCommit,
    Heartbeat,
    Leave,
    PartitionOffset,
    PartitionPosition,
    StartCommit,
    TopicPartition,
)
from protocol.participant.events import Received as Heard, Send, Tick as Beat
from protocol.participant.state import ParticipantState
from tests.pure.coordinator_driver import (
    EPOCH,
    HEAD_SEQ,
    LEARNT,
    P0,
    P1,
    PIPE,
    T0,
    Driver,
    abort,
    ack,
    chained_end,
    continuing,
    create,
    end,
    start,
    ws,
)
from tests.pure.test_participant_state import TP0, TP1, P, end as part_end, polled, staged, stages, status

END_1 = {P0: 50, P1: 5}
END_2 = {P0: 58, P1: 9}


def beat(tp: TopicPartition, *, sender: str = "", txn: str = "", leaving: bool = False) -> Received:
    """A heartbeat of ``tp``'s copy ``sender`` (``part-<n>`` by default) that continues, maybe leaving."""
    position = PartitionPosition(topic=tp.topic, partition=tp.partition, position=0, log_end=-1)
    return Received(
        Heartbeat(
            pipeline=PIPE,
            epoch=EPOCH,
            txn=txn,
            sender=sender or f"part-{tp.partition}",
            partitions=(position,),
            continues=True,
            leaving=leaving,
        )
    )


def leaving(*tps: TopicPartition, txn: str = "") -> list[Received]:
    return [beat(tp, txn=txn, leaving=True) for tp in tps]


# ---- the leader -------------------------------------------------------------------------


def test_holders_that_leave_end_the_open_txn_at_once_and_it_commits_without_an_abort() -> None:
    d = Driver()
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.2)
    # Both holders leave a third of the way into the interval: END at once, alone (no START for them).
    assert d.at(T0 + 0.3, *leaving(P0, P1, txn=t1.id)) == [end(1)]
    assert (t1.phase, t1.ended_at) == (Phase.ENDING, T0 + 0.3)
    assert d.at(T0 + 0.4, ws(t1.id, P0, 40, 50, 10)) == []
    assert d.at(T0 + 0.5, ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]  # and no START
    assert d.at(T0 + 0.6, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 0.7, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    # The leaving copies are gone: long past the heartbeat timeout nothing aborts and nothing starts.
    assert d.at(T0 + 10, Tick()) == []
    assert d.state.txns == [t1] and d.state.live_partitions(T0 + 10) == set()
    # The restarted job's tasks heartbeat: the next START names them, from where txn 1 ended.
    new = {P0: "part-0b", P1: "part-1b"}
    actions = d.at(T0 + 11, *(beat(tp, sender=s) for tp, s in new.items()))
    assert actions == [start(2, END_1, new, chunk_rows=LEARNT), RecordStarted(d.txn(2)), create(3)]


def test_leaving_copies_are_not_live_and_get_no_start_after_the_txn_they_end() -> None:
    d = Driver()
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.2)
    assert d.at(T0 + 0.3, *leaving(P0, P1, txn=t1.id)) == [end(1)]
    assert d.state.live_partitions(T0 + 0.3) == set()
    # The WRITE-STATUS set completes while they still heartbeat: no START names a leaving copy.
    assert d.at(T0 + 0.4, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 0.5, *leaving(P0, P1), Tick()) == []


def test_a_chained_txn_whose_holders_leave_ends_alone_once_the_previous_one_commits() -> None:
    """The END of txn 1 carried the START of txn 2 before the leader heard the holders leave: txn 2
    ends as soon as txn 1 is committed (not at its interval), alone, and commits too."""
    d = Driver()
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    actions = d.at(T0 + 1, beat(P0, txn=t1.id), beat(P1, txn=t1.id))
    t2 = d.txn(2)
    assert actions == [chained_end(1, continuing(P0, P1)), RecordStarted(t2), create(3)]
    assert d.at(T0 + 1.1, *leaving(P0, P1, txn=t2.id)) == []  # txn 1 is not committed yet
    assert d.at(T0 + 1.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 1.3, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    actions = d.at(T0 + 1.4, CommitResult(t1.id, won=True))
    assert actions == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1), end(2)]
    assert d.at(T0 + 1.5, ws(t2.id, P0, 50, 58, 8), ws(t2.id, P1, 5, 9, 4)) == [CountStage(t2.id, t2.stage_table)]
    assert d.at(T0 + 1.6, Counted(t2.id, 12)) == [Commit(t2, HEAD_SEQ + 2)]
    assert d.at(T0 + 1.7, CommitResult(t2.id, won=True)) == [ack(2, END_2, HEAD_SEQ + 2)]
    assert d.at(T0 + 20, Tick()) == []


def test_a_live_copy_takes_over_the_partition_of_a_leaving_holder_at_the_next_start() -> None:
    d = Driver()
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.2)
    assert d.at(T0 + 0.3, beat(P1, sender="part-1b")) == []  # a second copy of P1's participant, not holder
    # P1's holder leaves: END at once, alone (a new holder cannot continue what another one cut).
    assert d.at(T0 + 0.4, beat(P1, txn=t1.id, leaving=True)) == [end(1)]
    assert d.at(T0 + 0.5, ws(t1.id, P0, 40, 50, 10)) == []
    actions = d.at(T0 + 0.6, beat(P0), beat(P1, sender="part-1b"), ws(t1.id, P1, 0, 5, 5))
    t2 = d.txn(2)
    assert actions == [
        CountStage(t1.id, t1.stage_table),
        start(2, END_1, {P1: "part-1b"}, chunk_rows=LEARNT),
        RecordStarted(t2),
        create(3),
    ]


def test_a_leaving_holder_that_dies_before_its_write_status_still_aborts_the_txn() -> None:
    """Leaving is no excuse for silence: a holder that stops heartbeating while it owes a WRITE-STATUS
    is dead, as before."""
    d = Driver()
    t1 = d.started(T0, continues=True)
    assert d.at(T0 + 0.3, *leaving(P0, P1, txn=t1.id)) == [end(1)]
    assert d.at(T0 + 0.4, ws(t1.id, P0, 40, 50, 10)) == []
    why = "participant of events-1 stopped sending heartbeats"
    assert d.at(T0 + 3.4, Tick()) == abort(t1, why, "participant-dead")


# ---- the participant ----------------------------------------------------------------------

JOB = "driver-1"


def task(job: str = JOB) -> ParticipantState:
    """A task of TP0 and TP1 in the participant job ``job``, heartbeating every second."""
    return ParticipantState(
        pipeline=P,
        sender="task-0",
        partitions=[TP0, TP1],
        chunk_rows=2,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
        job=job,
    )


def leave(job: str = JOB, pipeline: str = P) -> Heard:
    return Heard(Leave(pipeline=pipeline, epoch=0, txn="", sender="driver", job=job))


def start_of(txn: str, offsets: dict[TopicPartition, int], epoch: int = 2) -> Heard:
    return Heard(
        StartCommit(
            pipeline=P,
            epoch=epoch,
            txn=txn,
            sender="coord",
            stage_table=f"t__chtxn_{txn}",
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in offsets.items()
            ),
        )
    )


def hb_sent(txn: str, epoch: int, *positions: tuple[TopicPartition, int, int]) -> Send:
    """The heartbeat a leaving task sends: ``(partition, position, rows read)`` each."""
    return Send(
        Heartbeat(
            pipeline=P,
            epoch=epoch,
            txn=txn,
            sender="task-0",
            partitions=tuple(
                PartitionPosition(topic=tp.topic, partition=tp.partition, position=o, log_end=-1, buffered_rows=rows)
                for tp, o, rows in positions
            ),
            continues=True,
            leaving=True,
        )
    )


def test_a_task_told_to_leave_finishes_its_txn_then_stops_without_waiting_for_another() -> None:
    m = task()
    m.handle(start_of("e2_t1", {TP0: 10, TP1: 20}), 0)
    m.handle(polled(TP0, 10, 11, 12), 0)  # chunk 0 (10-11) cut, 12 in the open chunk
    # Told to leave: it says so at once, and goes on reading into its txn until END.
    assert m.handle(leave(), 5.0) == [hb_sent("e2_t1", 2, (TP0, 13, 3), (TP1, 20, 0))]
    assert m.leaving and not m.left(5.0)
    assert m.consuming
    assert m.handle(Beat(), 6.0) == [hb_sent("e2_t1", 2, (TP0, 13, 3), (TP1, 20, 0))]
    # END: the open chunk is staged; WRITE-STATUS once every chunk is in. Not a second earlier it stops.
    acts = m.handle(part_end("e2_t1", epoch=2), 6.1)
    assert stages(acts[:1]) == [("t__chtxn_e2_t1", "pl/e2_t1/src/0/1/12-13", [12])]
    assert acts[1:] == [status("e2_t1", TP1, 20, 20, 0, 0, epoch=2)]
    assert not m.left(6.2)
    assert m.handle(staged("e2_t1", TP0, 0, 2), 6.2) == []
    assert not m.left(6.3)
    assert m.handle(staged("e2_t1", TP0, 1, 1), 6.3) == [status("e2_t1", TP0, 10, 13, 3, 2, epoch=2)]
    # It owes nothing; it listens two heartbeat intervals after the leave for a START sent before the
    # leader heard it, then stops.
    assert not m.left(6.9)
    assert m.left(7.0)


def test_a_start_that_names_a_leaving_task_is_finished_before_it_stops() -> None:
    m = task()
    assert m.handle(leave(), 1.0) == [hb_sent("", 0, (TP0, -1, 0), (TP1, -1, 0))]
    assert not m.left(2.9)
    m.handle(start_of("e2_t4", {TP0: 30}), 2.9)  # sent before the leader heard this task leave
    assert not m.left(3.0) and not m.left(30.0)
    assert m.handle(part_end("e2_t4", epoch=2), 30.0) == [status("e2_t4", TP0, 30, 30, 0, 0, epoch=2)]
    assert m.left(30.0)


def test_a_leave_for_another_job_or_pipeline_changes_nothing() -> None:
    m = task()
    m.handle(start_of("e2_t1", {TP0: 10}), 0)
    assert m.handle(leave(job="driver-2"), 1.0) == []
    assert m.handle(leave(pipeline="other"), 1.0) == []
    assert not m.leaving and not m.left(100.0)
    assert task(job="").handle(leave(job=""), 1.0) == []  # a task of no job (an older driver) never leaves


def test_a_second_leave_is_nothing_new() -> None:
    m = task()
    assert len(m.handle(leave(), 1.0)) == 1
    assert m.handle(leave(), 1.5) == []
    assert not m.left(2.9) and m.left(3.0)


def test_a_task_that_is_not_leaving_heartbeats_as_before() -> None:
    m = task()
    m.handle(start_of("e2_t1", {TP0: 10}), 0)
    (sent,) = m.handle(Beat(), 0)
    assert isinstance(sent, Send) and isinstance(sent.message, Heartbeat)
    assert (sent.message.leaving, sent.message.continues) == (False, True)


def test_an_end_of_a_txn_it_is_not_in_leaves_a_leaving_task_free_to_stop() -> None:
    m = task()
    m.handle(leave(), 1.0)
    assert m.handle(Heard(EndCommit(pipeline=P, epoch=2, txn="e2_t9", sender="coord")), 2.0) == []
    assert m.left(3.0)
