"""``python -m tests.soak --seed S --duration D``: one randomized soak on a fresh embedded stack.

Prints the report, writes it as JSON to ``tests/soak/results/<UTC time>-seed<S>.json``, and exits
1 when the exactly-once oracle or ``chtxn verify --deep`` fails, when anything was stuck, or when
the harness itself failed; 0 otherwise. Real servers named by ``CHTXN_TEST_KAFKA`` and
``CHTXN_TEST_CLICKHOUSE_URL`` take the place of the embedded stack, as in the tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tests.conftest import TestStack
from tests.soak.runner import run_soak

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the fault schedule (default 1)")
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of faults and traffic (default 600)")
    parser.add_argument("--partitions", type=int, default=2, help="source partitions, one Spark slot each (default 2)")
    parser.add_argument("--rate", type=float, default=200.0, help="records per second produced (default 200)")
    parser.add_argument(
        "--stuck-after",
        type=float,
        default=60.0,
        help="seconds without a commit outside faults that count as stuck (default 60)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs, config and the embedded stack's data (default: a new directory under the system temp directory)",
    )
    parser.add_argument(
        "--commit-point",
        choices=("token", "keeper"),
        default="token",
        help="ledger.commit_point of the pipeline; keeper adds a ZooKeeper and its restarts as a fault",
    )
    parser.add_argument(
        "--changes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the operator's changes among the faults: topic re-created, route moved and removed, reset races, "
        "a rolling commit-point switch, dead letters expired (default on; adds a ZooKeeper)",
    )
    parser.add_argument(
        "--only",
        default="",
        metavar="KIND,...",
        help="inject only these fault kinds (e.g. topic-recreate,reset-race), to replay one kind",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help=f"where the JSON report goes (default {RESULTS})")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"chtxn-soak-seed{args.seed}-"))
    console = Console(width=200)
    console.print(f"soak seed {args.seed}, {args.duration:g}s; logs in {workdir}/logs", soft_wrap=True)
    stack = TestStack(workdir / "embedded", keeper=args.commit_point == "keeper" or args.changes)
    started = time.monotonic()
    try:
        result = run_soak(
            stack,
            workdir,
            seed=args.seed,
            duration_s=args.duration,
            partitions=args.partitions,
            rate=args.rate,
            stuck_after_s=args.stuck_after,
            commit_point=args.commit_point,
            changes=args.changes,
            only=tuple(filter(None, args.only.split(","))),
        )
    finally:
        stack.stop()
    result.print(console)
    path = result.write(args.results)
    console.print(f"report: {path} ({time.monotonic() - started:.0f}s in all)", soft_wrap=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
