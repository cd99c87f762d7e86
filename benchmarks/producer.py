"""The paced producer: the demo's events at a fixed rate, each stamped with its produce time.

    python -m benchmarks.producer --bootstrap HOST:PORT --topic T --rate ROWS_PER_S --seconds S

Every ``TICK_S`` it produces the events due by then (``rate`` x elapsed, minus those sent), each
with ``"produced_at_ms"`` (unix ms at the start of that tick) spliced in front of one of a pool of
pre-built demo events: the only per-event work is that byte concatenation and ``produce``. It
flushes at the end and prints one JSON object on stdout: ``sent``, ``failed``, ``seconds`` (the
producing span), ``max_behind`` (most events it was ever behind its schedule: it could not keep
up if this grows), ``cpu_s``. A separate process, so its CPU is its own (``benchmarks.cpu``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from confluent_kafka import Producer

from benchmarks.workload import PRODUCED_AT
from cli.demo import events

TICK_S = 0.005
LINGER_MS = 20
POOL = 10_000
KEYS = 50_000  # as ``workload.produce``: keys spread the events over the partitions


def produce_paced(bootstrap: str, topic: str, rate: float, seconds: float) -> dict:
    """Produce at ``rate`` events/s for ``seconds``; returns the figures printed by ``main``."""
    failed: list[str] = []

    def delivered(error: object, _message: object) -> None:  # called for failures only
        failed.append(str(error))

    # Batches of up to LINGER_MS: the broker shares the machine with the pipeline, and its CPU per
    # produced event falls by almost half from 5 ms batches to 20 ms ones (embedded broker, 150k
    # events/s). The wait counts against freshness: an event is stamped before it is batched.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": LINGER_MS,
            "batch.size": 1_000_000,
            "compression.type": "none",
            "delivery.report.only.error": True,
            "on_delivery": delivered,
        }
    )
    topics = topic.split(",")  # several: the events go round-robin over them
    pool = [body[1:] for _, body in events(POOL)]  # each '{' ... '}' without its '{'
    keys = [str(i).encode() for i in range(KEYS)]
    head = b'{"' + PRODUCED_AT.encode() + b'":'
    cpu0 = time.process_time()
    t0 = time.time()
    sent = max_behind = 0
    while True:
        now = time.time()
        elapsed = now - t0
        if elapsed >= seconds:
            break
        due = int(rate * elapsed) - sent
        max_behind = max(max_behind, due)
        prefix = head + str(int(now * 1000)).encode() + b","
        for _ in range(due):
            value = prefix + pool[sent % POOL]
            while True:
                try:
                    producer.produce(topics[sent % len(topics)], value=value, key=keys[sent % KEYS])
                    break
                except BufferError:
                    producer.poll(0.01)
            sent += 1
        producer.poll(0)
        time.sleep(max(0.0, TICK_S - (time.time() - now)))
    span = time.time() - t0
    left = producer.flush(120)
    return {
        "sent": sent,
        "failed": len(failed) + left,
        "first_error": failed[0] if failed else "",
        "seconds": span,
        "max_behind": max_behind,
        "cpu_s": time.process_time() - cpu0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.producer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True, help="a topic, or several separated by commas (round-robin)")
    parser.add_argument("--rate", type=float, required=True, help="events per second")
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(produce_paced(args.bootstrap, args.topic, args.rate, args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
