"""``chtxn pause`` / ``resume`` as the leader sees them: a ``Pause`` message on the control topic, or
the ledger's latest PAUSED / RESUMED row at take-over (``Ready.paused``). Paused, the open txn ends
at once, commits as usual, and no txn starts until resumed. Events in, the exact actions out; the
invariants are checked after every event (``tests/pure/conftest.py``).
"""

from __future__ import annotations

from typing import Any

from protocol.coordinator.events import (
    Commit,
    CommitResult,
    Counted,
    CountStage,
    Publish,
    Ready,
    Received,
    RecordStarted,
    StageCreated,
    StepDown,
    Tick,
)
from protocol.messages import Pause
from tests.pure.coordinator_driver import (
    EPOCH,
    HEAD,
    HEAD_SEQ,
    INITIAL,
    LEARNT,
    P0,
    P1,
    PIPE,
    START_1,
    T0,
    Driver,
    ack,
    beats,
    create,
    end,
    participant,
    start,
    ws,
)

END_1 = {P0: 50, P1: 5}


def pause(paused: bool = True, pipeline: str = PIPE) -> Received:
    return Received(Pause(pipeline=pipeline, epoch=0, txn="", sender="chtxn-cli", paused=paused, who="alice"))


def test_a_pause_ends_the_open_txn_at_once_and_starts_none_until_resumed() -> None:
    d = Driver()
    t1 = d.started(T0)
    d.spare_ready(2, T0 + 0.05)
    assert d.at(T0 + 0.1, pause()) == [end(1)]  # not at the interval: at once
    assert d.at(T0 + 0.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 0.3, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    assert d.at(T0 + 0.4, CommitResult(t1.id, won=True)) == [ack(1, END_1, HEAD_SEQ + 1), Publish(t1)]
    # Paused: the participants heartbeat, the spare stage table is ready, time passes; nothing starts.
    assert d.at(T0 + 0.5, *beats(P0, P1)) == []
    assert d.at(T0 + 5, *beats(P0, P1), Tick()) == []
    assert d.state.open_txn is None and d.state.paused
    # Resumed: the next START, from where txn 1 ended.
    actions = d.at(T0 + 6, pause(False), *beats(P0, P1))
    holders = {tp: participant(tp) for tp in (P0, P1)}
    assert actions == [start(2, END_1, holders, chunk_rows=LEARNT), RecordStarted(d.txn(2)), create(3)]


def test_a_leader_that_takes_over_a_paused_pipeline_starts_nothing() -> None:
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL, paused=True), *beats(P0, P1)) == [create(1)]
    assert d.at(T0 + 0.1, *beats(P0, P1), Tick()) == []
    assert d.at(T0 + 0.2, StageCreated(d.state.spare.txn), *beats(P0, P1)) == []
    assert d.state.txns == [] and d.state.paused
    actions = d.at(T0 + 0.3, pause(False))
    assert actions == [start(1, START_1), RecordStarted(d.txn(1)), create(2)]


def test_a_pause_of_another_pipeline_changes_nothing() -> None:
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.1, pause(pipeline="other")) == []
    assert not d.state.paused and d.state.open_txn is not None and d.state.epoch == EPOCH


def test_a_commit_that_claimed_past_a_pauses_slot_moves_the_head_to_the_slot_it_won() -> None:
    """The pause's marker took slot head + 1; the leader claimed head + 2 instead (a marker moves no
    offset). The ACK names the slot won, and the next txn commits after it."""
    d, t1 = _paused_and_committing()
    won = CommitResult(t1.id, won=True, commit_seq=HEAD_SEQ + 2)
    assert d.at(T0 + 0.4, won) == [ack(1, END_1, HEAD_SEQ + 2), Publish(t1)]
    assert d.state.head_seq == HEAD_SEQ + 2 and t1.commit_seq == HEAD_SEQ + 2


def test_a_commit_that_lost_the_slot_past_a_pauses_names_the_slot_it_lost() -> None:
    d, t1 = _paused_and_committing()
    lost = CommitResult(t1.id, won=False, commit_seq=HEAD_SEQ + 2)
    assert d.at(T0 + 0.4, lost) == [StepDown(f"lost commit slot {HEAD_SEQ + 2} of {t1.id} to another leader")]


def _paused_and_committing() -> tuple[Driver, Any]:
    """Txn 1 ended by a pause, counted, its commit of slot head + 1 asked for."""
    d = Driver()
    t1 = d.started(T0)
    d.spare_ready(2, T0 + 0.05)
    assert d.at(T0 + 0.1, pause()) == [end(1)]
    assert d.at(T0 + 0.2, ws(t1.id, P0, 40, 50, 10), ws(t1.id, P1, 0, 5, 5)) == [CountStage(t1.id, t1.stage_table)]
    assert d.at(T0 + 0.3, Counted(t1.id, 15)) == [Commit(t1, HEAD_SEQ + 1)]
    return d, t1
