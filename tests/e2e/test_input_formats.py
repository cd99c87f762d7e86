"""Every record-per-row input format through the real Spark participant job, with metadata columns.

For each format: records whose ``id`` names their own coordinates (record ``i`` goes to partition
``i % 2`` at offset ``i // 2``), one malformed record among them. It must end with the oracle
(every committed offset once, the malformed one dead-lettered), and every row's ``_partition``
and ``_offset``, which ClickHouse filled, must be those of the record it came from.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from embedded.schema_registry import schema_registry
from protocol.framing import varint
from tests.e2e.processes import committed, running
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

pytestmark = pytest.mark.e2e

PARTITIONS = 2
RECORDS = 3_000
BAD = 1_234  # the malformed record's number: partition 0, offset 617
TARGET_DDL = (
    "CREATE TABLE {db}.{table} (id Int64, name String, _topic String, _partition UInt32, _offset UInt64) "
    "ENGINE = MergeTree ORDER BY (_partition, _offset)"
)
AVRO_SCHEMA_ID = 42
AVRO_SCHEMA = {
    "type": "record",
    "name": "row",
    "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}],
}
PROTO = 'syntax = "proto3";\nmessage Row {\n  int64 id = 1;\n  string name = 2;\n}\n'


def zigzag(n: int) -> bytes:
    return varint((n << 1) ^ (n >> 63))


def avro(i: int, name: bytes) -> bytes:  # Confluent wire format: magic 0, schema id, the datum
    return b"\x00" + struct.pack(">I", AVRO_SCHEMA_ID) + zigzag(i) + zigzag(len(name)) + name


def protobuf(i: int, name: bytes) -> bytes:  # one Row message, unframed, as Kafka carries it
    return b"\x08" + varint(i) + b"\x12" + varint(len(name)) + name


@dataclass(frozen=True)
class Format:
    name: str
    encode: Callable[[int, bytes], bytes]
    malformed: bytes


FORMATS = {
    "CSV": Format("CSV", lambda i, name: b"%d,%s" % (i, name), b"not a number,x"),
    "TSV": Format("TSV", lambda i, name: b"%d\t%s" % (i, name), b"not a number\tx"),
    "RowBinary": Format("RowBinary", lambda i, name: struct.pack("<q", i) + varint(len(name)) + name, b"\x01\x02\x03"),
    # not the magic byte 0 (a schema id the registry lacks is not the record's fault: the chunk fails)
    "AvroConfluent": Format("AvroConfluent", avro, b"\x01" + struct.pack(">I", AVRO_SCHEMA_ID) + b"\x02\x02x"),
    "Protobuf": Format("Protobuf", protobuf, b"\x08\xff\xff"),
}


@contextmanager
def format_settings(fmt: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The ``[clickhouse.insert_settings]`` ``fmt`` needs, with what they point at running."""
    if fmt == "AvroConfluent":
        registry = tmp_path / "registry"
        registry.mkdir()
        (registry / f"{AVRO_SCHEMA_ID}.avsc").write_text(json.dumps(AVRO_SCHEMA))
        with schema_registry(registry) as url:
            yield {"format_avro_schema_registry_url": url}
    elif fmt == "Protobuf":
        (tmp_path / "row.proto").write_text(PROTO)
        yield {"format_schema": f"{tmp_path / 'row.proto'}:Row"}
    else:
        yield {}


def produce(pipeline: Pipeline, fmt: Format) -> None:
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(RECORDS):
        value = fmt.malformed if i == BAD else fmt.encode(i, b"name-%d" % i)
        producer.produce(pipeline.topic, value=value, key=str(i).encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_format_lands_once_with_clickhouse_filled_metadata_and_its_bad_record_dead_lettered(
    stack, tmp_path: Path, fmt: str
) -> None:
    with ExitStack() as stack_of_settings:
        settings = stack_of_settings.enter_context(format_settings(fmt, tmp_path))
        pipeline = make_pipeline(
            stack,
            tmp_path,
            unique_name(f"fmt{fmt.lower()}"),
            partitions=PARTITIONS,
            target_ddl=TARGET_DDL,
            settings={
                "clickhouse.input_format": fmt,
                "clickhouse.insert_settings": settings,
                "participant.chunk_rows": 500,
            },
        )
        produce(pipeline, FORMATS[fmt])
        with running(pipeline, tmp_path, slots=PARTITIONS) as procs:
            committed(pipeline, RECORDS - 1, procs)
            dead = wait_until(lambda: procs.alive() or pipeline.dead_letter_offsets(), 60, "the dead letter published")

    assert_exactly_once(pipeline, RECORDS - 1, dead)
    assert {tp.partition: offsets for tp, offsets in dead.items()} == {BAD % PARTITIONS: {BAD // PARTITIONS}}
    [(rows, misplaced, names)] = (
        pipeline.client()
        .query(
            f"SELECT count(), countIf(id != _offset * {PARTITIONS} + _partition), countIf(name != concat('name-', "
            f"toString(id))) FROM `{pipeline.cfg.clickhouse.database}`.events WHERE _topic = {{t:String}}",
            parameters={"t": pipeline.topic},
        )
        .result_rows
    )
    assert (rows, misplaced, names) == (RECORDS - 1, 0, 0)
