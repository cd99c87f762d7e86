"""Offset resets (``chtxn reset``) as the pure parts see them: the reset's ledger row, the chain's
audit accepting its jump and nothing else, and the leader handing over when a ``Reset`` message
names a slot past its head (events in, the exact actions out)."""

from __future__ import annotations

from protocol import naming
from protocol.coordinator.events import Ready, Received, StepDown
from protocol.ledger.resets import describe, is_reset, reset_row
from protocol.ledger.rows import LedgerEvent
from protocol.ledger.view import audit, summarize
from protocol.messages import Reset, TopicPartition
from tests.pure.coordinator_driver import HEAD, HEAD_SEQ, INITIAL, P0, P1, PIPE, T0, Driver, beats, create
from tests.pure.test_ledger import commit, rng

SRC0 = TopicPartition(topic="src", partition=0)


def a_reset(seq: int, start: int, end: int) -> object:
    return reset_row(
        pipeline="orders",
        commit_seq=seq,
        epoch=1,
        who="bob",
        moves={SRC0: (start, end)},
        how="--to-offset 40",
        reason="replay",
        now=1.0,
    )


def test_a_reset_row_is_a_commit_of_no_rows_named_for_its_slot() -> None:
    row = a_reset(3, 100, 40)
    assert is_reset(row) and row.event is LedgerEvent.COMMITTED and row.stage_table == ""
    assert row.txn == naming.reset_txn(3) == "reset_s3" and not is_reset(commit(3, rng(0, 0, 10)))
    assert [(r.start, r.end, r.rows) for r in row.ranges] == [(100, 40, 0)]
    assert describe(row) == "offset reset --to-offset 40: replay by bob in commit slot 3: src/0 100 -> 40"
    summary = summarize([row])  # what txn list and txn show print of it
    assert (summary.state, summary.reason, summary.coordinator) == ("COMMITTED", row.reason, "bob")


def test_the_audit_accepts_a_rewind_and_a_skip_by_a_reset_and_nothing_else() -> None:
    rewound = [commit(1, rng(0, 0, 100)), commit(2, rng(0, 100, 150)), a_reset(3, 150, 40), commit(4, rng(0, 40, 90))]
    assert audit(rewound) == []
    skipped = [commit(1, rng(0, 0, 100)), a_reset(2, 100, 400), commit(3, rng(0, 400, 420))]
    assert audit(skipped) == []
    # A commit after the reset must start where the reset put the partition.
    [problem] = audit([commit(1, rng(0, 0, 100)), a_reset(2, 100, 40), commit(3, rng(0, 100, 120))])
    assert "offsets 40..99 were never committed, between commit 2 (txn reset_s2)" in problem
    # A txn's commit going backward is still an anomaly.
    [backward] = audit([commit(1, rng(0, 0, 100)), commit(2, rng(0, 100, 40, rows=0))])
    assert "goes backward" in backward


def reset_message(slot: int, pipeline: str = PIPE) -> Received:
    return Received(
        Reset(pipeline=pipeline, epoch=0, txn=naming.reset_txn(slot), sender="bob", commit_seq=slot, who="bob")
    )


def test_a_leader_hands_over_when_a_reset_took_a_slot_past_its_head() -> None:
    d = Driver()
    assert d.at(T0, Ready(HEAD_SEQ, HEAD, INITIAL, paused=True), *beats(P0, P1)) == [create(1)]
    assert d.at(T0 + 0.1, reset_message(HEAD_SEQ)) == []  # a reset the head already holds: read at take-over
    assert d.at(T0 + 0.2, reset_message(HEAD_SEQ + 1, pipeline="other")) == []
    [step_down] = d.at(T0 + 0.3, reset_message(HEAD_SEQ + 1))
    assert isinstance(step_down, StepDown) and step_down.hand_over
    assert f"offsets were reset by bob in commit slot {HEAD_SEQ + 1}" in step_down.reason
