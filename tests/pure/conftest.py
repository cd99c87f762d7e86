"""Every pure test that feeds a state machine checks its invariants after each event.

The fixture wraps ``handle`` of both machines for the test (the coordinator driver, the
participant tests' ``machine()`` and any machine a test builds itself): after every event,
``validate()`` raises ``InvalidTransition`` if the state breaks an invariant its docstring promises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from protocol.coordinator_state import CoordinatorState
from protocol.participant_state import ParticipantState


@pytest.fixture(autouse=True)
def validate_after_every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    for machine in (CoordinatorState, ParticipantState):

        def checked(self: Any, event: Any, now: float, _handle: Callable[..., list] = machine.handle) -> list:
            actions = _handle(self, event, now)
            self.validate()
            return actions

        monkeypatch.setattr(machine, "handle", checked)
