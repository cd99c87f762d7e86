"""Records that are not exactly one row (docs/architecture.md §10): dead-lettered, never an abort loop.

The whole pipeline runs: the real coordinator and real participant tasks, on the embedded stack.
"""

from __future__ import annotations

import json

import pytest

from coordinator.stage.tables import StageTables
from participant.dead_letters import DeadLetterSink
from participant.stager import Stager
from protocol import naming
from protocol.chunking import ChunkBuilder
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import aborts, committed_through, coordinator, participants, produce_values
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec

WAIT_S = 90.0

#: Values ClickHouse would read as two rows (JSONEachRow takes objects back to back, or comma-separated).
TWO_OBJECTS = [b'{"id":1}{"id":2}', b'{"id": 3} {"id": 4}', b'{"id":5},{"id":6}', b'{"id":7}\n{"id":8}']


def good(i: int) -> bytes:
    return json.dumps({"id": i, "user": f"u{i}", "amount": i / 2}).encode()


def test_records_of_two_objects_are_dead_lettered_and_every_offset_commits(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("notonerow"), settings={"participant.chunk_rows": 7})
    ends: dict[TopicPartition, int] = {}
    bad: dict[TopicPartition, set[int]] = {}
    for tp in pipeline.partitions:
        values: list[bytes | None] = [good(i) for i in range(30)]
        positions = (2, 9, 10, 23)  # two bad records side by side in one chunk, others in chunks of their own
        for position, value in zip(positions, TWO_OBJECTS):
            values[position] = value
        offsets = produce_values(pipeline, tp.partition, values)
        ends[tp] = offsets[-1] + 1
        bad[tp] = {offsets[p] for p in positions}

    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(lambda: committed_through(pipeline, ends), WAIT_S, f"every offset committed up to {ends}")
        failed = aborts(pipeline)

    dead = pipeline.dead_letter_offsets()
    assert dead == bad, "exactly the records of two objects are dead-lettered"
    report = pipeline.oracle(dead)
    assert report.ok, report.anomalies
    assert report.rows_in_target == sum(ends.values()) - sum(len(o) for o in bad.values())
    assert failed == [], f"a record of two objects is set aside before it reaches the stage table: {failed}"


#: A target without metadata columns, so that any input format can fill it.
PLAIN_TARGET_DDL = "CREATE TABLE {db}.{table} (id UInt64, s String) ENGINE = MergeTree ORDER BY id"


@pytest.mark.parametrize(
    ("input_format", "values", "bad", "rows_first"),
    [
        # a CSV record of two lines: three rows from... four records, two of them one each
        ("CSV", [b"1,a", b"2,b\n3,c", b"4,d", b"5,e"], {1}, 5),
        # without metadata columns, a JSON string left open swallows the next record: one row of two records
        ("JSONEachRow", [b'{"id":1,"s":"}', b'{"}', b'{"id":3}', b'{"id":4}'], {0, 1}, 3),
    ],
)
def test_a_record_found_not_one_row_after_its_insert_aborts_one_txn_then_is_dead_lettered(
    stack,
    tmp_path,
    input_format,
    values,
    bad,
    rows_first,
):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("afterinsert"),
        target_ddl=PLAIN_TARGET_DDL,
        settings={"clickhouse.input_format": input_format},
    )
    cfg, client = pipeline.cfg, pipeline.client()
    stages = StageTables(
        client, database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name
    )
    stager = Stager(client=client, section=cfg.clickhouse, attempts=3, dead_letters=sink(pipeline))
    records = [Rec(pipeline.topic, 0, offset, value, b"k%d" % offset) for offset, value in enumerate(values)]

    def stage(txn: str):  # (ChunkStaged, stage table)
        table = naming.stage_table(cfg.clickhouse.target_table, cfg.name, txn)
        stages.create(table)
        builder = ChunkBuilder(
            pipeline=cfg.name,
            txn=txn,
            topic=pipeline.topic,
            partition=0,
            start_offset=0,
            chunk_rows=100,
            chunk_bytes=1 << 20,
        )
        assert builder.add(records) == []
        return stager.stage(table, builder.flush()), table

    first, first_table = stage("e1_t1")
    assert first.error, "the chunk's rows are in the stage table with a wrong count: its txn must abort"
    assert f"offsets {', '.join(map(str, sorted(bad)))} " in first.error
    assert stages.count(first_table) == rows_first, "isolating probes never touch the stage table"
    probes = client.query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND name LIKE '%\\_\\_probe\\_%'",
        parameters={"db": cfg.clickhouse.database},
    ).result_rows
    assert probes == [], "the Null-engine probe table is dropped"
    assert len(stager.remembered) == len(bad)

    second, second_table = stage("e1_t2")  # the txn that reads them again
    assert (second.error, second.rows, second.dead_letters) == ("", len(values) - len(bad), len(bad))
    assert stages.count(second_table) == len(values) - len(bad)
    letters = stored_letters(pipeline)
    assert [(offset, txn) for offset, txn, _ in letters] == [(o, "e1_t2") for o in sorted(bad)]
    assert all(error.startswith("not one row") for _, _, error in letters), letters


def sink(pipeline: Pipeline) -> DeadLetterSink:
    return DeadLetterSink(pipeline.client(), database=pipeline.cfg.clickhouse.database, pipeline=pipeline.cfg.name)


def stored_letters(pipeline: Pipeline) -> list[tuple[int, str, str]]:
    """(offset, txn, error) of the letters in ``chtxn_dead_letters``."""
    return [
        tuple(r)
        for r in pipeline.client()
        .query(
            f"SELECT offset, txn, error FROM `{pipeline.cfg.clickhouse.database}`.chtxn_dead_letters "
            "WHERE pipeline = {p:String} ORDER BY offset",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    ]
