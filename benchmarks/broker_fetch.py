"""``python -m benchmarks.broker_fetch``: what a control consumer's fetch wait costs the embedded broker.

Every control-topic reader (the coordinator, each participant task) sits at the end of the
one-partition control topic and fetches with ``fetch.wait.max.ms`` = ``kafka.control_fetch_wait_ms``.
On the embedded broker (Tansu 0.6.0) a fetch with nothing to return is not parked until a record
arrives, as Apache Kafka parks it: the broker looks once, sleeps out the wait (above 250 ms it looks
again at half of what is left), and answers. So the wait sets both how late a control record is
seen and how many fetches an idle reader makes. For each wait in ``--waits`` this measures, on a
broker of its own:

- the broker's CPU while ``--consumers`` readers wait at the end of the topic, as a share of one core;
- how long a record takes from ``produce`` (sent at once, ``linger.ms`` 0) to ``poll``, p50 and
  max over ``--samples`` records sent at random moments.

With ``--growth-seconds S`` it also shows what a reader keeping up with a growing topic costs: on
a fresh broker ``benchmarks.producer`` writes ``--rate`` events/s into a 4-partition topic for S
seconds, alone, then on another fresh broker with one reader at the end of the topic (as a
participant reads in the paced phase of ``make bench``): the broker's CPU in 10-second windows.
A fetch that finds records lists every record batch of its partition, so the reader's share grows
with the topic.

Measures; asserts nothing; writes no file.

    PYTHONPATH=. .venv/bin/python -m benchmarks.broker_fetch --waits 25,100,500 --growth-seconds 60
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient, NewTopic
from rich.table import Table

from benchmarks import cpu
from benchmarks.chtxn_run import REPO
from benchmarks.console import console as bench_console
from embedded.broker import EmbeddedBroker
from protocol.errors import ChtxnError

TOPIC, EVENTS = "control", "events"
WINDOW_S = 10.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.broker_fetch",
        description=__doc__.split("\n\n")[0],
        epilog="example: PYTHONPATH=. .venv/bin/python -m benchmarks.broker_fetch --waits 25,100,500",
    )
    parser.add_argument("--waits", default="25,100,500", help="fetch.wait.max.ms values, comma-separated")
    parser.add_argument("--consumers", type=int, default=3, help="idle readers (default 3: a coordinator, 2 tasks)")
    parser.add_argument("--seconds", type=float, default=10.0, help="the idle window per wait (default 10)")
    parser.add_argument("--samples", type=int, default=20, help="records timed per wait (default 20)")
    parser.add_argument(
        "--growth-seconds", type=float, default=0.0, help="also the growing-topic runs, this long (default 0: not)"
    )
    parser.add_argument("--rate", type=float, default=120_000, help="events/s of the growing-topic runs")
    args = parser.parse_args(argv)
    waits = [int(w) for w in args.waits.split(",")]
    rows = []
    with EmbeddedBroker(log_path=Path(tempfile.mkdtemp(prefix="chtxn-bench-fetch-")) / "kafka.log") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept: its futures end with it
        admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        for wait in waits:
            share = idle_share(broker, wait, args.consumers, args.seconds)
            latencies = delivery_ms(broker, producer, wait, args.samples)
            rows.append((wait, share, statistics.median(latencies), max(latencies)))
    table = Table(title=f"the embedded broker: {args.consumers} readers at the end of a control topic")
    for column in ("fetch.wait.max.ms", "broker CPU, share of a core", "produce -> poll p50 ms", "max ms"):
        table.add_column(column, justify="right")
    for wait, share, p50, worst in rows:
        table.add_row(str(wait), f"{share:.1%}", f"{p50:.0f}", f"{worst:.0f}")
    bench_console().print(table)
    if args.growth_seconds > 0:
        alone, read = (growing(args.rate, args.growth_seconds, reading) for reading in (False, True))
        table = Table(title=f"the embedded broker's CPU while {args.rate:,.0f} events/s are produced into a topic")
        for column in ("seconds", "producer alone", "producer and one reader at the end"):
            table.add_column(column, justify="right")
        for i, (a, r) in enumerate(zip(alone, read, strict=False)):
            table.add_row(f"{i * WINDOW_S:.0f}-{(i + 1) * WINDOW_S:.0f}", f"{a:.1%}", f"{r:.1%}")
        bench_console().print(table)
    return 0


def growing(rate: float, seconds: float, reading: bool) -> list[float]:
    """The broker's CPU share in each ``WINDOW_S`` while ``rate`` events/s go into a fresh topic,
    with or without a reader keeping up at its end."""
    stop = threading.Event()
    with EmbeddedBroker(log_path=Path(tempfile.mkdtemp(prefix="chtxn-bench-fetch-")) / "kafka.log") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(EVENTS, 4, 1)])[EVENTS].result(30)
        producer = subprocess.Popen(
            [
                *(sys.executable, "-m", "benchmarks.producer", "--bootstrap", broker.bootstrap, "--topic", EVENTS),
                *("--rate", str(rate), "--seconds", str(seconds + WINDOW_S)),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
        )
        tail = threading.Thread(target=keep_up, args=(broker, stop), daemon=True)
        try:
            if reading:
                tail.start()
            shares = []
            for _ in range(int(seconds // WINDOW_S)):
                before, since = broker_cpu_s(broker), time.monotonic()
                time.sleep(WINDOW_S)  # the measured window itself
                shares.append((broker_cpu_s(broker) - before) / (time.monotonic() - since))
            return shares
        finally:
            stop.set()
            if reading:
                tail.join(10)
            producer.terminate()
            producer.wait(10)


def keep_up(broker: EmbeddedBroker, stop: threading.Event) -> None:
    """Read ``EVENTS`` from its end until ``stop``, as a participant's data consumer reads."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "keep-up",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([KafkaTP(EVENTS, p, -1) for p in range(4)])
    try:
        while not stop.is_set():
            consumer.consume(5000, 0.01)
    finally:
        consumer.close()


def reader(broker: EmbeddedBroker, wait_ms: int, name: str) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": name,
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "fetch.wait.max.ms": wait_ms,
        }
    )
    consumer.assign([KafkaTP(TOPIC, 0, -1)])  # the end of the topic, as a control reader starts
    return consumer


def broker_cpu_s(broker: EmbeddedBroker) -> float:
    return cpu.snapshot(root=broker.pid).get(broker.pid, ("", 0.0))[1]


def idle_share(broker: EmbeddedBroker, wait_ms: int, consumers: int, seconds: float) -> float:
    """The broker's CPU, as a share of one core, while ``consumers`` readers wait for a record."""
    readers = [reader(broker, wait_ms, f"idle-{wait_ms}-{i}") for i in range(consumers)]
    try:
        warm = time.monotonic() + 2.0  # every reader assigned and fetching
        while time.monotonic() < warm:
            for r in readers:
                r.poll(0.01)
        before, since = broker_cpu_s(broker), time.monotonic()
        while time.monotonic() < since + seconds:
            for r in readers:
                r.poll(0.01)
        return (broker_cpu_s(broker) - before) / (time.monotonic() - since)
    finally:
        for r in readers:
            r.close()


def delivery_ms(broker: EmbeddedBroker, producer: Producer, wait_ms: int, samples: int) -> list[float]:
    """Milliseconds from ``produce`` to ``poll`` of ``samples`` records, each sent at a random moment."""
    consumer = reader(broker, wait_ms, f"latency-{wait_ms}")
    try:
        warm = time.monotonic() + 1.0
        while time.monotonic() < warm:
            consumer.poll(0.05)
        found = []
        for _ in range(samples):
            pause = time.monotonic() + random.uniform(0, 0.3)  # a random phase against the broker's waits
            while time.monotonic() < pause:
                consumer.poll(0.01)
            sent = time.monotonic()
            producer.produce(TOPIC, b"x")
            producer.flush(10)
            while (record := consumer.poll(0.1)) is None or record.error() is not None:
                if time.monotonic() > sent + 10:
                    raise ChtxnError(f"a record produced to {TOPIC} was not read within 10 s")
            found.append((time.monotonic() - sent) * 1000)
        return found
    finally:
        consumer.close()


if __name__ == "__main__":
    raise SystemExit(main())
