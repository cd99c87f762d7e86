"""The skew benchmark: how fast one busy partition moves while the others are idle.

    PYTHONPATH=. .venv/bin/python -m benchmarks.skew [--rows 12000] [--partitions 4]
        [--trigger 4000] [--interval 2.0] [--poll-batch N] [--reps 3]

On one ``EmbeddedStack``, for each repetition, two fresh pipelines (their own topic, database and
ledger) with ``transaction.size_trigger_rows = --trigger`` and ``transaction.interval_s =
--interval`` (and ``participant.poll_batch = --poll-batch`` when given), each read by an in-process coordinator and one participant task per partition:

- spread: ``--rows`` records spread evenly over ``--partitions`` partitions;
- skewed: the same number of records, all on partition 0.

The records are produced before the pipeline starts; the figure is the time from the start of the
coordinator and tasks until every row is in the target, and the rows/s that makes. It prints both
and their ratio (skewed time over spread time). It measures and reports; it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from embedded.stack import EmbeddedStack
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants, produce_values
from tests.pipelines import make_pipeline


class _Stack:
    """The addresses ``tests.pipelines.make_pipeline`` asks of a stack."""

    def __init__(self, stack: EmbeddedStack) -> None:
        self.kafka_bootstrap = stack.start_kafka().bootstrap
        self.clickhouse_url = stack.start_clickhouse().url


def run_once(stack: _Stack, work: Path, *, rows: int, partitions: int, settings: dict, skewed: bool) -> float:
    """Seconds from the pipeline's start until all ``rows`` are in the target."""
    pipeline = make_pipeline(
        stack, work, unique_name("skew" if skewed else "spread"), partitions=partitions, settings=settings
    )
    values = [json.dumps({"id": i, "user": f"u{i}", "amount": i / 2}).encode() for i in range(rows)]
    for p in range(partitions):
        produce_values(pipeline, p, values if skewed and p == 0 else [] if skewed else values[p::partitions])
    started = time.monotonic()
    with coordinator(pipeline), participants(pipeline, tasks=partitions):
        wait_until(lambda: pipeline.target_count() == rows, 300, "every row in the target", interval_s=0.05)
        return time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.skew", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=12_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--trigger", type=int, default=4_000, help="transaction.size_trigger_rows")
    parser.add_argument("--interval", type=float, default=2.0, help="transaction.interval_s")
    parser.add_argument("--poll-batch", type=int, default=0, help="participant.poll_batch (default: chtxn's own)")
    parser.add_argument("--reps", type=int, default=3, help="alternating pairs of runs (default 3)")
    args = parser.parse_args(argv)
    settings = {
        "transaction.size_trigger_rows": args.trigger,
        "transaction.interval_s": args.interval,
        **({"participant.poll_batch": args.poll_batch} if args.poll_batch else {}),
    }
    with tempfile.TemporaryDirectory(prefix="chtxn-skew-") as tmp:
        work = Path(tmp)
        embedded = EmbeddedStack(work / "stack")
        try:
            stack = _Stack(embedded)
            times: dict[str, list[float]] = {"spread": [], "skewed": []}
            for rep in range(args.reps):
                for kind in ("spread", "skewed") if rep % 2 == 0 else ("skewed", "spread"):
                    took = run_once(
                        stack,
                        work,
                        rows=args.rows,
                        partitions=args.partitions,
                        settings=settings,
                        skewed=kind == "skewed",
                    )
                    times[kind].append(took)
                    print(f"rep {rep + 1} {kind:>6}: {took:6.2f} s, {args.rows / took:8,.0f} rows/s", flush=True)
        finally:
            embedded.stop()
    spread, skewed = statistics.median(times["spread"]), statistics.median(times["skewed"])
    print(
        f"median spread {spread:.2f} s ({args.rows / spread:,.0f} rows/s), skewed {skewed:.2f} s "
        f"({args.rows / skewed:,.0f} rows/s): skewed takes {skewed / spread:.2f}x as long"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
