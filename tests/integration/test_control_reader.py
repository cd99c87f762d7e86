"""``ControlReader`` at the tail of a control topic that several producers write at once, on the
session's broker: every message arrives once, in offset order.

On the embedded broker (Tansu 0.6) a plain consumer in this place now and then moves past a
record batch that was served after a later one (a few holes in 20 s of four producers at full
speed, in runs made by hand; not asserted here, since it is a race). The reader must fill every
such hole.
"""

from __future__ import annotations

import threading

from confluent_kafka import Consumer, Producer

from clients.control_reader import ControlReader
from protocol.codec import encode
from protocol.messages import Heartbeat
from tests.helpers import create_topic, unique_name, wait_until

PRODUCERS = 4
EACH = 2_000


def test_the_reader_delivers_every_message_once_in_order_while_producers_race(stack, kafka_admin):
    topic = create_topic(kafka_admin, unique_name("control"), 1)
    reader = ControlReader(
        Consumer(
            {
                "bootstrap.servers": stack.kafka_bootstrap,
                "group.id": unique_name("g"),
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 25,
            }
        ),
        topic,
        who="reader",
    )
    reader.assign(0)
    ready = threading.Barrier(PRODUCERS)

    def produce(i: int) -> None:
        """Like the pipeline's writers: producer 0 sends one message at a time and waits for it (the
        coordinator), the others batch for a few ms (participants)."""
        producer = Producer(
            {"bootstrap.servers": stack.kafka_bootstrap, "linger.ms": 2 * i, "enable.idempotence": i == 0}
        )
        ready.wait()
        for n in range(EACH):
            producer.produce(
                topic, encode(Heartbeat(pipeline="p", epoch=1, txn=f"{i}-{n}", sender=str(i), partitions=()))
            )
            if i == 0:
                assert producer.flush(10) == 0
            else:
                producer.poll(0)
        assert producer.flush(30) == 0

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    seen: list[str] = []

    def all_read() -> bool:
        seen.extend(m.txn for m in reader.read(500, 0.05))
        return len(seen) >= PRODUCERS * EACH

    try:
        wait_until(all_read, 120, f"{PRODUCERS * EACH} messages (have {len(seen)})", interval_s=0)
    finally:
        for thread in threads:
            thread.join(60)
        reader.close()
    assert len(seen) == len(set(seen)) == PRODUCERS * EACH
    for i in range(PRODUCERS):  # one producer's messages keep their order
        assert [t for t in seen if t.startswith(f"{i}-")] == [f"{i}-{n}" for n in range(EACH)]
    assert reader.holes.skipped == []


def test_a_tombstone_on_the_control_topic_is_passed_over(stack, kafka_admin):
    """A record with a null value (a tombstone someone produced, or a compaction marker) is not a
    message: the reader goes on to the next one instead of raising."""
    topic = create_topic(kafka_admin, unique_name("control"), 1)
    reader = ControlReader(
        Consumer(
            {"bootstrap.servers": stack.kafka_bootstrap, "group.id": unique_name("g"), "enable.auto.commit": False}
        ),
        topic,
        who="reader",
    )
    reader.assign(0)
    producer = Producer({"bootstrap.servers": stack.kafka_bootstrap})
    for value in (
        encode(Heartbeat(pipeline="p", epoch=1, txn="before", sender="s", partitions=())),
        None,
        encode(Heartbeat(pipeline="p", epoch=1, txn="after", sender="s", partitions=())),
    ):
        producer.produce(topic, key=b"p", value=value)
    assert producer.flush(10) == 0
    seen: list[str] = []

    def both_read() -> bool:
        seen.extend(m.txn for m in reader.read(10, 0.1))
        return len(seen) >= 2

    try:
        wait_until(both_read, 30, f"the two messages around the tombstone (have {seen})", interval_s=0)
    finally:
        reader.close()
    assert seen == ["before", "after"]
    assert reader.holes.skipped == []
