"""A whole pipeline in one test process: the real coordinator and real participant tasks in threads.

``coordinator(pipeline, leader_class=...)`` runs ``CoordinatorService`` (a ``Leader`` subclass
injects faults); ``participants(pipeline, tasks=N)`` runs N ``TaskRunner`` threads sharing the
partitions. Both stop cleanly on leaving the ``with`` block and re-raise what their thread raised.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import msgspec
from confluent_kafka import Producer

from coordinator.leader import Leader
from coordinator.service import CoordinatorService
from participant.runner import TaskRunner
from protocol.messages import TopicPartition
from tests.pipelines import Pipeline


class StoppableThread:
    """``target(stop)`` on a daemon thread; ``stop()`` joins it and re-raises what it raised."""

    def __init__(self, name: str, target) -> None:  # Callable[[threading.Event], object]
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._target = target
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._target(self._stop)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), f"thread {self._thread.name} did not stop within 60 s"
        if self.error is not None:
            raise self.error


@contextmanager
def coordinator(
    pipeline: Pipeline, *, leader_class: type[Leader] = Leader, coordinator_id: str = "c1"
) -> Iterator[CoordinatorService]:
    cfg = msgspec.structs.replace(
        pipeline.cfg, coordinator=msgspec.structs.replace(pipeline.cfg.coordinator, id=coordinator_id)
    )
    service = CoordinatorService(cfg, leader_class=leader_class)
    thread = StoppableThread(f"coordinator-{coordinator_id}", service.run)
    try:
        yield service
    finally:
        thread.stop()


@contextmanager
def participants(pipeline: Pipeline, *, tasks: int = 1) -> Iterator[list[StoppableThread]]:
    """``tasks`` participant tasks, partition i held by task ``i % tasks``."""
    groups: list[list[TopicPartition]] = [[] for _ in range(tasks)]
    for i, tp in enumerate(pipeline.partitions):
        groups[i % tasks].append(tp)
    with ExitStack() as stack:
        threads = []
        for i, held in enumerate(g for g in groups if g):
            runner = TaskRunner(pipeline.cfg, held, participant_id=f"task-{i}")
            thread = StoppableThread(f"task-{i}", runner.run)
            stack.callback(thread.stop)
            threads.append(thread)
        yield threads


def task(pipeline: Pipeline, partitions: Sequence[TopicPartition], participant_id: str) -> StoppableThread:
    """One participant task holding ``partitions``, started; ``stop()`` ends it (its heartbeats stop)."""
    return StoppableThread(participant_id, TaskRunner(pipeline.cfg, partitions, participant_id=participant_id).run)


def good(i: int) -> bytes:
    """A record value the test target (``TARGET_DDL``) takes as one row."""
    return json.dumps({"id": i, "user": f"u{i}", "amount": i / 2}).encode()


def produce_values(pipeline: Pipeline, partition: int, values: Sequence[bytes | None]) -> list[int]:
    """Produce ``values`` (None: a tombstone) to one partition, keys ``k<i>``; returns their offsets."""
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 5})
    offsets: list[int] = []

    def delivered(err, msg) -> None:
        assert err is None, err
        offsets.append(msg.offset())

    for i, value in enumerate(values):
        producer.produce(pipeline.topic, value=value, key=b"k%d" % i, partition=partition, on_delivery=delivered)
    assert producer.flush(30) == 0, "not every test record was delivered"
    return sorted(offsets)


def committed_through(pipeline: Pipeline, ends: dict[TopicPartition, int]) -> bool:
    """True once the ledger head of every partition in ``ends`` has reached its end offset."""
    _, head = pipeline.ledger().head()
    return all(head.get(tp, 0) >= end for tp, end in ends.items())


def aborts(pipeline: Pipeline) -> list[str]:
    """Reasons of the aborted txns so far, but for those aborted by a clean shutdown."""
    return [t.reason for t in pipeline.ledger().history(limit=1000, state="ABORTED") if "shutting down" not in t.reason]
