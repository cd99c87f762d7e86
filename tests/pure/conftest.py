"""Every pure test that feeds a state machine checks its invariants after each event.

The fixture wraps ``handle`` of both machines for the test (the coordinator driver, the
participant tests' ``machine()`` and any machine a test builds itself): after every event,
``check`` of ``protocol.coordinator.invariants`` or ``protocol.participant.invariants`` raises
``InvalidTransition`` if the state breaks an invariant its docstring promises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol.coordinator import invariants as coordinator_invariants
from protocol.coordinator.state import CoordinatorState
from protocol.participant import invariants as participant_invariants
from protocol.participant.state import ParticipantState


@pytest.fixture(autouse=True)
def validate_after_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    checks: tuple[tuple[type, Callable[[Any], None]], ...] = (
        (CoordinatorState, coordinator_invariants.check),
        (ParticipantState, participant_invariants.check),
    )
    for machine, check in checks:

        def checked(
            self: Any, event: Any, now: float, _handle: Callable[..., list] = machine.handle, _check=check
        ) -> list:
            actions = _handle(self, event, now)
            _check(self)
            return actions

        monkeypatch.setattr(machine, "handle", checked)
