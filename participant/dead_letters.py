"""The dead-letter topic: bad records, untouched, with why and where they came from in headers."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from protocol.chunking import RecordLike
from protocol.errors import ChtxnError

#: Header values are cut to this many bytes (ClickHouse messages can quote whole records).
MAX_ERROR_BYTES = 4096


class DeadLetterError(ChtxnError):
    """Dead letters were not acknowledged by the broker: the chunk must not count as staged."""


class _Delivery:
    """Counts the broker's acknowledgements of one batch (callbacks may run on any thread)."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.failures: list[str] = []
        self.done = threading.Event()
        self._lock = threading.Lock()

    def callback(self, err: Any, _msg: Any) -> None:
        with self._lock:
            if err is not None:
                self.failures.append(str(err))
            self.left -= 1
            if self.left == 0:
                self.done.set()


class DeadLetterSink:
    """Produces bad records to ``topic`` and waits until the broker has them.

    Each dead letter keeps the original key and value; headers ``chtxn.error``,
    ``chtxn.error_code`` (0 when not ClickHouse's), ``chtxn.pipeline``, ``chtxn.txn``,
    ``chtxn.topic``, ``chtxn.partition``, ``chtxn.offset`` say why and where from.
    ``send`` returns only once every record is acknowledged, and raises ``DeadLetterError``
    otherwise, so a bad record is never dropped silently. Thread-safe (the producer is).
    """

    def __init__(self, producer: Any, *, topic: str, pipeline: str, timeout_s: float = 30.0) -> None:
        self.producer, self.topic, self.pipeline, self.timeout_s = producer, topic, pipeline, timeout_s

    def send(self, txn: str, letters: Sequence[tuple[RecordLike, str, int]]) -> None:
        """Produce ``(record, error, error_code)`` letters and wait for the broker's acks."""
        if not letters:
            return
        delivery = _Delivery(len(letters))
        deadline = time.monotonic() + self.timeout_s
        for record, error, code in letters:
            headers = [
                ("chtxn.error", error.encode("utf-8", "replace")[:MAX_ERROR_BYTES]),
                ("chtxn.error_code", str(code).encode()),
                ("chtxn.pipeline", self.pipeline.encode()),
                ("chtxn.txn", txn.encode()),
                ("chtxn.topic", record.topic().encode()),
                ("chtxn.partition", str(record.partition()).encode()),
                ("chtxn.offset", str(record.offset()).encode()),
            ]
            self._produce(record, headers, delivery.callback, deadline)
        while not delivery.done.is_set():
            if time.monotonic() > deadline:
                raise self._timeout(delivery.left, len(letters))
            self.producer.poll(0.05)
        if delivery.failures:
            raise DeadLetterError(
                f"cannot write dead letters to {self.topic}: {delivery.failures[0]} "
                f"({len(delivery.failures)} failed); check that the topic exists (chtxn init creates it)"
            )

    def _timeout(self, left: int, total: int) -> DeadLetterError:
        return DeadLetterError(
            f"{left} of {total} dead letters not acknowledged by the broker within {self.timeout_s:g} s "
            f"(topic {self.topic}); the txn will be aborted and the records read again"
        )

    def _produce(self, record: RecordLike, headers: list[tuple[str, bytes]], on_delivery: Any, deadline: float) -> None:
        while True:
            try:
                self.producer.produce(
                    self.topic, key=record.key(), value=record.value(), headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:  # the local queue is full: let it drain
                if time.monotonic() > deadline:
                    raise self._timeout(1, 1) from None
                self.producer.poll(0.1)
