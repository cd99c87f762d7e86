"""``python -m benchmarks.stage_ddl``: what a txn's stage tables cost the server, table by table.

On one embedded ClickHouse endpoint, ``--tables`` targets (the demo's schema) get a txn's stage tables
through the coordinator's own ``StageSet``, ``--rounds`` times: create them (commit step 2), insert
``--rows`` rows into each (what participants do, for reference), publish them (commit step 7: one read,
a ``MOVE PARTITION`` each, one check they are empty) and drop them (one ``DROP TABLE a, b, ...``). For
comparison it also times renaming all of them in one ``RENAME TABLE`` statement, the statement a pool
of reused stage tables would run instead of the creates and the drop. Prints p50 per round and per
table. Measures; asserts nothing.

    PYTHONPATH=. .venv/bin/python -m benchmarks.stage_ddl --tables 10 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from benchmarks.console import console as bench_console
from cli.demo import TARGET_DDL
from clients.clickhouse import make_client
from coordinator.stage.sets import StageSet
from coordinator.stage.tables import StageTables
from embedded.stack import EmbeddedStack
from protocol import naming
from protocol.config.sections import ClickHouseSection

DATABASE, PIPELINE = "ddl", "bench"
STEPS = ("create", "insert", "publish", "drop", "rename all")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stage_ddl",
        description=__doc__.split("\n\n")[0],
        epilog="example: PYTHONPATH=. .venv/bin/python -m benchmarks.stage_ddl --tables 10 --rounds 5",
    )
    parser.add_argument("--tables", type=int, default=10, help="target tables, each with a stage table (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="txns timed (default 5)")
    parser.add_argument("--rows", type=int, default=1000, help="rows inserted into each stage table (default 1000)")
    args = parser.parse_args(argv)
    ms: dict[str, list[float]] = {step: [] for step in STEPS}
    with EmbeddedStack(Path(tempfile.mkdtemp(prefix="chtxn-bench-ddl-"))) as stack:
        stack.start_clickhouse()
        make_client(ClickHouseSection(url=stack.clickhouse.url, database="default")).command(
            f"CREATE DATABASE IF NOT EXISTS {DATABASE}"
        )
        client = make_client(ClickHouseSection(url=stack.clickhouse.url, database=DATABASE, target_table="t0"))
        targets = [f"t{i}" for i in range(args.tables)]
        for target in targets:
            client.command(TARGET_DDL.replace("demo.events", f"{DATABASE}.{target}"))
        stages = StageSet(
            {t: StageTables(client, database=DATABASE, target=t, pipeline=PIPELINE) for t in targets},
            coordinator="bench",
        )

        def timed(step: str, call: Callable[..., object], *args: object) -> None:
            started = time.perf_counter()
            call(*args)
            ms[step].append((time.perf_counter() - started) * 1000)

        for round_no in range(1, args.rounds + 1):
            txn = naming.txn_id(1, round_no)
            names = naming.txn_stages(targets, PIPELINE, txn)
            timed("create", stages.create, names)
            for name in naming.split_stages(names):
                body = f"(event_id, ts, _topic, _partition, _offset) SELECT number, now64(3), 't', 0, number FROM numbers({args.rows})"
                timed("insert", client.command, f"INSERT INTO {DATABASE}.{name} {body}")
            timed("publish", stages.publish, names, txn)
            renamed = ", ".join(f"{DATABASE}.{n} TO {DATABASE}.{n}_free" for n in naming.split_stages(names))
            timed("rename all", client.command, f"RENAME TABLE {renamed}")
            back = ", ".join(f"{DATABASE}.{n}_free TO {DATABASE}.{n}" for n in naming.split_stages(names))
            client.command(f"RENAME TABLE {back}")
            timed("drop", stages.drop, names)
    table = Table(title=f"a txn's stage tables over {args.tables} tables, {args.rounds} txns (ms, p50)")
    for column in ("step", "per txn", "per table"):
        table.add_column(column, justify="right")
    for step, values in ms.items():
        per_txn = statistics.median(values) * (args.tables if step == "insert" else 1)
        table.add_row(step, f"{per_txn:.1f}", f"{per_txn / args.tables:.1f}")
    bench_console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
