"""Continuous txns in the coordinator state machine: the END of txn k carrying the START of k+1.

The END of k is ``EndCommit(next=StartCommit(k+1))`` when every holder of k heartbeats
``continues``, the holders stay, every partition is live and the spare stage table is ready;
k+1 starts from ``CONTINUE`` until k's WRITE-STATUS gives its start. A txn ends only once every
older txn is committed; if k aborts, k+1 aborts too and the next START is explicit, from the
ledger head. Events in, the exact actions out.
"""

from __future__ import annotations

from dataclasses import replace

from protocol.coordinator.events import (
    Commit,
    CommitResult,
    Counted,
    CountStage,
    PartitionsChanged,
    Phase,
    Publish,
    PublishResult,
    RecordStarted,
    Shutdown,
    StageCreated,
    Stopped,
    Tick,
)
from protocol.messages import CONTINUE
from tests.pure.coordinator_driver import (
    HEAD_SEQ,
    LEARNT,
    P0,
    P1,
    P2,
    START_1,
    T0,
    TIMING,
    Driver,
    abort,
    ack,
    beats,
    chained_end,
    continuing,
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


def chained_2(d: Driver) -> None:
    """Txn 1 started with both holders heartbeating ``continues`` and the spare of txn 2 ready;
    at ``T0 + 1`` its END carries the START of txn 2, and the spare of txn 3 is asked for."""
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    actions = d.at(T0 + 1, *beats(P0, P1, continues=True))
    t2 = d.txn(2)
    assert actions == [chained_end(1, continuing(P0, P1)), RecordStarted(t2), create(3)]
    assert (t1.phase, t1.ended_at) == (Phase.ENDING, T0 + 1)
    assert (t2.phase, t2.chained, t2.after, t2.started_at) == (Phase.COLLECTING, True, t1.id, T0 + 1)
    assert (t2.start, t2.holders) == ({P0: CONTINUE, P1: CONTINUE}, {P0: "part-0", P1: "part-1"})


# ---- chaining -------------------------------------------------------------------------


def test_end_carries_the_next_start_when_every_holder_continues() -> None:
    d = Driver()
    chained_2(d)
    assert d.at(T0 + 1.1, *beats(P0, P1, continues=True), Tick()) == []  # one END, one START
    assert d.state.spare is not None and (d.state.spare.txn, d.state.spare.ready) == (txn_id(3), False)


def test_the_chained_txn_starts_from_the_ends_reported_and_commits_only_after_the_previous() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.1, ws(t1.id, P0, 40, 50, 10)) == []
    assert t2.start == {P0: 50, P1: CONTINUE}
    assert d.at(T0 + 1.2, ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert t2.start == END_1
    d.spare_ready(3, T0 + 1.3)
    # Txn 2's interval is up at T0 + 2, but txn 1 is not committed yet: txn 2 goes on collecting.
    assert d.at(T0 + 2.0, *beats(P0, P1, txn=t2.id, continues=True), Tick()) == []
    assert d.at(T0 + 2.1, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 2.15, Tick()) == [] and t2.phase is Phase.COLLECTING
    actions = d.at(T0 + 2.2, CommitResult(t1.id, won=True))
    t3 = d.txn(3)
    assert actions == [
        ack(1, END_1, HEAD_SEQ + 1),
        Publish(t1),
        chained_end(2, continuing(P0, P1), chunk_rows=LEARNT),
        RecordStarted(t3),
        create(4),
    ]
    assert d.at(T0 + 2.3, ws(t2.id, P0, 50, 58, 8), ws(t2.id, P1, 5, 9, 4)) == [CountStage(t2.id, t2.stage_table)]
    assert (t3.start, t3.after) == (END_2, t2.id)
    assert d.at(T0 + 2.4, Counted(t2.id, 12)) == [Commit(t2, HEAD_SEQ + 2)]  # its starts are the new ledger head
    assert d.at(T0 + 2.5, CommitResult(t2.id, won=True)) == [ack(2, END_2, HEAD_SEQ + 2)]  # publish in commit order
    assert d.at(T0 + 2.6, PublishResult(t1.id, ok=True)) == [Publish(t2)]


def test_a_new_partition_gets_an_explicit_offset_in_the_chained_start() -> None:
    d = Driver()
    d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    assert d.at(T0 + 0.6, PartitionsChanged((P0, P1, P2), {P2: 7}), hb(P2, continues=True)) == []
    actions = d.at(T0 + 1, *beats(P0, P1, continues=True))
    assert actions == [chained_end(1, {**continuing(P0, P1), P2: 7}), RecordStarted(d.txn(2)), create(3)]


# ---- no chaining ----------------------------------------------------------------------


def test_no_chaining_when_a_holder_does_not_heartbeat_continues() -> None:
    """An older participant ignores ``EndCommit.next``: END goes alone and the next START waits
    for the WRITE-STATUS set, with explicit offsets."""
    d = Driver()
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    assert d.at(T0 + 0.9, hb(P1)) == []  # P1's participant does not (or no longer) continue
    assert d.at(T0 + 1, hb(P0, continues=True)) == [end(1)]
    assert d.state.spare is not None and d.state.spare.ready and t1.phase is Phase.ENDING
    assert d.at(T0 + 1.1, ws(t1.id, P0, 40, 50, 10)) == []
    actions = d.at(T0 + 1.2, ws(t1.id, P1, 0, 5, 5))
    t2 = d.txn(2)
    assert actions == [
        CountStage(t1.id, t1.stage_table),
        start(2, END_1, chunk_rows=LEARNT),
        RecordStarted(t2),
        create(3),
    ]
    assert (t2.chained, t2.after) == (False, t1.id)


def test_no_chaining_when_the_holder_changes() -> None:
    """A new copy cannot continue from where another one cut: END goes alone."""
    d = Driver(replace(TIMING, interval_s=4.0))
    t1 = d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    # P1's holder part-1 falls silent; its new copy part-1b heartbeats (silence is judged on Tick only).
    assert d.at(T0 + 2, hb(P0, continues=True), hb(P1, sender="part-1b", continues=True)) == []
    assert d.at(T0 + 3.5, hb(P0, continues=True)) == []
    assert d.at(T0 + 4, hb(P1, sender="part-1b", continues=True)) == [end(1)]
    assert d.state.txns == [t1] and d.state.spare is not None and d.state.spare.ready  # the spare is kept


def test_no_chaining_when_the_spare_is_not_ready() -> None:
    d = Driver()
    t1 = d.started(T0, continues=True)
    assert d.at(T0 + 1, *beats(P0, P1, continues=True)) == [end(1)]  # txn 2's stage table is still being made
    assert d.at(T0 + 1.1, StageCreated(txn_id(2))) == []  # txn 1 is still ending
    actions = d.at(T0 + 1.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5))
    t2 = d.txn(2)
    assert actions == [
        CountStage(t1.id, t1.stage_table),
        start(2, END_1, chunk_rows=LEARNT),
        RecordStarted(t2),
        create(3),
    ]
    assert t2.chained is False


def test_no_chaining_when_a_partition_is_not_live() -> None:
    d = Driver(replace(TIMING, interval_s=3.5))
    d.started(T0, continues=True)
    d.spare_ready(2, T0 + 0.5)
    assert d.at(T0 + 2, hb(P0, continues=True)) == []
    assert d.at(T0 + 3.5, hb(P0, continues=True)) == [end(1)]  # P1 silent for 3.5 s (not judged yet: no Tick)


# ---- END held back --------------------------------------------------------------------


def test_the_size_trigger_of_the_chained_txn_waits_until_the_previous_is_committed() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    full = [hb(P0, txn=t2.id, buffered=60, continues=True), hb(P1, txn=t2.id, buffered=40, continues=True)]
    assert d.at(T0 + 1.1, *full) == []  # 100 rows staged: the size trigger is reached
    assert d.at(T0 + 1.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 1.3, *full, Tick()) == []
    assert d.at(T0 + 1.4, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.45, *full, Tick()) == []
    # Committed: txn 2 ends at once (the spare of txn 3 is not ready, so END goes alone).
    assert d.at(T0 + 1.5, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1), end(2)]
    assert (t2.phase, t2.ended_at) == (Phase.ENDING, T0 + 1.5)


# ---- aborts ---------------------------------------------------------------------------


def test_an_abort_of_the_ending_txn_cascades_to_the_chained_one_and_restarts_from_the_ledger_head() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.1, ws(t1.id, P0, 40, 50, 10)) == []
    assert d.at(T0 + 1.2, ws(t1.id, P1, 0, 5, 5, errors=("boom",))) == [
        *abort(t1, "events-1 failed: boom", "participant-error"),
        *abort(t2, "cascade: e3_t1 aborted (events-1 failed: boom)", "cascade"),
    ]
    assert d.state.txns == []
    actions = d.at(T0 + 1.3, StageCreated(txn_id(3)))
    t3 = d.txn(3)
    assert actions == [start(3, START_1), RecordStarted(t3), create(4)]  # explicit offsets, from the head
    assert (t3.chained, t3.after) == (False, None)


def test_a_dead_holder_of_the_ending_txn_aborts_both() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.5, ws(t1.id, P0, 40, 50, 10)) == []
    assert d.at(T0 + 4, hb(P0, continues=True), Tick()) == []  # P1's participant silent for 3 s: still alive
    assert d.at(T0 + 4.1, hb(P0, continues=True), Tick()) == [
        *abort(t1, "participant of events-1 stopped sending heartbeats", "participant-dead"),
        *abort(t2, "cascade: e3_t1 aborted (participant of events-1 stopped sending heartbeats)", "cascade"),
    ]


def test_a_write_status_of_the_chained_txn_before_the_previous_ones_aborts_it() -> None:
    """The start of a chained txn's partition is known only from the previous txn's WRITE-STATUS
    (participants send them in txn order): one that comes first cannot be checked."""
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.1, ws(t2.id, P0, 50, 52, 2)) == abort(
        t2, "events-0 staged from 50, START said -1", "offset-mismatch"
    )
    assert d.state.txns == [t1]  # the previous txn goes on
    assert d.at(T0 + 1.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    actions = d.at(T0 + 1.3, StageCreated(txn_id(3)))
    t3 = d.txn(3)
    assert actions == [
        start(3, END_1, chunk_rows=LEARNT),
        RecordStarted(t3),
        create(4),
    ]  # explicit, pipelined after txn 1
    assert (t3.chained, t3.after) == (False, t1.id)


# ---- shutdown -------------------------------------------------------------------------


def test_shutdown_aborts_the_ending_and_the_chained_txn_and_drops_the_spare() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.1, Shutdown()) == [
        *abort(t1, "coordinator shutting down", "shutdown"),
        *abort(t2, "cascade: e3_t1 aborted (coordinator shutting down)", "cascade"),
        drop(3),
        Stopped(),
    ]
    assert d.state.spare is None


def test_shutdown_drops_a_ready_spare_and_the_chained_txn_but_lets_the_previous_commit() -> None:
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    assert d.at(T0 + 1.1, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    d.spare_ready(3, T0 + 1.2)
    assert d.at(T0 + 1.3, Shutdown()) == [*abort(t2, "coordinator shutting down", "shutdown"), drop(3)]
    assert d.at(T0 + 1.4, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 1.5, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    assert d.at(T0 + 1.6, PublishResult(t1.id, ok=True)) == [Stopped()]


# ---- a holder that missed its END ------------------------------------------------------


def test_a_holder_still_reading_an_ended_txn_gets_the_same_end_again() -> None:
    """P1's holder never read END(1): its heartbeats go on naming txn 1 while P0's name txn 2.
    Once one of them comes ``RESEND_END_S`` after the END, the same END goes out again, at most
    once per ``RESEND_END_S``; the txn then completes as usual, with no abort."""
    d = Driver()
    chained_2(d)
    t1, t2 = d.txn(1), d.txn(2)
    again = chained_end(1, continuing(P0, P1))
    assert d.at(T0 + 1.1, ws(t1.id, P0, 40, 50, 10)) == []
    # heartbeats sent before the holder could have read the END: not a sign of anything
    assert d.at(T0 + 1.5, hb(P0, txn=t2.id, continues=True), hb(P1, txn=t1.id, continues=True), Tick()) == []
    assert d.at(T0 + 2.0, hb(P1, txn=t1.id, continues=True), Tick()) == [again]
    assert t1.end_sent_at == T0 + 2.0 and t1.ended_at == T0 + 1  # the timeouts still count from the first END
    assert d.at(T0 + 2.5, hb(P1, txn=t1.id, continues=True), Tick()) == []  # once per RESEND_END_S
    assert d.at(T0 + 3.0, hb(P1, txn=t1.id, continues=True), Tick()) == [again]
    assert d.at(T0 + 3.2, hb(P1, txn=t2.id, continues=True), ws(t1.id, P1, 0, 5, 5)) == [
        CountStage(t1.id, t1.stage_table)
    ]
    assert d.at(T0 + 4.5, Tick()) == []


def test_an_end_that_started_no_txn_is_not_sent_again() -> None:
    """A holder that read an END without a next START still names that txn while it flushes: no
    heartbeat tells it apart from one that missed the END, so the WRITE-STATUS timeout decides."""
    d = Driver()
    t1 = d.started(T0)
    assert d.at(T0 + 1, Tick()) == [end(1)]
    assert d.at(T0 + 2.5, hb(P0, txn=t1.id), hb(P1, txn=t1.id), Tick()) == []
