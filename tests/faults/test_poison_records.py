"""Poison records: records ClickHouse refuses for what they are (JSON nested deeper than
``input_format_json_max_depth``, a value of the wrong type) are dead-lettered once, the rest of
their chunk is staged, and txns commit: never an abort loop. Records the Python pre-check cannot
judge (too deep for msgspec, bytes that are not UTF-8, numbers Python cannot hold) are left to
ClickHouse, which stores them.

The real coordinator and real participant tasks run in threads against the embedded stack.
"""

from __future__ import annotations

import json
from collections import Counter

from coordinator.dead_letters.view import offsets_of, read_letters
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import aborts, committed_through, coordinator, participants, produce_values
from tests.pipelines import Pipeline, make_pipeline

WAIT_S = 90.0
#: Deeper than ClickHouse's ``input_format_json_max_depth`` (1000) and msgspec's recursion limit.
DEPTH = 1_500


def good(i: int) -> bytes:
    return json.dumps({"id": i, "user": f"u{i}", "amount": i / 2}).encode()


def deep_objects(i: int) -> bytes:
    return b'{"id": %d, "user": "deep", "amount": 1, "nested": ' % i + b'{"a": ' * DEPTH + b"1" + b"}" * DEPTH + b"}"


def deep_arrays(i: int) -> bytes:
    return b'{"id": %d, "user": "deep", "amount": 1, "nested": ' % i + b"[" * DEPTH + b"]" * DEPTH + b"}"


#: Refused by ClickHouse as data (CANNOT_PARSE_INPUT_ASSERTION_FAILED): a string where a UInt64 goes.
WRONG_TYPE = b'{"id": "not a number", "user": "x", "amount": 1}'
#: Stored by ClickHouse, though msgspec cannot decode them: not UTF-8, a number past float, NaN.
NOT_UTF8 = b'{"id": 901, "user": "caf\xe9", "amount": 1}'
PAST_FLOAT = b'{"id": 902, "user": "big", "amount": 1e999}'
NAN = b'{"id": 903, "user": "nan", "amount": NaN}'


def test_a_record_nested_1500_deep_is_dead_lettered_once_and_txns_commit(stack, tmp_path):
    """Partition 0: the deep record comes first in its chunk, so ClickHouse refuses the chunk with
    TOO_DEEP_RECURSION. Partition 1: a record of the wrong type comes first (a DATA refusal), so the
    pre-check parses the chunk's records, the deep one and one that is not UTF-8 among them."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("poison"))
    tp0, tp1 = pipeline.partitions
    layouts: dict[TopicPartition, list[bytes]] = {
        tp0: [good(0), good(1), deep_objects(2), good(3), WRONG_TYPE, NAN, good(6), NOT_UTF8, good(8), good(9)],
        tp1: [good(10), WRONG_TYPE, deep_arrays(12), NOT_UTF8, PAST_FLOAT, good(15), good(16), good(17)],
    }
    poison = {tp0: {2, 4}, tp1: {1, 2}}  # positions ClickHouse refuses
    ends: dict[TopicPartition, int] = {}
    expected: dict[TopicPartition, set[int]] = {}
    values: dict[tuple[int, int], bytes] = {}
    for tp, layout in layouts.items():  # all produced before the pipeline starts: one chunk per partition
        offsets = produce_values(pipeline, tp.partition, layout)
        ends[tp] = offsets[-1] + 1
        expected[tp] = {offsets[p] for p in poison[tp]}
        values.update(((tp.partition, o), v) for o, v in zip(offsets, layout))

    def committed() -> bool:
        failed = aborts(pipeline)
        assert len(failed) < 3, f"txns abort again and again: {failed[:3]}"
        return committed_through(pipeline, ends)

    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(committed, WAIT_S, f"every offset committed up to {ends}", interval_s=0.2)
        wait_until(
            lambda: offsets_of(read_letters(pipeline.cfg, timeout_s=10)) == expected,
            WAIT_S,
            f"the dead letters {expected} published",
        )
        failed = aborts(pipeline)

    assert failed == [], f"no txn aborts for a poison record: {failed}"
    letters = read_letters(pipeline.cfg)
    published = Counter((x.partition, x.offset) for x in letters)
    assert max(published.values()) == 1, f"each letter reaches the dead-letter topic once: {published}"
    for letter in letters:
        assert letter.value == values[(letter.partition, letter.offset)], "a letter keeps the record's value"
        assert letter.error_code == (306 if b'"deep"' in letter.value else 27), (letter.offset, letter.error)
    report = pipeline.oracle(pipeline.dead_letter_offsets())
    assert report.ok, report.anomalies
    assert report.rows_in_target == sum(ends.values()) - 4
    assert stored_ids(pipeline) >= {901, 902, 903}, "records msgspec cannot decode but ClickHouse reads are stored"


def stored_ids(pipeline: Pipeline) -> set[int]:
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    return {row[0] for row in pipeline.client().query(f"SELECT id FROM `{db}`.`{table}`").result_rows}
