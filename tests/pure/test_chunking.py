"""Chunking and token rules: the same offsets always give the same chunks; cheap record checks."""

from __future__ import annotations

import random

import pytest

from protocol.chunking import MAX_RUNS, ChunkBuilder, json_problem, record_problem
from tests.records import Rec


def records(offsets: list[int], size: int = 10, topic: str = "src", partition: int = 0) -> list[Rec]:
    return [Rec(topic, partition, o, b"x" * size) for o in offsets]


def builder(start: int = 0, rows: int = 3, nbytes: int = 1000) -> ChunkBuilder:
    return ChunkBuilder(
        pipeline="pl", txn="e1_t1", topic="src", partition=0, start_offset=start, chunk_rows=rows, chunk_bytes=nbytes
    )


def cut(recs: list[Rec], batch: int, **kw) -> list[tuple]:
    b = builder(**kw)
    chunks = []
    for i in range(0, len(recs), batch):
        chunks += b.add(recs[i : i + batch])
    last = b.flush()
    chunks += [last] if last else []
    return [
        (c.chunk_no, c.token, c.first_offset, c.next_offset, tuple(r.o for r in c.records), c.bytes) for c in chunks
    ]


def test_chunks_by_rows_numbered_from_zero_with_tokens():
    assert cut(records(list(range(7))), batch=100) == [
        (0, "pl/e1_t1/src/0/0/0-3", 0, 3, (0, 1, 2), 30),
        (1, "pl/e1_t1/src/0/1/3-6", 3, 6, (3, 4, 5), 30),
        (2, "pl/e1_t1/src/0/2/6-7", 6, 7, (6,), 10),
    ]


def test_chunks_by_bytes_cut_before_the_record_that_would_overflow():
    recs = [
        Rec("src", 0, 0, b"a" * 40),
        Rec("src", 0, 1, b"b" * 40),
        Rec("src", 0, 2, b"c" * 30),
        Rec("src", 0, 3, b"d" * 200),
    ]
    assert [(c[2], c[3], c[5]) for c in cut(recs, batch=1, rows=100, nbytes=100)] == [
        (0, 2, 80),  # 80 + 30 would pass 100
        (2, 3, 30),  # a record larger than chunk_bytes forms a chunk of its own
        (3, 4, 200),
    ]


def test_exactly_full_chunk_is_cut_at_the_boundary():
    recs = records([0, 1, 2, 3], size=50)
    assert [c[4] for c in cut(recs, batch=2, rows=100, nbytes=100)] == [(0, 1), (2, 3)]


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 13, 1000])
def test_poll_batch_boundaries_never_change_chunks(batch):
    recs = [Rec("src", 0, o, b"y" * (1 + (o * 7) % 23)) for o in range(5, 60)]
    assert cut(recs, batch=batch, start=5, rows=4, nbytes=40) == cut(recs, batch=1000, start=5, rows=4, nbytes=40)


def rule_2(recs: list[Rec], rows: int, nbytes: int) -> list[tuple[int, ...]]:
    """Rule 2 written out record by record: the reference the builder is held to."""
    chunks: list[list[int]] = []
    open_: list[int] = []
    size = 0
    for r in recs:
        n = len(r.v or b"")
        if open_ and size + n > nbytes:
            chunks.append(open_)
            open_, size = [], 0
        open_.append(r.o)
        size += n
        if len(open_) >= rows:
            chunks.append(open_)
            open_, size = [], 0
    return [tuple(c) for c in chunks + ([open_] if open_ else [])]


@pytest.mark.parametrize("seed", range(25))
def test_chunks_follow_rule_2_whatever_the_batches_sizes_and_null_values(seed):
    rng = random.Random(seed)
    rows, nbytes = rng.randint(1, 9), rng.randint(1, 150)
    recs = [
        Rec("src", 0, o, None if rng.random() < 0.03 else b"z" * rng.choice([0, 1, 7, 30, 64, 200])) for o in range(400)
    ]
    b, got, i = builder(rows=rows, nbytes=nbytes), [], 0
    while i < len(recs):
        step = rng.randint(1, 50)
        got += b.add(recs, i, min(i + step, len(recs)))
        i += step
    last = b.flush()
    got += [last] if last else []
    assert [tuple(r.o for r in c.records) for c in got] == rule_2(recs, rows, nbytes)
    assert [c.bytes for c in got] == [sum(len(r.v or b"") for r in c.records) for c in got]
    assert (b.rows_read, b.bytes_read, b.next_offset) == (400, sum(len(r.v or b"") for r in recs), 400)


def test_offset_gaps_are_kept_and_stale_records_skipped():
    b = builder(start=10, rows=100)
    b.add(records([10, 11]))
    b.add(records([9, 11, 14]))  # 9 and 11 are stale deliveries: skipped
    chunk = b.flush()
    assert [r.o for r in chunk.records] == [10, 11, 14]
    assert (chunk.first_offset, chunk.next_offset, b.next_offset, b.rows_read) == (10, 15, 15, 3)


def test_add_takes_a_slice():
    b = builder(rows=100)
    recs = records([0, 1, 2, 3])
    assert b.add(recs, 1, 3) == []
    assert [r.o for r in b.flush().records] == [1, 2]


def test_flush_of_an_empty_chunk_is_none():
    b = builder()
    assert b.flush() is None
    b.add(records([0, 1, 2]))  # closed by rows
    assert b.flush() is None and b.chunks_cut == 1


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        builder(rows=0)


def test_cheap_record_checks():
    assert record_problem(None, json_objects=True).startswith("empty record")
    assert record_problem(b"", json_objects=False).startswith("empty record")
    assert record_problem(b"[1,2]", json_objects=True).startswith("not a JSON object")
    assert record_problem(b" {", json_objects=True).startswith("not a JSON object")
    assert record_problem(b"{", json_objects=True).startswith("not a JSON object")
    assert record_problem(b"  {}", json_objects=True) is None
    assert record_problem(b"1,2", json_objects=False) is None


def test_json_pre_check():
    assert json_problem(b'{"a":1}') is None
    assert json_problem(b'{"a":').startswith("malformed JSON")
    assert json_problem(b"[1]") == "not a JSON object but a list"


def test_a_chunk_ends_before_its_max_runs_plus_first_run_of_consecutive_offsets():
    every_other = list(range(0, 2 * MAX_RUNS + 10, 2))  # each record a run of its own
    b = builder(rows=10 * MAX_RUNS, nbytes=1 << 30)
    closed = b.add(records(every_other))
    assert [c.rows for c in closed] == [MAX_RUNS]
    assert closed[0].next_offset == every_other[MAX_RUNS - 1] + 1
    rest = b.flush()
    assert rest is not None and rest.first_offset == every_other[MAX_RUNS] and rest.rows == 5


def test_runs_are_counted_across_poll_batches_and_the_same_records_cut_the_same_chunks():
    offsets = [o for o in range(4 * MAX_RUNS) if o % 3 != 2]  # runs of two
    whole, batched = builder(rows=10 * MAX_RUNS, nbytes=1 << 30), builder(rows=10 * MAX_RUNS, nbytes=1 << 30)
    cut_whole = [*whole.add(records(offsets)), whole.flush()]
    cut_batched = [c for i in range(0, len(offsets), 7) for c in batched.add(records(offsets[i : i + 7]))]
    cut_batched.append(batched.flush())
    assert [(c.first_offset, c.next_offset, c.rows) for c in cut_whole] == [
        (c.first_offset, c.next_offset, c.rows) for c in cut_batched
    ]
    assert cut_whole[0].rows == 2 * MAX_RUNS
