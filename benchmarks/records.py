"""Python per record in a participant, against the plain loop's: ``python -m benchmarks.records``.

Times, on demo events as real ``confluent_kafka.Message`` objects of one partition (no broker, no
ClickHouse), each step a participant takes per record, in µs per record (best of 3):
``ChunkBuilder.add`` over poll batches, the bad-record ``precheck``, ``has_joins`` on the body,
``protocol.framing.frame`` with the metadata insert's statement (which the plain loop shares), and
what clickhouse-connect's ``command()`` does with the body before it sends it (as bytes, and as
``clients.clickhouse.InsertBody``), next to the plain loop's own per-record bookkeeping. It
measures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import cast

import confluent_kafka
from clickhouse_connect.driver._backend.httpcommon import _request_is_read_only

from cli.demo import events
from clients.clickhouse import InsertBody
from participant.bad_records import has_joins, precheck
from protocol.chunking import Chunk, ChunkBuilder, RecordLike
from protocol.framing import METADATA_COLUMNS, Column, MetadataInsert, frame


def best_us_per_record(step: Callable[[], object], records: int, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return min(times) / records * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="example: python -m benchmarks.records --records 250000 --chunk-rows 15000",
    )
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--poll-batch", type=int, default=5_000)
    ap.add_argument("--chunk-rows", type=int, default=15_000)
    args = ap.parse_args(argv)
    n = args.records
    msgs = [confluent_kafka.Message(topic="events", partition=0, offset=i, value=v) for i, v in events(n)]
    batches = [msgs[i : i + args.poll_batch] for i in range(0, n, args.poll_batch)]
    record_batches = cast("list[list[RecordLike]]", batches)  # Messages with topic, partition and offset
    chunks: list[Chunk] = []
    bodies: list[bytes] = []
    insert = MetadataInsert(
        "bench", "events", [Column(c, "String") for c in ("payload", *METADATA_COLUMNS)], "JSONEachRow"
    )

    def cut() -> None:
        chunks.clear()
        b = ChunkBuilder(
            pipeline="bench",
            txn="e1_t1",
            topic="events",
            partition=0,
            start_offset=0,
            chunk_rows=args.chunk_rows,
            chunk_bytes=64 << 20,
        )
        for batch in record_batches:
            chunks.extend(b.add(batch))
        last = b.flush()
        chunks.extend([last] if last else [])

    def check() -> None:
        for c in chunks:
            precheck(c.records, json_objects=True)

    def body() -> None:
        bodies[:] = [frame(c.records, "JSONEachRow") for c in chunks if insert.statement("events", 0, c.records)]

    def joins() -> None:
        for c, b in zip(chunks, bodies):
            has_joins(b, c.rows)

    def handed_over(wrap: Callable[[bytes], bytes]) -> Callable[[], None]:
        def step() -> None:  # what clickhouse-connect's command() does with the body before it sends it
            for b in bodies:
                _request_is_read_only(wrap(b), {"query": insert.head})

        return step

    def plain_loop() -> None:  # benchmarks/plain.py: error check, then per partition lists
        pending: dict[int, list] = {0: []}
        for batch in batches:
            for m in batch:
                if m.error() is not None:
                    raise RuntimeError(m.error())
                pending[m.partition()].append(m)  # type: ignore[index]  # None only on an error record

    steps = [
        ("chunk builder (participant)", cut),
        ("precheck (participant)", check),
        ("body (both)", body),
        ("has_joins (participant)", joins),
        ("body handed to command(), as bytes", handed_over(bytes)),
        ("body handed to command(), InsertBody (both)", handed_over(InsertBody)),
        ("per-record bookkeeping (plain loop)", plain_loop),
    ]
    print(f"{n:,} records, poll batches of {args.poll_batch:,}, chunks of {args.chunk_rows:,} rows")
    for name, step in steps:
        print(f"{name:46s} {best_us_per_record(step, n):6.3f} µs/record")


if __name__ == "__main__":
    main()
