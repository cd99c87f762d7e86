"""Helpers for every integration test: unique names, waiting on a condition, topics that exist."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def unique_name(prefix: str) -> str:
    """``<prefix>_<10 hex digits>``: unique per call, valid as a Kafka topic, ClickHouse table or
    database, and pipeline name (when ``prefix`` is)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Fails the test with ``timed out after N s waiting for <what>`` (with the last value seen) when
    ``timeout_s`` passes first. Exceptions raised by ``predicate`` propagate at once, except those
    listed in ``ignore``, which count as "not yet" and are shown in the failure message.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    last_error: BaseException | None = None
    while True:
        try:
            last = predicate()
            last_error = None
        except ignore as exc:
            last, last_error = None, exc
        if last:
            return last  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            detail = f"last error: {last_error!r}" if last_error is not None else f"last value: {last!r}"
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} ({detail})")
        time.sleep(interval_s)


def create_topic(admin, name: str, partitions: int, timeout_s: float = 30.0) -> str:  # noqa: ANN001 - AdminClient
    """Create a topic and return once its metadata lists every partition. Returns ``name``."""
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout_s).values():
        future.result(timeout_s)

    def described() -> bool:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        return topic is not None and topic.error is None and len(topic.partitions) == partitions

    wait_until(described, timeout_s, f"topic {name} to list {partitions} partitions")
    return name
