"""The soak's producers, and where each produced record landed.

``Traffic`` produces a steady stream at a fixed rate from a thread of its own (every record a JSON
row with a unique ``id``, keyed by it and spread over the partitions by ``id``), and bursts of bad
records on demand: malformed JSON, and records that are not exactly one row. It keeps, per
partition, the offsets the broker acknowledged (delivery reports), split into *good* records
(each must be in the target exactly once) and *bad* ones (each must be in the dead-letter topic).

A topic deleted and created again starts a new *generation*: ``new_generation()`` (with the
producers paused) starts a new producer on the new log and keeps, per generation and partition,
which record id each offset holds, for the soak's id oracle (``tests.soak.ids``).

``log_end`` reads a partition's end by consuming to partition EOF: the embedded broker's high
watermark (``get_watermark_offsets``) can lag behind what it has acknowledged.
"""

from __future__ import annotations

import json
import threading
import time
from functools import partial

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition as KafkaTP

#: How often the steady producer wakes up to catch up with its rate.
TICK_S = 0.05


def good_value(i: int) -> bytes:
    return json.dumps({"id": i, "user": f"u{i % 97}", "amount": i * 0.5}).encode()


def malformed_value(i: int) -> bytes:
    return b'{"id": %d, "user": "broken' % i  # as tests.pipelines.Pipeline.produce makes them


def not_one_row_value(shape: str, i: int) -> bytes:
    """A value that is not exactly one row: two rows in one record, or none."""
    if shape == "two-objects":
        return good_value(i) + good_value(i + 1)
    if shape == "two-lines":
        return good_value(i) + b"\n" + good_value(i + 1)
    if shape == "empty":
        return b""
    if shape == "blank":
        return b"  \n "
    raise ValueError(f"unknown record shape {shape!r}")


class Traffic:
    """Producers of one soak. ``start()`` the steady stream, ``stop()`` it (flushed), ``close()``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self._bootstrap = bootstrap
        self._producer = self._new_producer()
        self._lock = threading.Lock()
        self._next_id = 0
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._idle = threading.Event()  # set while the steady loop is not producing
        self.generation = 0
        #: per generation, per partition: offset -> the good record's id, or the bad record's value
        self.placed: list[dict[int, dict[int, int]]] = [{p: {} for p in range(partitions)}]
        self.placed_bad: list[dict[int, dict[int, bytes]]] = [{p: {} for p in range(partitions)}]
        self._thread: threading.Thread | None = None
        self.ends: dict[int, int] = {p: 0 for p in range(partitions)}  # acknowledged end (next offset)
        self.good: dict[int, set[int]] = {p: set() for p in range(partitions)}
        self.bad: dict[int, set[int]] = {p: set() for p in range(partitions)}
        self.failed: list[str] = []  # delivery errors
        self.sent = 0

    # ---- producing ------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._steady, name="soak-producer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the steady stream and wait until every record is acknowledged (or failed)."""
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(30)
        left = self._producer.flush(60)
        if left:
            self.failed.append(f"{left} records still undelivered after 60 s")

    def close(self) -> None:
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(30)

    def pause(self) -> None:
        """Stop producing and wait until everything sent is acknowledged (or failed)."""
        self._idle.clear()
        self._running.clear()
        if self._thread is not None and self._thread.is_alive():
            self._idle.wait(30)
        left = self._producer.flush(60)
        if left:
            self.failed.append(f"{left} records still undelivered after 60 s (pause)")

    def resume(self) -> None:
        self._running.set()

    def new_generation(self) -> None:
        """The topic was deleted and created again (call while paused): a new producer, offsets from 0."""
        self._producer = self._new_producer()
        with self._lock:
            self.generation += 1
            self.placed.append({p: {} for p in range(self.partitions)})
            self.placed_bad.append({p: {} for p in range(self.partitions)})
            self.ends = {p: 0 for p in range(self.partitions)}
            self.good = {p: set() for p in range(self.partitions)}
            self.bad = {p: set() for p in range(self.partitions)}

    def _new_producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "linger.ms": 5,
                "enable.idempotence": True,
                "allow.auto.create.topics": False,  # a topic deleted stays deleted until the soak creates it
            }
        )

    def _ids(self, count: int) -> range:
        with self._lock:
            first = self._next_id
            self._next_id += count
        return range(first, first + count)

    def _send(self, value: bytes, i: int, kind: str) -> None:
        partition = i % self.partitions
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    key=str(i).encode(),
                    partition=partition,
                    on_delivery=partial(self._delivered, kind, i, value, self.generation),
                )
                break
            except BufferError:  # the local queue is full: serve delivery reports, then retry
                self._producer.poll(0.1)
        with self._lock:
            self.sent += 1

    def _delivered(
        self, kind: str, i: int, value: bytes, generation: int, err: KafkaError | None, msg
    ) -> None:  # a Message
        if err is not None:
            self.failed.append(str(err))
            return
        p, o = msg.partition(), msg.offset()
        with self._lock:
            if generation != self.generation:
                self.failed.append(f"record {i} acknowledged on generation {generation} after the topic was re-created")
                return
            (self.good if kind == "good" else self.bad)[p].add(o)
            self.ends[p] = max(self.ends[p], o + 1)
            if kind == "good":
                self.placed[generation][p][o] = i
            else:
                self.placed_bad[generation][p][o] = value

    def _steady(self) -> None:
        started = time.monotonic()
        sent = 0
        while not self._stop.wait(TICK_S):
            if not self._running.is_set():
                self._idle.set()
                self._running.wait()
                started, sent = time.monotonic(), 0  # no burst to catch up after a pause
                continue
            due = int((time.monotonic() - started) * self.rate) - sent
            for i in self._ids(max(0, due)):
                self._send(good_value(i), i, "good")
            sent += max(0, due)
            self._producer.poll(0)

    def burst(self, records: int, bad_every: int, shapes: list[str]) -> dict[str, int]:
        """``records`` records, every ``bad_every``-th malformed, then one record per shape that is
        not one row; returns to the caller once all are acknowledged."""
        malformed = 0
        for n, i in enumerate(self._ids(records)):
            if bad_every and n % bad_every == bad_every - 1:
                self._send(malformed_value(i), i, "bad")
                malformed += 1
            else:
                self._send(good_value(i), i, "good")
        for shape in shapes:
            i = self._ids(2)[0]  # a two-row record carries two fresh ids
            self._send(not_one_row_value(shape, i), i, "bad")
        self._producer.flush(30)
        return {"good": records - malformed, "malformed": malformed, "not_one_row": len(shapes)}

    # ---- what landed ----------------------------------------------------------------------

    def acked_ends(self) -> dict[int, int]:
        """Per partition, the end of what the broker has acknowledged so far (next offset)."""
        self._producer.poll(0)
        with self._lock:
            return dict(self.ends)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {  # every generation of the topic
                "sent": self.sent,
                "good": sum(len(r) for parts in self.placed for r in parts.values()),
                "bad": sum(len(r) for parts in self.placed_bad for r in parts.values()),
                "failed": len(self.failed),
                "generations": self.generation + 1,
            }


def log_end(
    bootstrap: str, topic: str, partitions: int, hint: dict[int, int], timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition, the offset after the last record, read by consuming to partition EOF from
    just before ``hint`` (the acknowledged end). Never less than ``hint``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"soak-log-end-{topic}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign(
            [
                KafkaTP(topic, p, max(0, hint.get(p, 0) - 1) if hint.get(p) else OFFSET_BEGINNING)
                for p in range(partitions)
            ]
        )
        ends = {p: hint.get(p, 0) for p in range(partitions)}
        at_eof: set[int] = set()
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(at_eof) < partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no partition EOF within {timeout_s:g} s for {set(range(partitions)) - at_eof} "
                    f"(errors: {errors[-3:]})"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            p = msg.partition()
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    ends[p] = max(ends[p], msg.offset())
                    at_eof.add(p)
                else:
                    errors.append(str(msg.error()))
                continue
            ends[p] = max(ends[p], msg.offset() + 1)
            at_eof.discard(p)
        return ends
    finally:
        consumer.close()
