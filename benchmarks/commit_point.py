"""``python -m benchmarks.commit_point``: what one commit-point claim costs, ``token`` against ``keeper``.

On one embedded stack with a ZooKeeper (chDB with KeeperMap), a ledger of each commit point claims
``--claims`` consecutive slots, alternating, each claim timed (``LedgerStore.claim_commit``: for
``token`` the insert and the read-back; for ``keeper`` the key, the checkpoint read, the row and the read-back).
Prints p50 / p95 / max per commit point. Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from rich.table import Table

from benchmarks.console import console as bench_console
from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from embedded.stack import EmbeddedStack
from protocol.config.sections import ClickHouseSection
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange

POINTS = ("token", "keeper")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.commit_point", description=__doc__)
    parser.add_argument("--claims", type=int, default=300, help="slots claimed per commit point (default 300)")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {p: [] for p in POINTS}
    with EmbeddedStack(Path(tempfile.mkdtemp(prefix="chtxn-bench-claims-")), keeper=True) as stack:
        stack.start_clickhouse()
        section = ClickHouseSection(url=stack.clickhouse.url, database="default", target_table="events")
        stores = {p: LedgerStore(make_client(section), "default", f"bench_{p}", commit_point=p) for p in POINTS}
        for store in stores.values():
            store.ensure_tables()
        for seq in range(1, args.claims + 1):
            for point, store in stores.items():
                ranges = (PartitionRange(topic="t", partition=0, start=seq - 1, end=seq, rows=1),)
                row = LedgerRow(
                    pipeline=store.pipeline,
                    txn=f"e1_t{seq}",
                    event=LedgerEvent.COMMITTED,
                    epoch=1,
                    commit_seq=seq,
                    coordinator="bench",
                    stage_table=f"events__chtxn_bench__e1_t{seq}",
                    ranges=ranges,
                )
                started = time.perf_counter()
                assert store.claim_commit(row)
                times[point].append((time.perf_counter() - started) * 1000)
    table = Table(title=f"one claim_commit, {args.claims} slots per commit point (ms)")
    for column in ("commit point", "p50", "p95", "max"):
        table.add_column(column, justify="right")
    for point, ms in times.items():
        ordered = sorted(ms)
        p95 = ordered[int(0.95 * (len(ordered) - 1))]
        table.add_row(point, f"{statistics.median(ordered):.1f}", f"{p95:.1f}", f"{ordered[-1]:.1f}")
    bench_console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
