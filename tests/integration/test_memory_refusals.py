"""Out of memory while staging (MEMORY_LIMIT_EXCEEDED, 241), on the real engine: the stager
blames a record only when it fails alone again while the server has memory for other queries.

A per-query ``max_memory_usage`` on the client stands in for the two causes ClickHouse reports
with the same code: a record that needs more than a query may use, and a server that cannot
give a query memory (the control query of ``CONTROL_BYTES`` then fails too).
"""

from __future__ import annotations

import json

from clients.clickhouse import make_client
from coordinator.stage.tables import StageTables
from participant.bisection import TOO_BIG_FOR_MEMORY
from participant.dead_letters import DeadLetterSink
from participant.stager import CONTROL_BYTES, Stager
from protocol import naming
from protocol.chunking import ChunkBuilder
from tests.helpers import unique_name
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec


def good(i: int, size: int = 0) -> bytes:
    return json.dumps({"id": i, "user": "u" * size or f"u{i}", "amount": i / 2}).encode()


def stage(pipeline: Pipeline, max_memory_usage: int, values: list[bytes], txn: str):
    """(ChunkStaged, stage table) of one chunk of ``values`` staged under a per-query memory limit."""
    cfg = pipeline.cfg
    client = make_client(cfg.clickhouse, max_memory_usage=max_memory_usage)
    sink = DeadLetterSink(pipeline.client(), database=cfg.clickhouse.database, pipeline=cfg.name)
    stager = Stager(client=client, section=cfg.clickhouse, attempts=2, dead_letters=sink, sleep=lambda _: None)
    table = naming.stage_table(cfg.clickhouse.target_table, cfg.name, txn)
    StageTables(
        pipeline.client(), database=cfg.clickhouse.database, target=cfg.clickhouse.target_table, pipeline=cfg.name
    ).create(table)
    builder = ChunkBuilder(
        pipeline=cfg.name,
        txn=txn,
        topic=pipeline.topic,
        partition=0,
        start_offset=0,
        chunk_rows=100,
        chunk_bytes=1 << 30,
    )
    assert builder.add([Rec(pipeline.topic, 0, o, v, b"k%d" % o) for o, v in enumerate(values)]) == []
    return stager.stage(table, builder.flush()), table


def staged(pipeline: Pipeline, table: str) -> list[int]:
    return [
        r[0]
        for r in pipeline.client()
        .query(f"SELECT _offset FROM `{pipeline.cfg.clickhouse.database}`.`{table}` ORDER BY _offset")
        .result_rows
    ]


def letters(pipeline: Pipeline) -> list[tuple[int, int, str]]:
    return [
        tuple(r)
        for r in pipeline.client()
        .query(
            f"SELECT offset, error_code, error FROM `{pipeline.cfg.clickhouse.database}`.chtxn_dead_letters "
            "WHERE pipeline = {p:String} ORDER BY offset",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    ]


def test_a_record_too_big_for_a_querys_memory_is_dead_lettered_and_the_rest_staged_in_parts(stack, tmp_path):
    """24 MB a query: the control (8 MiB) and 2 MB records fit, four of them at once too; the chunk
    of eight does not, nor does a record of 30 MB alone."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("memrecord"), partitions=1)
    values = (
        [good(0)]
        + [good(i, 2_000_000) for i in range(1, 5)]
        + [good(5, 30_000_000)]
        + [good(i, 2_000_000) for i in range(6, 10)]
        + [good(10)]
    )
    result, table = stage(pipeline, 24_000_000, values, "e1_t1")
    assert (result.error, result.rows, result.dead_letters) == ("", 10, 1)
    assert staged(pipeline, table) == [o for o in range(11) if o != 5]
    [(offset, code, error)] = letters(pipeline)
    assert (offset, code) == (5, 241) and error.startswith(TOO_BIG_FOR_MEMORY), error


def test_a_server_without_memory_to_spare_fails_the_chunk_and_dead_letters_nothing(stack, tmp_path):
    """10 MB a query: the 16 MB record fails, and so does the control query of 8 MiB: ClickHouse
    cannot tell it from a server short of memory, so the chunk fails and its txn would abort."""
    assert CONTROL_BYTES == 8 << 20
    pipeline = make_pipeline(stack, tmp_path, unique_name("memserver"), partitions=1)
    result, table = stage(pipeline, 10_000_000, [good(0), good(1, 16_000_000), good(2)], "e1_t1")
    assert "241" in result.error and "MEMORY_LIMIT_EXCEEDED" in result.error, result.error
    assert (result.rows, result.dead_letters) == (0, 0)
    assert staged(pipeline, table) == [] and letters(pipeline) == []
