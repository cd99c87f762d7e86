"""What ``[schema]`` costs a participant per chunk: stager step 1.5's scan of the records' top-level
fields (``protocol.tables.schema_types.scan_fields``), on one chunk of the demo's JSON events, next to
building the chunk's insert body and, with ``--insert``, inserting it into an in-process chDB.

    .venv/bin/python -m benchmarks.schema_scan [--records 10000] [--reps 20] [--insert]

It measures (best of ``--reps``) and prints; it asserts nothing. With ``[schema]`` off the scan is
not run at all.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from cli.demo import events
from protocol.framing import frame
from protocol.tables.schema_types import scan_fields
from tests.records import Rec

DEMO_COLUMNS = ("event_id", "ts", "user_id", "session", "kind", "url", "amount", "country", "device")
DEMO_TABLE = (
    "CREATE TABLE events (event_id UInt64, ts String, user_id UInt32, session String, kind String, url String, "
    "amount Float64, country String, device String, _topic String, _partition Int32, _offset Int64) "
    "ENGINE = MergeTree ORDER BY _offset"
)


def best_ms(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--insert", action="store_true", help="also time the chunk's insert into chDB")
    args = parser.parse_args(argv)

    values = [value for _, value in events(args.records)]
    with_new = [value[:-1] + b',"plan":"pro"}' for value in values]  # a field the table lacks, in every record
    records = [Rec("events", 0, i, v) for i, v in enumerate(values)]
    known = {*DEMO_COLUMNS, "_topic", "_partition", "_offset"}
    figures = {
        "records": args.records,
        "bytes": sum(map(len, values)),
        "body_ms": best_ms(lambda: frame(records, "JSONEachRow"), args.reps),
        "scan_known_ms": best_ms(lambda: scan_fields(values, known), args.reps),
        "scan_new_field_ms": best_ms(lambda: scan_fields(with_new, known), args.reps),
    }
    if args.insert:
        from chdb import session

        db = session.Session()
        db.query(DEMO_TABLE)
        body = frame(records, "JSONEachRow").decode()
        figures["insert_ms"] = best_ms(lambda: db.query(f"INSERT INTO events FORMAT JSONEachRow {body}"), 5)
    figures = {k: round(v, 2) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
