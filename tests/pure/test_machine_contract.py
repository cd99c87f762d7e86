"""What both state machines promise beyond their steps: dispatch by event type, invariants, abort kinds.

Every event type has exactly one handler (a table per machine, checked against the ``Event``
union here); anything else is a ``TypeError`` naming it. An outcome the runner reports for a txn
that is not waiting for it, and a state that breaks an invariant (``coordinator_invariants.check``), raise
``InvalidTransition`` saying what was expected, what was found, and for which txn.
"""

from __future__ import annotations

import typing

import pytest

from protocol.coordinator import events as coordinator_events, invariants as coordinator_invariants
from protocol.coordinator.events import ABORT_KINDS, AbortKind, CommitResult, Counted, PublishResult
from protocol.coordinator.state import CoordinatorState
from protocol.errors import InvalidTransition
from protocol.messages import Abort, AckCommit, EndCommit, StartCommit
from protocol.participant import events as participant_events, invariants as participant_invariants
from protocol.participant.state import ParticipantState
from tests.pure.coordinator_driver import T0, Driver
from tests.pure.test_participant_state import TP0, machine, polled, start


@pytest.mark.parametrize(
    ("machine_type", "events"),
    [
        (CoordinatorState, coordinator_events.Event),
        (ParticipantState, participant_events.Event),
    ],
)
def test_every_event_type_has_exactly_one_handler(machine_type: type, events: object) -> None:
    assert set(machine_type._HANDLERS) == set(typing.get_args(events))


def test_the_participant_acts_on_start_end_ack_and_abort_only() -> None:
    assert set(ParticipantState._MESSAGE_HANDLERS) == {StartCommit, EndCommit, AckCommit, Abort}


def test_an_event_of_the_other_machine_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="CoordinatorState has no handler for Polled"):
        Driver().state.handle(participant_events.Polled([]), T0)
    with pytest.raises(TypeError, match="ParticipantState has no handler for Ready"):
        machine().handle(coordinator_events.Ready(0, {}, {}), 0)


def test_an_outcome_for_a_txn_in_another_phase_is_an_invalid_transition_and_for_a_gone_txn_moot() -> None:
    d = Driver()
    t1 = d.started(T0)
    with pytest.raises(InvalidTransition, match="Counted for e3_t1: expected the txn verifying, found collecting"):
        d.at(T0 + 0.1, Counted(t1.id, 0))
    assert d.at(T0 + 0.1, CommitResult("e3_t9", won=True)) == []  # a txn aborted while the runner worked
    with pytest.raises(InvalidTransition, match="PublishResult for e3_t1: expected the txn publishing"):
        d.at(T0 + 0.1, PublishResult(t1.id, ok=True))


def test_coordinator_validate_tells_what_was_expected_found_and_the_txn() -> None:
    d = Driver()
    t1 = d.started(T0)
    coordinator_invariants.check(d.state)
    t1.commit_seq = 8  # a commit slot before its WRITE-STATUS set is even complete
    with pytest.raises(InvalidTransition, match="txn e3_t1: expected no commit slot while collecting, found 8"):
        coordinator_invariants.check(d.state)


def test_participant_validate_tells_what_was_expected_found_and_the_txn() -> None:
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    participant_invariants.check(m)
    m.parts[("src", 0)].position = 99
    with pytest.raises(
        InvalidTransition, match="txn e1_t1, src-0: expected the partition positioned at the next offset 11, found 99"
    ):
        participant_invariants.check(m)


def test_abort_kinds_are_the_strings_written_to_metrics_and_logs() -> None:
    assert ABORT_KINDS == (
        "write-status-timeout",
        "participant-dead",
        "participant-error",
        "offset-mismatch",
        "count-failed",
        "row-count-mismatch",
        "cascade",
        "shutdown",
        "target-altered",
        "step-down",
        "take-over",
        "log-changed",
    )
    assert all(type(kind) is str for kind in ABORT_KINDS)
    kind = AbortKind.PARTICIPANT_DEAD
    assert kind == "participant-dead" and str(kind) == f"{kind}" == f"{kind}" == "participant-dead"
