"""``clients.log_ends``: the log end of a partition whose last record batch holds many records, on the
session's broker (the embedded one answers ListOffsets with that batch's base offset + 1)."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition as KafkaTP

from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from tests.helpers import create_topic, unique_name


def produce(bootstrap: str, topic: str, partition: int, count: int, *, linger_ms: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": linger_ms, "batch.size": 10_000_000})
    for i in range(count):
        producer.produce(topic, b"%d" % i, partition=partition)
    assert producer.flush(30) == 0


def test_the_log_end_is_the_offset_after_the_last_record_however_records_were_batched(stack, kafka_admin):
    topic = create_topic(kafka_admin, unique_name("ends"), 3)
    produce(stack.kafka_bootstrap, topic, 0, 1653, linger_ms=1000)  # one batch
    produce(stack.kafka_bootstrap, topic, 1, 1, linger_ms=0)
    produce(stack.kafka_bootstrap, topic, 1, 40, linger_ms=1000)  # a single-record batch, then one of 40
    consumer = Consumer({"bootstrap.servers": stack.kafka_bootstrap, "group.id": "ends", **CONSUMER_PROPERTIES})
    try:
        listed = consumer.get_watermark_offsets(KafkaTP(topic, 0), timeout=10, cached=False)[1]
        assert 0 < listed <= 1653  # Kafka: 1653; the embedded broker: 1
        assert log_ends(consumer, [(topic, 0), (topic, 1), (topic, 2)]) == {
            (topic, 0): 1653,
            (topic, 1): 41,
            (topic, 2): 0,
        }
        assert consumer.assignment() == []
        produce(stack.kafka_bootstrap, topic, 2, 7, linger_ms=1000)
        assert log_ends(consumer, [(topic, 2)]) == {(topic, 2): 7}
    finally:
        consumer.close()
