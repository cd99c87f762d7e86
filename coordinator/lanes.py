"""The leader's lanes: single-thread executors that run its ClickHouse actions beside the control loop.

The commit lane counts and claims (commit steps 5 and 6) in txn order; the stage lane creates the
next txn's stage table (and drops unused ones); the background lane records STARTED, publishes
(commit step 7) and cleans up aborts, in the order they were asked for. Each action's outcome (the
event its handler returns, or the exception it raises) is posted for the loop to collect: the loop
never waits on a lane.
"""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from protocol.coordinator.events import (
    AbortTxn,
    Action,
    Commit,
    CountStage,
    CreateStage,
    DropStage,
    Event,
    Publish,
    RecordStarted,
    Txn,
)

#: Which lane runs each ClickHouse action (module docstring); others run on the loop.
LANES: dict[type, str] = {
    CountStage: "commit",
    Commit: "commit",
    CreateStage: "stage",
    DropStage: "stage",
    RecordStarted: "background",
    Publish: "background",
    AbortTxn: "background",
}


def _snapshot(action: Action) -> Action:
    """``action`` with a copy of its ``Txn``, for a lane: the loop keeps changing the original."""
    txn = getattr(action, "txn", None)
    if not isinstance(txn, Txn):
        return action
    copy = dataclasses.replace(txn, start=dict(txn.start), statuses=dict(txn.statuses), holders=dict(txn.holders))
    # mypy checks the call for every Action type, even those without a txn, which never get here
    return dataclasses.replace(action, txn=copy)  # type: ignore[arg-type]


class Lanes:
    """The lanes of the leader of ``epoch``: ``open``, ``submit`` actions, ``collect`` their
    outcomes on the loop, ``shutdown`` when done. The constructor starts no thread."""

    def __init__(self, epoch: int, clock: Callable[[], float]) -> None:
        self.epoch = epoch
        self.clock = clock
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._outcomes: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self.in_flight: dict[int, float] = {}  # lane actions running or queued: id -> submitted at

    def open(self) -> None:
        self._pools = {
            lane: ThreadPoolExecutor(1, thread_name_prefix=f"chtxn-{lane}-e{self.epoch}")
            for lane in sorted(set(LANES.values()))
        }

    def submit(self, lane: str, action: Action, handler: Callable[[Any], Event | None], step: Any) -> None:
        """Run ``handler(action)`` on ``lane``, timed by ``step`` (a histogram); its outcome is
        posted for ``collect``."""
        action = _snapshot(action)  # the loop goes on changing the machine's Txn
        key = id(action)
        self.in_flight[key] = self.clock()

        def run() -> None:
            started = self.clock()
            try:
                outcome = handler(action)
                if outcome is not None:
                    self._outcomes.put(outcome)
            except BaseException as exc:  # a bug or an armed failpoint: raised again on the loop
                self._outcomes.put(exc)
            finally:
                step.observe(self.clock() - started)
                self.in_flight.pop(key, None)

        self._pools[lane].submit(run)

    def collect(self, feed: Callable[[Event], str | None]) -> str | None:
        """Feed the outcomes the lanes have posted; an exception a lane raised is raised here."""
        outcome = None
        while outcome is None:
            try:
                event = self._outcomes.get_nowait()
            except queue.Empty:
                return None
            if isinstance(event, BaseException):
                raise event
            outcome = feed(event)
        return outcome

    def oldest(self, default: float) -> float:
        """When the oldest action still running or queued was submitted; ``default`` when none is."""
        return min(list(self.in_flight.values()), default=default)

    def shutdown(self, *, cancel: bool) -> None:
        """Wait for the lanes to finish; with ``cancel``, actions not begun never begin."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=cancel)
