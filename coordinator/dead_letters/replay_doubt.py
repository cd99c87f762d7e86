"""A dead-letter replay's batch in doubt (``protocol.dead_letters.replay``): where the next batch's records
will land (``ends_before``, for its intent), and which records of a batch in doubt are visible in
their destinations (``visible_replays``). Reads only, ``read_committed``."""

from __future__ import annotations

import time
from collections.abc import Iterable

from confluent_kafka import KafkaError, TopicPartition as KafkaTP

from clients import kafka as kafka_clients
from clients.kafka import KafkaClientFactory
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from protocol.dead_letters import replay as dlq_replay
from protocol.dead_letters.replay import ReplayIntent, ReplayRecord
from protocol.errors import ChtxnError


class DoubtUnresolved(ChtxnError):
    """The destinations of a batch in doubt could not be read to their ends: nothing was replayed."""


def _consumer(kafka: KafkaClientFactory, pipeline: str):  # a confluent_kafka Consumer
    return kafka.consumer(
        **{
            "group.id": f"{dlq_replay.replay_transactional_id(pipeline)}.doubt",
            "isolation.level": "read_committed",
            **CONSUMER_PROPERTIES,
        }
    )


def ends_before(
    kafka: KafkaClientFactory, pipeline: str, destinations: Iterable[tuple[str, int]], timeout_s: float
) -> dict[str, int]:
    """Per destination ``(topic, partition)`` (partition -1: every partition of the topic), its log
    end now, keyed ``"<topic>/<partition>"``."""
    consumer = _consumer(kafka, pipeline)
    try:
        wanted = set(destinations)
        if any(p < 0 for _, p in wanted):
            topics = kafka_clients.cluster_metadata(consumer, timeout_s).topics
            every = {(t, n) for t, p in wanted if p < 0 for n in topics[t].partitions}
            wanted = {(t, p) for t, p in wanted if p >= 0} | every
        ends = log_ends(consumer, sorted(wanted), timeout_s)
        return {f"{t}/{p}": int(end) for (t, p), end in ends.items()}
    finally:
        consumer.close()


def visible_replays(
    kafka: KafkaClientFactory, pipeline: str, intent: ReplayIntent, doubt: set[str], timeout_s: float
) -> dict[str, ReplayRecord]:
    """The records of letters in ``doubt`` that a ``read_committed`` reader sees in ``intent``'s
    destination partitions from the ends it recorded to their ends now; letter key -> the log record
    saying where (the first such record of a letter)."""
    found: dict[str, ReplayRecord] = {}
    if not doubt:
        return found
    consumer = _consumer(kafka, pipeline)
    try:
        starts = {}
        for name, start in intent.ends.items():
            topic, _, partition = name.rpartition("/")
            starts[(topic, int(partition))] = start
        ends = log_ends(consumer, sorted(starts), timeout_s)
        todo = {tp for tp, start in starts.items() if ends[tp] > start}
        if not todo:
            return found
        consumer.assign([KafkaTP(t, p, starts[(t, p)]) for t, p in sorted(todo)])
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.1):
                tp = (m.topic(), m.partition())
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF and (m.offset() or 0) >= ends.get(tp, 0):
                        todo.discard(tp)
                    continue
                record = dlq_replay.settled(
                    m.headers(), doubt, topic=tp[0], partition=tp[1], offset=m.offset(), at_ms=m.timestamp()[1]
                )
                if record is not None:
                    found.setdefault(record.of, record)
                if m.offset() >= ends[tp] - 1:
                    todo.discard(tp)
            if todo:  # past transaction markers, which hold no record
                positions = consumer.position([KafkaTP(t, p) for t, p in sorted(todo)])
                todo -= {(x.topic, x.partition) for x in positions if x.offset >= ends[(x.topic, x.partition)]}
        if todo:
            names = ", ".join(f"{t}/{p}" for t, p in sorted(todo))
            raise DoubtUnresolved(
                f"the last replay of these letters stopped before its commit, and {names} could not be read to "
                f"its end within {timeout_s:g} s to see which went out (an open transaction of another producer "
                "holds read_committed readers back): nothing was replayed; run the same replay again later"
            )
        return found
    finally:
        consumer.close()
