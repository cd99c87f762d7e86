"""Riding out an outage of ClickHouse or the Kafka broker: retry with back-off, one log line per
attempt, and give up with ``OutageError`` naming the cause once the service has been unreachable
for ``participant.outage_timeout_s``.

``Outage`` keeps the time of one service's failures for a caller that checks it now and then (the
driver's watch while its tasks run); ``ride_out`` retries one call until it succeeds (start-up).
What counts as an outage comes from exception types and flags, never from message text.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError, KafkaException

from clients.kafka import BrokerUnreachable
from participant.job_errors import OutageError, one_line
from protocol.errors import ClickHouseError

log = logging.getLogger("chtxn.participant.outage")

T = TypeVar("T")

BACKOFF_INITIAL_S, BACKOFF_MAX_S = 1.0, 30.0
#: librdkafka errors that say the broker could not be reached, not that the request was wrong.
_KAFKA_UNREACHABLE = frozenset(
    {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError._MSG_TIMED_OUT}
)


def is_outage(error: BaseException) -> bool:
    """True when ``error`` says a service could not be reached (so a later try may succeed)."""
    if isinstance(error, BrokerUnreachable):
        return True
    if isinstance(error, ClickHouseError):
        return error.retryable
    if isinstance(error, KafkaException):
        kafka_error = error.args[0] if error.args else None
        return isinstance(kafka_error, KafkaError) and (
            kafka_error.code() in _KAFKA_UNREACHABLE or kafka_error.retriable()
        )
    return isinstance(error, (ConnectionError, TimeoutError))


def service_of(error: BaseException) -> str:
    return "ClickHouse" if isinstance(error, ClickHouseError) else "Kafka"


class Outage:
    """The failures of one service since it last answered.

    ``failed(error, now)`` logs one line for the attempt and raises ``OutageError`` once the first
    failure is ``timeout_s`` old; ``ok()`` ends the outage.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since: float | None = None
        self.attempts = 0
        self.service = ""

    def failed(
        self, error: BaseException, now: float, *, began: float | None = None, retry_in_s: float | None = None
    ) -> float:
        """Seconds the service has been unreachable, since ``began`` (when the first failed attempt
        started; default ``now``); raises ``OutageError`` past the timeout."""
        if self.since is None:
            self.since = now if began is None else began
        self.attempts += 1
        self.service = service_of(error)
        down_s = now - self.since
        cause = one_line(str(error))
        if down_s >= self.timeout_s:
            raise OutageError(
                f"{cause}; gave up after {down_s:.0f} s and {self.attempts} attempts "
                f"(participant.outage_timeout_s = {self.timeout_s:g})",
                service=self.service,
                seconds=down_s,
            )
        then = f"retrying in {retry_in_s:.0f} s" if retry_in_s is not None else "checking again"
        log.warning(
            "%s unreachable for %.0f s (attempt %d): %s; %s, giving up after %g s",
            self.service,
            down_s,
            self.attempts,
            cause,
            then,
            self.timeout_s,
            extra={"attempt": self.attempts, "down_s": round(down_s, 1), "outage_timeout_s": self.timeout_s},
        )
        return down_s

    def ok(self) -> None:
        if self.since is not None:
            log.warning("%s reachable again after %d failed attempts", self.service, self.attempts)
        self.since, self.attempts = None, 0


def ride_out(
    call: Callable[[], T],
    *,
    timeout_s: float,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    wait: Callable[[float], object] | None = None,
) -> T | None:
    """``call()`` until it returns, waiting out outages with exponential back-off (one log line per
    failed attempt). Raises ``OutageError`` once failures have lasted ``timeout_s``, and any error
    that is not an outage at once. Returns None when ``stop`` is set while waiting. ``wait(s)``
    sleeps (default: ``stop.wait``)."""
    stop = stop or threading.Event()
    wait = wait or stop.wait
    outage = Outage(timeout_s)
    backoff = BACKOFF_INITIAL_S
    while not stop.is_set():
        began = clock()
        try:
            result = call()
        except Exception as exc:
            if not is_outage(exc):
                raise
            now = clock()
            left = timeout_s - (now - (began if outage.since is None else outage.since))
            wait_s = max(0.0, min(backoff, left))
            outage.failed(exc, now, began=began, retry_in_s=wait_s)
            wait(wait_s)
            backoff = min(backoff * 2, BACKOFF_MAX_S)
            continue
        outage.ok()
        return result
    return None
