"""docker-compose.yml's sample producer: JSON records for docker/init.sql's table, at a steady rate.

Each record is ``{"id": N, "payload": "..."}`` with an ``id`` unique across restarts (microseconds
since the epoch at start, then counting), spread over the topic's partitions by key. Runs until stopped.
Environment: CHTXN_KAFKA_BOOTSTRAP_SERVERS, SAMPLE_TOPIC (events), SAMPLE_RATE (records a second, 50).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from confluent_kafka import Producer


def main() -> int:
    bootstrap = os.environ.get("CHTXN_KAFKA_BOOTSTRAP_SERVERS", "kafka:29092")
    topic = os.environ.get("SAMPLE_TOPIC", "events")
    rate = float(os.environ.get("SAMPLE_RATE", "50"))
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 50})
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    next_id = time.time_ns() // 1000
    sent, started = 0, time.monotonic()
    print(f"producing {rate:g} records/s to {topic} at {bootstrap}", flush=True)
    while not stopping:
        due = int((time.monotonic() - started) * rate) - sent
        for _ in range(due):
            record = {"id": next_id, "payload": f"sample record {sent}"}
            producer.produce(topic, json.dumps(record).encode(), key=str(next_id).encode())
            next_id, sent = next_id + 1, sent + 1
        producer.poll(0.1)
    return 0 if producer.flush(10) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
