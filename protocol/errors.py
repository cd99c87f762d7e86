"""The root of every chtxn error, and the errors of the shared contract."""

from __future__ import annotations


class ChtxnError(Exception):
    """Root of every error chtxn raises on purpose."""


class ConfigError(ChtxnError):
    """A configuration value is wrong: names the key path, the value and why."""

    def __init__(self, message: str, *, key: str = "", value: object = None) -> None:
        super().__init__(message)
        self.key = key
        self.value = value


class InvalidTransition(ChtxnError):
    """A state machine was asked for a step its current state does not allow, or its state broke an
    invariant its docstring promises (``protocol.coordinator.invariants.check``, ``protocol.participant.invariants.check``): the message says what was expected, what was
    found, and for which txn. A programming error, never a condition of the network."""


class ClickHouseError(ChtxnError):
    """A ClickHouse call failed; ``code`` is ClickHouse's error code (0 when unknown)."""

    def __init__(self, message: str, *, code: int = 0, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class SetupError(ChtxnError):
    """Something the pipeline needs is missing or wrong (topic, table, partition count)."""
