"""What a replica answers on ``/ready``: whether it can do its part now, in one line. No I/O.

Ready (HTTP 200) is one of:

- the leader, once its take-over is done (the ledger head read, stage tables left by an earlier
  leader settled) and until it steps down or is stopped;
- a standby whose last start reached both ClickHouse (the ledger table answered) and the broker
  (the control topic was checked and opened), whose latest ClickHouse ping answered, and which has
  failed nothing since: it can take over.

Not ready (HTTP 503): starting, taking over, restarting after an error (the error is named),
a standby whose ClickHouse ping fails, stopping. The service tells this object what it does;
the metrics server's thread reads ``answer()`` (each change is one attribute assignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Answer:
    ready: bool
    line: str  # one line, the body of ``/ready``

    @property
    def status(self) -> int:
        return 200 if self.ready else 503


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line of at most ``limit`` characters (errors may span many)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class LeaderState(Protocol):
    """What readiness reads of the leader's ``CoordinatorState``."""

    ready: bool  # take-over done: the ledger head is read and fed in (``Ready``)
    stepped_down: bool
    stopping: bool


class Readiness:
    """The replica's role as the service last told it."""

    def __init__(self) -> None:
        self._answer = Answer(False, "not ready: starting (connecting to ClickHouse and the broker)")
        self._leader: LeaderState | None = None
        self._epoch = 0
        self._clickhouse_error = ""

    def standby(self) -> None:
        """Reached ClickHouse and opened the control topic: watching the leader's lease."""
        self._leader, self._clickhouse_error = None, ""
        self._answer = Answer(True, "ready: standby")

    def clickhouse(self, error: str) -> None:
        """The latest ClickHouse check of a standby: "" when it answered, else what went wrong."""
        self._clickhouse_error = one_line(error)

    def leading(self, epoch: int, state: LeaderState) -> None:
        """Won ``epoch``; ``state`` is the leader's, read on every ``answer()``."""
        self._epoch, self._leader = epoch, state

    def failed(self, error: str) -> None:
        """Backing off after ``error``, before starting again."""
        self._leader = None
        self._answer = Answer(False, f"not ready: restarting after an error: {one_line(error)}")

    def stopping(self) -> None:
        self._leader = None
        self._answer = Answer(False, "not ready: stopping")

    def answer(self) -> Answer:
        leader, answer, epoch = self._leader, self._answer, self._epoch
        if leader is not None:
            if leader.stopping:
                return Answer(False, f"not ready: stopping (the leader of epoch {epoch})")
            if leader.stepped_down:
                return Answer(False, f"not ready: stepping down from epoch {epoch}")
            if not leader.ready:
                return Answer(False, f"not ready: taking over as the leader of epoch {epoch}")
            return Answer(True, f"ready: leader of epoch {epoch}")
        if answer.ready and self._clickhouse_error:
            return Answer(False, f"not ready: standby cannot reach ClickHouse: {self._clickhouse_error}")
        return answer
