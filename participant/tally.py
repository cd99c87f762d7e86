"""What one participant copy did since it started, kept for its heartbeats (``ParticipantFigures``).

The runner's loop adds the records it polls, its insert workers the chunks they staged, and the
stager each insert (its time, retries and back-off included) and each retry of a ClickHouse call.
One ``Tally`` lives as long as ``TaskRunner.run``: a loop started again after an outage goes on
counting, so the figures only grow while the copy's ``sender`` stays the same.
"""

from __future__ import annotations

import threading

from protocol.messages import ParticipantFigures


class Tally:
    """Cumulative, thread-safe counters; ``figures()`` is what a heartbeat carries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows_read = 0
        self._chunks_staged = 0
        self._inserts = 0
        self._insert_seconds = 0.0
        self._retries = 0

    def read(self, rows: int) -> None:
        with self._lock:
            self._rows_read += rows

    def staged(self) -> None:
        """One chunk inserted into its stage table without an error."""
        with self._lock:
            self._chunks_staged += 1

    def inserted(self, seconds: float) -> None:
        """One deduplicated insert ended (stored or failed) after ``seconds``, retries included."""
        with self._lock:
            self._inserts += 1
            self._insert_seconds += seconds

    def retried(self) -> None:
        with self._lock:
            self._retries += 1

    def figures(self) -> ParticipantFigures:
        with self._lock:
            return ParticipantFigures(
                rows_read=self._rows_read,
                chunks_staged=self._chunks_staged,
                inserts=self._inserts,
                insert_seconds=round(self._insert_seconds, 6),
                retries=self._retries,
            )
