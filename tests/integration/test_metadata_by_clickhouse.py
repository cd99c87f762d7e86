"""ClickHouse fills the metadata columns (``protocol.framing``): row ``n`` of a chunk is record ``n``.

The stager sends a chunk's values as they are, and ClickHouse numbers the rows it parses to give
each its ``_offset``. These tests check that numbering row by row on the real engine, with
parallel parsing forced on (segments of 64 KiB, 4 parsing threads), on a million records whose
payload names their own offset.
"""

from __future__ import annotations

import json

from coordinator.stage.tables import StageTables
from participant.dead_letters import DeadLetterSink
from participant.stager import Stager
from protocol import naming
from protocol.chunking import ChunkBuilder
from tests.helpers import unique_name
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec

TARGET_DDL = (
    "CREATE TABLE {db}.{table} (n UInt64, pad String, country LowCardinality(String) DEFAULT 'none', "
    "_topic String, _partition UInt32, _offset UInt64) ENGINE = MergeTree ORDER BY _offset"
)
#: Parallel parsing on, in small segments, on more threads than the machine has cores.
PARALLEL_PARSING = {
    "input_format_parallel_parsing": 1,
    "min_chunk_bytes_for_parallel_parsing": 65536,
    "max_parsing_threads": 4,
}
RECORDS = 1_000_000


def test_a_million_rows_each_get_the_offset_of_their_record_under_parallel_parsing(stack, tmp_path) -> None:
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("rowoffsets"),
        target_ddl=TARGET_DDL,
        settings={"clickhouse.insert_settings": PARALLEL_PARSING},
    )
    cfg, client = pipeline.cfg, pipeline.client()
    table, stager = stage_table_and_stager(pipeline)
    # Half the records at consecutive offsets, half with a gap after every 997th (the runs path);
    # payloads of uneven length, so that segments end anywhere in a record; every 7th omits country.
    offsets = list(range(RECORDS // 2)) + [RECORDS + i + i // 997 for i in range(RECORDS // 2)]
    records = [
        Rec(
            pipeline.topic,
            1,
            o,
            (b'{"n":%d,"pad":"%s"}' if o % 7 == 0 else b'{"n":%d,"pad":"%s","country":"c"}') % (o, b"x" * (o % 53)),
        )
        for o in offsets
    ]
    chunks = chunk_builder(pipeline, 1, 0, RECORDS // 2).add(records)
    assert [c.rows for c in chunks] == [RECORDS // 2, RECORDS // 2]

    for chunk in chunks:
        staged = stager.stage(table, chunk)
        assert (staged.error, staged.rows) == ("", chunk.rows)

    db = cfg.clickhouse.database
    [(rows, wrong, distinct, topics, partitions, defaults, low, high)] = client.query(
        f"SELECT count(), countIf(_offset != n), uniqExact(_offset), groupUniqArray(_topic), "
        f"groupUniqArray(_partition), countIf(country = 'none'), min(_offset), max(_offset) FROM `{db}`.`{table}`"
    ).result_rows
    assert rows == RECORDS and distinct == RECORDS
    assert wrong == 0, f"{wrong} rows carry another record's offset"
    assert (topics, partitions) == ([pipeline.topic], [1])
    assert (low, high) == (offsets[0], offsets[-1])
    assert defaults == sum(1 for o in offsets if o % 7 == 0), "an omitted field takes the column's DEFAULT"


def test_a_chunk_sent_again_is_stored_once(stack, tmp_path) -> None:
    pipeline = make_pipeline(stack, tmp_path, unique_name("rowdedup"), target_ddl=TARGET_DDL)
    cfg, client = pipeline.cfg, pipeline.client()
    table, stager = stage_table_and_stager(pipeline)
    values = [json.dumps({"n": o, "pad": ""}).encode() for o in range(10, 20)]
    builder = chunk_builder(pipeline, 0, 10, 100)
    builder.add([Rec(pipeline.topic, 0, 10 + i, v) for i, v in enumerate(values)])
    chunk = builder.flush()
    assert chunk is not None
    for _ in range(3):
        assert stager.stage(table, chunk).error == ""
    [(rows, wrong)] = client.query(
        f"SELECT count(), countIf(_offset != n) FROM `{cfg.clickhouse.database}`.`{table}`"
    ).result_rows
    assert (rows, wrong) == (10, 0)


def stage_table_and_stager(pipeline: Pipeline) -> tuple[str, Stager]:
    """Txn ``e1_t1``'s stage table, created, and a stager with a dead-letter sink."""
    cfg, client = pipeline.cfg, pipeline.client()
    table = naming.stage_table(cfg.clickhouse.target_table, cfg.name, "e1_t1")
    StageTables(client, database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name).create(
        table
    )
    sink = DeadLetterSink(client, database=cfg.clickhouse.database, pipeline=cfg.name)
    return table, Stager(client=client, section=cfg.clickhouse, attempts=3, dead_letters=sink)


def chunk_builder(pipeline: Pipeline, partition: int, start: int, rows: int) -> ChunkBuilder:
    """Chunks of txn ``e1_t1`` of ``partition`` from ``start``, ``rows`` records each, bytes unbounded."""
    return ChunkBuilder(
        pipeline=pipeline.cfg.name,
        txn="e1_t1",
        topic=pipeline.topic,
        partition=partition,
        start_offset=start,
        chunk_rows=rows,
        chunk_bytes=1 << 30,
    )
