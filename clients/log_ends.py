"""Where each partition's log ends, read so that it is right on Kafka and on the embedded broker.

``Consumer.get_watermark_offsets(cached=False)`` and ``AdminClient.list_offsets(OffsetSpec.latest())``
both send a ListOffsets request. Kafka answers it with the high watermark; Tansu (the embedded
broker, ``embedded/broker.py``) answers with the base offset of the partition's last record batch
+ 1, which is behind the log end while that batch holds several records (1,653 records produced
in one batch read as "log end 1"). Both brokers put the true high watermark in every Fetch answer,
and librdkafka keeps the latest one (``get_watermark_offsets(cached=True)``).

``log_ends`` therefore asks ListOffsets first, then fetches each partition from that offset and
takes the high watermark of its first Fetch answer (one with a record, or an empty one, which
librdkafka reports as partition EOF). On Kafka the two agree and the fetch returns nothing (or
records written since); on Tansu the fetch returns the rest of the last batch and the true end.
The answer is the log end as it was at some moment during the call; a ``read_committed`` client
(librdkafka's default) gets the last stable offset, the end of what it can read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition as KafkaTP

from clients.kafka import BrokerUnreachable

#: librdkafka's wait for a Fetch that finds nothing new: short, so an idle partition answers at once.
FETCH_WAIT_MS = 10
#: Consumer properties ``log_ends`` needs; pass them when making its consumer.
CONSUMER_PROPERTIES: dict[str, Any] = {
    "enable.partition.eof": True,
    "enable.auto.commit": False,
    "fetch.wait.max.ms": FETCH_WAIT_MS,
}


def log_ends(
    consumer: Any,
    partitions: Sequence[tuple[str, int]],
    timeout_s: float = 10.0,
    *,
    unconfirmed: set[tuple[str, int]] | None = None,
) -> dict[tuple[str, int], int]:
    """The log end offset (the offset the next record will get) of each ``(topic, partition)``.

    ``consumer`` is a confluent-kafka ``Consumer`` made with ``CONSUMER_PROPERTIES``; its
    assignment is replaced, and left empty on return. A partition whose Fetch does not answer
    within ``timeout_s`` keeps its ListOffsets answer (a lower bound) and is added to
    ``unconfirmed``: a caller that judges a log by its end must not judge it by that. Raises
    ``BrokerUnreachable`` when ListOffsets fails.
    """
    listed: dict[tuple[str, int], int] = {}
    for topic, partition in partitions:
        try:
            _, high = consumer.get_watermark_offsets(KafkaTP(topic, partition), timeout=timeout_s, cached=False)
        except KafkaException as exc:
            raise BrokerUnreachable(f"cannot read the end offset of {topic}-{partition}: {exc}") from None
        listed[(topic, partition)] = high
    if not listed:
        return {}
    ends = dict(listed)
    waiting = set(listed)
    consumer.assign([KafkaTP(topic, partition, max(0, high)) for (topic, partition), high in listed.items()])
    try:
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            for record in consumer.consume(10_000, 0.05):
                error = record.error()
                eof = error is not None and error.code() == KafkaError._PARTITION_EOF
                if error is not None and not eof:
                    continue  # e.g. offset out of range after retention: keep the listed end
                where = (record.topic(), record.partition())
                if where not in waiting:
                    continue
                waiting.discard(where)
                _, fetched = consumer.get_watermark_offsets(KafkaTP(*where), cached=True)
                ends[where] = max(listed[where], fetched, record.offset() + (0 if eof else 1))
    finally:
        consumer.unassign()
    if unconfirmed is not None:
        unconfirmed.update(waiting)
    return ends
