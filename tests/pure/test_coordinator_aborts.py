"""The coordinator state machine when things go wrong: aborts, ignored messages, stepping down.

docs/architecture.md §4 steps 4-6 and §13: every abort broadcasts ABORT (a txn exists only
once its START went out), drops the stage table with ``AbortTxn``, and the next txn starts from
the ledger head; a stage table that cannot be made aborts nothing and is retried; a lost or
unknown commit slot, or a newer coordinator, makes the leader step down and go inert.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol.coordinator.events import (
    Commit,
    CommitResult,
    Counted,
    CountStage,
    Phase,
    Publish,
    PublishResult,
    Ready,
    Received,
    RecordStarted,
    Shutdown,
    StageCreated,
    StepDown,
    Stopped,
    Tick,
)
from protocol.messages import Abort, AckCommit, EndCommit, LeaderHeartbeat, StartCommit
from tests.pure.coordinator_driver import (
    EPOCH,
    HEAD,
    HEAD_SEQ,
    INITIAL,
    LEARNT,
    ME,
    P0,
    P1,
    PIPE,
    START_1,
    T0,
    TIMING,
    Driver,
    abort,
    ack,
    beats,
    create,
    drop,
    hb,
    start,
    txn_id,
    ws,
)


def verifying_1(d: Driver) -> None:
    """Txn 1 complete (10 + 5 rows) and being counted; txn 2's stage table (the spare) is being created."""
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 50, 10), ws("e3_t1", P1, 0, 5, 5)) == [
        CountStage(t1.id, t1.stage_table),
    ]


# ---- step 2 and step 4 ----------------------------------------------------------------


def test_a_stage_table_that_cannot_be_created_is_retried_after_publish_retry_s_without_an_abort() -> None:
    """No txn exists before its stage table does: a failed CreateStage aborts nothing; a new
    spare (the next txn id) is tried after ``publish_retry_s``."""
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL), *beats(P0, P1)) == [create(1)]
    assert d.at(T0 + 0.5, StageCreated(txn_id(1), ok=False, error="Code: 57. Table already exists")) == []
    assert (d.state.txns, d.state.spare) == ([], None)
    assert d.at(T0 + 1, StageCreated(txn_id(1))) == []  # a late answer for the discarded spare starts nothing
    assert d.at(T0 + 2.4, *beats(P0, P1), Tick()) == []
    assert d.at(T0 + 2.5, Tick()) == [create(2)]
    assert d.at(T0 + 2.6, Tick()) == []  # one at a time
    actions = d.at(T0 + 2.7, StageCreated(txn_id(2)))
    assert actions == [start(2, START_1), RecordStarted(d.txn(2)), create(3)]


def test_a_failed_spare_for_the_next_txn_is_retried_while_the_current_one_goes_on() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, StageCreated(txn_id(2), ok=False, error="Code: 210. connection refused")) == []
    assert t1.phase is Phase.COLLECTING and d.state.spare is None
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 50, 10), ws("e3_t1", P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 2.4, Tick()) == []
    assert d.at(T0 + 2.5, Tick()) == [create(3)]
    actions = d.at(T0 + 2.6, StageCreated(txn_id(3)))
    assert actions == [start(3, {P0: 50, P1: 5}, chunk_rows=LEARNT), RecordStarted(d.txn(3)), create(4)]


def test_a_missing_write_status_aborts_at_the_timeout_and_the_next_txn_restarts_from_the_head() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 50, 10)) == []
    for now in (T0 + 3, T0 + 5, T0 + 7, T0 + 9, T0 + 11):  # both participants keep heartbeating
        assert d.at(now, *beats(P0, P1), Tick()) == []
    assert t1.phase is Phase.ENDING  # 10 s after END is not yet past the timeout
    assert d.at(T0 + 11.5, *beats(P0, P1)) == abort(
        t1, "write-status timeout: nothing from events-1", "write-status-timeout"
    )
    actions = d.at(T0 + 11.6, StageCreated(txn_id(2)))
    assert actions == [start(2, START_1), RecordStarted(d.txn(2)), create(3)]


def test_a_participant_silent_past_the_heartbeat_timeout_aborts_before_the_write_status_timeout() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)  # last heartbeat of P1's participant
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 50, 10)) == []
    assert d.at(T0 + 4, hb(P0), Tick()) == []  # 3 s of silence is still alive
    assert d.at(T0 + 4.1, Tick()) == abort(t1, "participant of events-1 stopped sending heartbeats", "participant-dead")
    assert d.state.txns == []  # and no new START until P1 is held again, stage table or not
    d.spare_ready(2, T0 + 4.5)
    assert d.at(T0 + 5, hb(P0), Tick()) == []
    actions = d.at(T0 + 5.5, hb(P1, sender="part-1b"))
    assert actions == [start(2, START_1, holders={P1: "part-1b"}), RecordStarted(d.txn(2)), create(3)]


def test_a_participant_dying_before_end_aborts_at_once() -> None:
    d = Driver(replace(TIMING, interval_s=60.0))
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, hb(P1)) == []
    assert d.at(T0 + 3.5, hb(P1), Tick()) == abort(
        t1, "participant of events-0 stopped sending heartbeats", "participant-dead"
    )


def test_silence_is_judged_on_tick_only_so_a_stalled_leader_reads_its_backlog_first() -> None:
    """A leader blocked past the heartbeat timeout (e.g. by a slow ClickHouse) must not count its
    own stall as the participants' silence: the events it handles next judge no silence, the Tick
    the runner feeds right after reading the control topic does."""
    d = Driver(replace(TIMING, interval_s=60.0))
    t1 = d.started(T0)
    assert d.at(T0 + 5, hb(P0), hb(P1), Tick()) == []  # a 5 s stall, then the backlog: both alive
    assert d.at(T0 + 9, hb(P0)) == []
    assert d.at(T0 + 9, Tick()) == abort(t1, "participant of events-1 stopped sending heartbeats", "participant-dead")


def test_a_second_live_copy_of_a_participant_is_fenced_and_aborts_nothing() -> None:
    """Two live copies of one task (an executor lost while its Python worker runs on): they take
    turns heartbeating, but only the holder named in START counts."""
    d = Driver(replace(TIMING, interval_s=2.05))
    t1 = d.started(T0)
    for i in range(20):  # the copies alternate for 2 s: no abort
        assert d.at(T0 + 0.1 * i, hb(P1, sender="part-1" if i % 2 else "part-1-zombie"), Tick()) == []
    d.ended(1, T0 + 2.1)
    assert d.at(T0 + 2.1, ws("e3_t1", P1, 0, 7, 7, sender="part-1-zombie")) == []  # fenced: ignored
    assert d.state.ignored == 1
    assert d.at(T0 + 2.2, ws("e3_t1", P1, 0, 5, 5), ws("e3_t1", P0, 40, 50, 10)) == [
        CountStage(t1.id, t1.stage_table),
    ]
    actions = d.at(T0 + 2.3, StageCreated(txn_id(2)))
    assert actions == [
        start(2, {P0: 50, P1: 5}, chunk_rows=LEARNT),
        RecordStarted(d.txn(2)),
        create(3),
    ]  # the holder stays


def test_when_the_holder_dies_its_txn_aborts_and_the_next_start_names_the_live_copy() -> None:
    d = Driver(replace(TIMING, interval_s=60.0))
    t1 = d.started(T0)
    assert d.at(T0 + 2.0, hb(P0), hb(P1, sender="part-1-retry"), Tick()) == []  # holder part-1 silent 2 s
    assert d.at(T0 + 3.5, hb(P0), hb(P1, sender="part-1-retry"), Tick()) == abort(
        t1, "participant of events-1 stopped sending heartbeats", "participant-dead"
    )
    actions = d.at(T0 + 3.6, StageCreated(txn_id(2)))
    assert actions == [start(2, START_1, holders={P1: "part-1-retry"}), RecordStarted(d.txn(2)), create(3)]


def test_a_participant_replaced_after_its_write_status_does_not_abort() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P1, 0, 5, 5), hb(P1, sender="part-1-retry")) == []
    assert d.at(T0 + 1.2, ws("e3_t1", P0, 40, 50, 10)) == [CountStage(t1.id, t1.stage_table)]


# ---- WRITE-STATUS that abort ----------------------------------------------------------


def test_a_write_status_with_errors_aborts() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    bad = ws("e3_t1", P1, 0, 5, 3, errors=("Code: 241. Memory limit exceeded", "gave up after 5 tries"))
    assert d.at(T0 + 1.1, bad) == abort(
        t1, "events-1 failed: Code: 241. Memory limit exceeded; gave up after 5 tries", "participant-error"
    )


def test_a_write_status_starting_elsewhere_than_start_aborts() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 41, 50, 9)) == abort(
        t1, "events-0 staged from 41, START said 40", "offset-mismatch"
    )


def test_a_write_status_ending_before_its_start_aborts() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, ws("e3_t1", P0, 40, 39, 0)) == abort(
        t1, "events-0 reported end 39 before start 40", "offset-mismatch"
    )


# ---- step 5 ---------------------------------------------------------------------------


def test_a_row_count_mismatch_aborts() -> None:
    d = Driver()
    verifying_1(d)
    t1 = d.txn(1)
    why = "row-count mismatch: stage table holds 16, participants reported 15"
    assert d.at(T0 + 1.2, Counted(t1.id, 16)) == abort(t1, why, "row-count-mismatch")
    assert d.state.txns == [] and d.state.spare is not None and d.state.spare.txn == txn_id(2)  # the spare stays


# ---- WRITE-STATUS that change nothing -------------------------------------------------


@pytest.mark.parametrize(
    "stray",
    [
        ws("e3_t1", P0, 40, 50, 10, epoch=EPOCH - 1),  # a stale epoch
        ws("e3_t1", P0, 40, 50, 10, epoch=EPOCH + 1),  # not ours either
        ws("e3_t9", P0, 40, 50, 10),  # another txn
        ws("e2_t1", P0, 40, 50, 10),  # another leader's txn
    ],
    ids=["stale-epoch", "newer-epoch", "other-txn", "other-leaders-txn"],
)
def test_a_write_status_not_for_the_current_txn_is_ignored(stray) -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    assert d.at(T0 + 1.1, stray) == []
    assert (t1.statuses, d.state.ignored) == ({}, 1)
    assert d.at(T0 + 1.2, ws("e3_t1", P1, 0, 5, 5)) == []  # P0 still owes its WRITE-STATUS


def test_a_duplicate_write_status_changes_nothing() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.ended(1, T0 + 1)
    first = ws("e3_t1", P0, 40, 50, 10)
    assert d.at(T0 + 1.1, first, first, ws("e3_t1", P0, 40, 52, 12)) == []  # the first report stands
    assert (t1.missing, t1.statuses[P0]) == ([P1], first.message)
    assert d.at(T0 + 1.2, ws("e3_t1", P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 1.3, first) == []  # after the set is complete too
    assert t1.rows == 15


def test_messages_of_another_pipeline_are_ignored() -> None:
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 0.5, hb(P1, sender="intruder", pipeline="payments")) == []
    assert t1.phase is Phase.COLLECTING and d.state.ignored == 1


# ---- step 6 and stepping down ---------------------------------------------------------


@pytest.mark.parametrize(
    "won, reason",
    [
        (False, "lost commit slot 8 of e3_t1 to another leader"),
        (None, "commit outcome of e3_t1 unknown (Code: 209. Timeout); re-reading the ledger"),
    ],
    ids=["lost", "unknown"],
)
def test_a_commit_slot_not_won_steps_down_and_the_machine_goes_inert(won, reason) -> None:
    d = Driver()
    verifying_1(d)
    t1 = d.txn(1)
    assert d.at(T0 + 1.2, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.3, CommitResult(t1.id, won=won, error="Code: 209. Timeout")) == [StepDown(reason)]
    assert d.state.stepped_down
    inert = [
        CommitResult(t1.id, won=True),
        PublishResult(t1.id, ok=True),
        StageCreated("e3_t2"),
        Tick(),
        *beats(P0, P1),
        Shutdown(),
    ]
    assert d.at(T0 + 10, *inert) == []


def coordinator_messages(epoch: int, sender: str) -> list:
    env = {"pipeline": PIPE, "epoch": epoch, "txn": "e9_t1", "sender": sender}
    return [
        LeaderHeartbeat(**env),
        StartCommit(**env, stage_table="t", offsets=()),
        EndCommit(**env),
        AckCommit(**env, offsets=()),
        Abort(**env, reason="x"),
    ]


@pytest.mark.parametrize("message", coordinator_messages(EPOCH + 1, "coord-b"), ids=lambda m: type(m).__name__)
def test_a_coordinator_of_a_newer_epoch_makes_the_leader_step_down(message) -> None:
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.5, Received(message)) == [StepDown("a coordinator of a newer epoch (4 > 3) is sending")]
    assert d.at(T0 + 2, *beats(P0, P1), Tick()) == []


def test_its_own_echo_and_older_coordinators_are_ignored() -> None:
    d = Driver()
    d.started(T0)
    echoes = coordinator_messages(EPOCH, ME) + coordinator_messages(EPOCH - 1, "coord-old")
    assert d.at(T0 + 0.5, *(Received(m) for m in echoes)) == []
    assert not d.state.stepped_down


def test_shutdown_while_committing_waits_for_the_commit_and_publish() -> None:
    d = Driver()
    verifying_1(d)
    t1 = d.txn(1)
    assert d.at(T0 + 1.2, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.3, Shutdown()) == [drop(2)]  # nothing open to abort; the spare is dropped
    assert d.at(T0 + 1.4, CommitResult(t1.id, won=True)) == [ack(1, {P0: 50, P1: 5}, HEAD_SEQ + 1), Publish(t1)]
    assert d.at(T0 + 1.5, PublishResult(t1.id, ok=False, error="Code: 999. Keeper down"), Tick()) == []
    assert d.at(T0 + 3.5, Tick()) == [Publish(t1)]
    assert d.at(T0 + 3.6, PublishResult(t1.id, ok=True)) == [Stopped()]


def test_a_leader_stalled_while_creating_the_stage_table_still_names_every_holder() -> None:
    """The stage DDL took longer than the heartbeat timeout (a slow ClickHouse): the heartbeats
    waiting in the control topic are not read yet, but the holders are still the live copies."""
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL), *beats(P0, P1)) == [create(1)]
    # Seen from the stalled leader's clock nobody is live yet: START waits for the backlog ...
    assert d.at(T0 + 5, StageCreated(txn_id(1))) == []
    # ... and goes out, naming every holder, as soon as the backlog is read; nobody is dead.
    actions = d.at(T0 + 5.1, hb(P0), hb(P1), Tick())
    assert actions == [start(1, START_1), RecordStarted(d.txn(1)), create(2)]
    assert d.at(T0 + 5.2, Tick()) == []
