"""Schema evolution with the real Spark participant job (``schema.evolve = "add-columns"``): records
gain new fields mid-stream, the columns are added to the target before those rows are staged,
every row after carries the values, every record is committed exactly once, and a value that
conflicts with its column's type is dead-lettered naming the field."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer

from coordinator.dead_letters.view import DeadLetterReader
from tests.e2e.processes import committed, running
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

pytestmark = pytest.mark.e2e

PARTITIONS = 2


def produce(pipeline: Pipeline, ids: range, conflict_id: int = -1) -> int:
    """Records ``ids`` with the fields ``country`` and ``score`` (``score`` a string at ``conflict_id``),
    spread over the partitions as ``Pipeline.produce`` spreads them (id % partitions)."""
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 5})
    for i in ids:
        fields = {"id": i, "user": f"u{i % 97}", "amount": i * 0.5, "country": f"c{i % 7}", "score": i}
        if i == conflict_id:
            fields["score"] = "not a number"
        producer.produce(
            pipeline.topic, value=json.dumps(fields).encode(), key=str(i).encode(), partition=i % PARTITIONS
        )
    assert producer.flush(30) == 0
    return len(ids)


def test_a_field_appearing_mid_stream_becomes_a_column_and_every_record_lands_once(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("evolve"),
        partitions=PARTITIONS,
        settings={"schema.evolve": "add-columns", "participant.chunk_rows": 1_000},
    )
    db = pipeline.cfg.clickhouse.database
    client = pipeline.client()
    before = pipeline.produce(3_000)  # ids 0..2999: id, user, amount only
    with running(pipeline, tmp_path, slots=PARTITIONS) as procs:
        committed(pipeline, before, procs)
        with_fields = produce(pipeline, range(before, before + 3_000))
        committed(pipeline, before + with_fields, procs)
        target_columns = dict(
            client.query(
                "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = 'events'",
                parameters={"db": db},
            ).result_rows
        )
        assert (target_columns["country"], target_columns["score"]) == ("String", "Int64")
        conflict_id = before + with_fields + 101
        more = produce(pipeline, range(before + with_fields, before + with_fields + 1_000), conflict_id=conflict_id)
        total = before + with_fields + more
        committed(pipeline, total - 1, procs)
        dead = wait_until(lambda: procs.alive() or pipeline.dead_letter_offsets(), 60, "the dead letter published")

    assert_exactly_once(pipeline, total - 1, dead)
    partition = conflict_id % PARTITIONS
    assert {tp.partition: offsets for tp, offsets in dead.items()} == {partition: {conflict_id // PARTITIONS}}
    with DeadLetterReader(pipeline.cfg) as reader:
        [letter] = reader.letters()
    assert letter.error.startswith("field score: column score is Int64 and cannot hold a string"), letter.error
    assert json.loads(letter.value)["id"] == conflict_id

    rows = client.query(f"SELECT id, country, score FROM `{db}`.events ORDER BY id").result_rows
    assert [r[0] for r in rows] == [i for i in range(total) if i != conflict_id]
    assert all((country, score) == ("", 0) for i, country, score in rows if i < before)
    assert all((country, score) == (f"c{i % 7}", i) for i, country, score in rows if i >= before)
