"""The benchmark's data and set-up: the demo's JSON events, one topic, and two identical tables.

``prepare`` gives a fresh pipeline on a running ``EmbeddedStack``: a source topic with
``partitions`` partitions (plus the control and dead-letter topics), database ``bench`` with the
chtxn target ``bench.events``, the plain loop's ``bench.events_plain`` and the insert ceiling's
``bench.events_ceiling`` (all the demo's schema, metadata columns included, plus
``produced_at_ms``, which only the paced producer fills), and the ledger. ``produce`` writes the
demo's events and returns only once the broker has acknowledged every one of them.

With a ClickPipes-like ``workload`` (``benchmarks.clickpipes``) instead of ``demo``, the tables have
that workload's nested columns (no ``produced_at_ms``: it has no paced phase), ``write_config``
sets its ``input_format`` and insert settings, and ``produce_workload`` writes its records.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from confluent_kafka import Producer

from benchmarks import clickpipes
from cli.demo import TARGET_DDL, events
from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from protocol.config.parse import PipelineConfig, load_config
from protocol.errors import ChtxnError

DATABASE = "bench"
TARGET = "events"
PLAIN = "events_plain"
CEILING = "events_ceiling"
TOPIC = "bench_events"
#: What the plain loop commits its offsets under (the pipeline's own group is ``bench``).
PLAIN_GROUP = "bench-plain"
#: The column, and JSON field, of a paced event's produce time (unix ms).
PRODUCED_AT = "produced_at_ms"

PIPELINE_TOML = """
[pipeline]
name = "bench"
topics = ["{topic}"]

[kafka]
bootstrap_servers = "{kafka}"

[clickhouse]
url = "{clickhouse}"
database = "{database}"
target_table = "{target}"
{clickhouse_extra}

[transaction]
interval_s = {interval_s}
size_trigger_rows = {size_trigger_rows}
{transaction_extra}

[participant]
chunk_rows = {chunk_rows}

[ledger]
commit_point = "{commit_point}"

[kafka.properties]
{properties}
{insert_settings}
"""


def write_config(
    path: Path,
    *,
    kafka: str,
    clickhouse: str,
    interval_s: float,
    size_trigger_rows: int,
    chunk_rows: int,
    properties: dict[str, str] | None = None,
    commit_point: str = "token",
    input_format: str | None = None,
    insert_settings: dict[str, str] | None = None,
    idle_interval_s: float | None = None,
) -> PipelineConfig:
    """Write the benchmark pipeline's TOML to ``path`` and load it (the coordinator and job read it too).

    ``properties`` are librdkafka properties for ``[kafka.properties]``; ``input_format`` (chtxn's
    default when None) and ``insert_settings`` go to ``[clickhouse]``; ``idle_interval_s`` to
    ``[transaction]`` (chtxn's default when None).
    """
    path.write_text(
        PIPELINE_TOML.format(
            topic=TOPIC,
            kafka=kafka,
            clickhouse=clickhouse,
            database=DATABASE,
            target=TARGET,
            interval_s=interval_s,
            size_trigger_rows=size_trigger_rows,
            transaction_extra="" if idle_interval_s is None else f"idle_interval_s = {idle_interval_s}",
            chunk_rows=chunk_rows,
            commit_point=commit_point,
            properties="\n".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in (properties or {}).items()),
            clickhouse_extra=f"input_format = {json.dumps(input_format)}" if input_format else "",
            insert_settings="\n".join(
                ["[clickhouse.insert_settings]"]
                + [f"{json.dumps(k)} = {json.dumps(v)}" for k, v in insert_settings.items()]
            )
            if insert_settings
            else "",
        )
    )
    return load_config(str(path), {})


def prepare(cfg: PipelineConfig, partitions: int, workload: str = "demo") -> None:
    """Topics, the tables of ``workload`` and the ledger, on a stack where they do not exist yet."""
    admin = kafka_clients.admin(cfg)
    kafka_clients.create_topics(admin, {TOPIC: partitions, cfg.control_topic: 1, cfg.dead_letter_topic: 1})
    client = make_client(cfg.clickhouse.__class__(url=cfg.clickhouse.url, database="default"))
    try:
        client.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
        for table in (TARGET, PLAIN, CEILING):
            client.command(table_ddl(table) if workload == "demo" else clickpipes.target_ddl(DATABASE, table))
        LedgerStore.of(cfg, client).ensure_tables()
    finally:
        client.close()


def table_ddl(table: str) -> str:
    """The demo's table as ``bench.<table>``, with ``produced_at_ms`` (0 unless the event carries it)."""
    anchor = "    device LowCardinality(String),\n"
    if anchor not in TARGET_DDL:
        raise ChtxnError("cli.demo.TARGET_DDL changed: benchmarks.workload.table_ddl needs a new anchor for its column")
    return TARGET_DDL.replace("demo.events", f"{DATABASE}.{table}").replace(
        anchor, anchor + f"    {PRODUCED_AT} Int64,\n"
    )


def produce(cfg: PipelineConfig, count: int) -> dict[int, int]:
    """``count`` demo events (about 200 bytes of JSON each) keyed by user, spread over the partitions.

    Returns each partition's end offset (last acknowledged offset + 1), taken from the delivery
    reports: the embedded broker's high watermark is not reliable (it can lag behind the last
    record batch), so it is not asked.
    """
    return produce_workload(cfg, count, "demo")[0]


def produce_workload(cfg: PipelineConfig, count: int, workload: str) -> tuple[dict[int, int], int]:
    """``count`` records of ``workload`` as ``produce`` writes them: each partition's end offset, and
    the bytes of every value produced."""
    values: Iterator[tuple[int, bytes]]
    if workload == "demo":
        values = events(count)
    else:
        value: Callable[[int], bytes] = clickpipes.values(workload)
        values = ((i, value(i)) for i in range(count))
    producer = Producer(
        {
            "bootstrap.servers": cfg.kafka.bootstrap_servers,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "none",
        }
    )
    ends: dict[int, int] = {}
    failed: list[str] = []

    def delivered(error: object, message: object) -> None:
        if error is not None:
            failed.append(str(error))
        else:
            partition, offset = message.partition(), message.offset()  # type: ignore[attr-defined]  # a delivered Message
            ends[partition] = max(ends.get(partition, 0), offset + 1)

    total = 0
    for i, data in values:
        total += len(data)
        while True:
            try:
                producer.produce(TOPIC, value=data, key=str(i % 50_000).encode(), on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 5_000 == 4_999:
            producer.poll(0)
    left = producer.flush(120)
    if left or failed:
        raise ChtxnError(
            f"{left + len(failed)} of the benchmark's {count} events were not acknowledged by the broker "
            f"within 120 s{': ' + failed[0] if failed else ''}"
        )
    return ends, total


def clear(cfg: PipelineConfig, table: str) -> None:
    """Empty ``bench.<table>``: none of its parts is left to merge in a later run's window
    (``settle`` sees the merges that run, not those the server starts later)."""
    client = make_client(cfg.clickhouse)
    try:
        client.command(f"TRUNCATE TABLE {DATABASE}.{table}")
    finally:
        client.close()


def settle(cfg: PipelineConfig, timeout_s: float = 120.0) -> None:
    """Wait until ClickHouse runs no background merge, so one step's merges do not slow the next."""
    client = make_client(cfg.clickhouse)
    deadline = time.monotonic() + timeout_s
    try:
        while int(client.command("SELECT count() FROM system.merges")) and time.monotonic() < deadline:  # type: ignore[arg-type]  # count(): an int
            time.sleep(0.2)  # polling period
    finally:
        client.close()
