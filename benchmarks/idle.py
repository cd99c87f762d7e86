"""``python -m benchmarks.idle``: what a running pipeline costs when it has nothing to read.

On a fresh ``EmbeddedStack``: the demo's topic (``--partitions``), ``chtxn coordinator`` and
``chtxn participant`` (Spark) as ``make bench`` runs them, a first ``--events`` events published
so that every process is past its start-up, then ``--seconds`` of nothing to read. Over that
window it reports:

- CPU by component (``benchmarks.cpu``), as a share of one core, and for the coordinator's and
  the participants' processes by thread: the main thread (the leader's or a task's loop),
  librdkafka's, the others (``benchmarks.partitions_report.threads_cpu``);
- the txns the coordinator committed (empty ones: one every ``transaction.idle_interval_s``, or every
  ``transaction.interval_s`` with ``--idle-interval 0``);
- ClickHouse's CPU by statement (``benchmarks.ch_profile``), per txn.

This is the pipeline's fixed cost: its control plane (control-topic fetches, heartbeats, the
ledger, each txn's statements) before it moves a row. Under load the same work goes on beside the
rows, so at R rows/s it adds ``share of a core / R * 100,000`` CPU seconds per 100k rows to what
``make bench`` measures. Measures; asserts nothing. Writes ``<--results>/idle-<UTC time>.json``.

    PYTHONPATH=. .venv/bin/python -m benchmarks.idle --seconds 30
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.table import Table

from benchmarks import ch_profile, cpu, workload
from benchmarks.bench import RESULTS, cpu_probe, git_state, machine, write_results
from benchmarks.chtxn_run import Pipeline, ledger_history, stop_on_sigterm
from benchmarks.console import console as bench_console
from benchmarks.partitions_report import threads_cpu
from clients.clickhouse import make_client
from embedded.stack import EmbeddedStack
from protocol.config.sections import ParticipantSection, TransactionSection

#: The components whose processes are broken down by thread.
LOOPING = ("coordinator", "participant python")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.idle",
        description=__doc__.split("\n\n")[0],
        epilog="example: PYTHONPATH=. .venv/bin/python -m benchmarks.idle --seconds 30",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="the idle window measured (default 30)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the source topic (default 4)")
    parser.add_argument("--events", type=int, default=10_000, help="events published before the window (default 10000)")
    parser.add_argument(
        "--interval",
        type=float,
        default=TransactionSection().interval_s,
        help="transaction.interval_s (default: chtxn's default)",
    )
    parser.add_argument(
        "--idle-interval",
        type=float,
        default=TransactionSection().idle_interval_s,
        help="transaction.idle_interval_s (default: chtxn's default; 0: an empty txn every --interval)",
    )
    parser.add_argument("--dir", default=".chtxn/bench-idle", help="working directory, emptied first")
    parser.add_argument("--results", default=str(RESULTS), help="directory of the JSON results")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up publishing --events after this")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    console = bench_console()
    started_at = datetime.now(timezone.utc)
    load_before, probe_before = os.getloadavg(), cpu_probe()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    with EmbeddedStack(work / "stack") as stack:
        cfg = workload.write_config(
            work / "pipeline.toml",
            kafka=stack.kafka_bootstrap,
            clickhouse=stack.clickhouse_url,
            interval_s=args.interval,
            idle_interval_s=args.idle_interval,
            size_trigger_rows=TransactionSection().size_trigger_rows,
            chunk_rows=ParticipantSection().chunk_rows,
        )
        workload.prepare(cfg, args.partitions)
        workload.produce(cfg, args.events)
        with Pipeline(work / "pipeline.toml", work / "logs") as pipeline:
            with console.status(f"publishing the first {args.events:,} events"):
                pipeline.wait_for_rows(cfg, args.events, time.monotonic() + args.timeout)
                workload.settle(cfg)
            with console.status(f"measuring {args.seconds:.0f} s with nothing to read"):
                before, since = cpu.snapshot(), time.time()
                threads_before = {pid: threads_of(pid) for pid in looping(before)}
                time.sleep(args.seconds)  # the measured window itself
                after, until = cpu.snapshot(), time.time()
                used = cpu.used(before, after)
                by_thread = {
                    f"{before[pid][0]} {pid}": spent(threads_before[pid], threads_of(pid), until - since)
                    for pid in threads_before
                    if pid in after
                }
            pipeline.check()
        client = make_client(cfg.clickhouse)
        try:
            lines = ch_profile.profile(client, since, until)
        finally:
            client.close()
        txns = [t for t in ledger_history(cfg) if t.committed_at and since <= t.committed_at <= until]
    window = until - since
    figures = {
        "window_s": round(window, 2),
        "txns": len(txns),
        "rows_in_window": sum(t.total_rows for t in txns),
        "cores_by_component": {k: round(v / window, 4) for k, v in sorted(used.items(), key=lambda kv: -kv[1])},
        "cores": round(sum(v for k, v in used.items() if k != "other") / window, 4),
        "cores_by_thread": {name: threads for name, threads in by_thread.items() if sum(threads.values()) > 0.001},
        "clickhouse_by_statement": [
            {"kind": ln.kind, "statement": ln.shape, "count": ln.count, "cpu_s": round(ln.cpu_s, 4)} for ln in lines
        ],
    }
    console.print(components_table(figures))
    console.print(threads_table(figures))
    console.print(statements_table(figures))
    document = {
        "benchmark": "idle",
        "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": git_state(),
        "settings": {
            "seconds": args.seconds,
            "partitions": args.partitions,
            "interval_s": args.interval,
            "idle_interval_s": args.idle_interval,
        },
        "machine": machine(load_before, os.getloadavg(), probe_before, cpu_probe()),
        "figures": figures,
    }
    out = write_results(document, args.results, "idle", started_at)
    console.print(f"results in {out}")
    return 0


def components_table(figures: dict) -> Table:
    table = Table(title=f"idle for {figures['window_s']:.0f} s, {figures['txns']} txns")
    table.add_column("component")
    table.add_column("share of a core", justify="right")
    for component, cores in figures["cores_by_component"].items():
        table.add_row(component, f"{cores:.1%}")
    table.add_row("every component but other", f"{figures['cores']:.1%}", end_section=True)
    return table


def looping(snapshot: dict[int, tuple[str, float]]) -> list[int]:
    """The processes of the coordinator and the participants (the Spark driver, the task workers)."""
    return [pid for pid, (component, _) in snapshot.items() if component in LOOPING]


def threads_of(pid: int) -> dict[str, float]:
    """``threads_cpu(pid)``, or nothing when the process has gone."""
    try:
        return threads_cpu(pid)
    except OSError:
        return {}


def spent(before: dict[str, float], after: dict[str, float], window: float) -> dict[str, float]:
    """Share of a core by kind of thread over ``window`` seconds (``threads_cpu``'s kinds; its
    ``leader loop`` is any process's main thread)."""
    names = {"leader loop": "main thread"}
    return {names.get(k, k): round((after.get(k, 0.0) - before.get(k, 0.0)) / window, 4) for k in after}


def threads_table(figures: dict) -> Table:
    table = Table(title="the pipeline's own processes, by thread (share of a core)")
    for column in ("process", "main thread", "librdkafka", "other threads"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for name, threads in figures["cores_by_thread"].items():
        table.add_row(name, *(f"{threads.get(k, 0.0):.1%}" for k in ("main thread", "librdkafka", "other")))
    return table


def statements_table(figures: dict, top: int = 12) -> Table:
    txns = max(1, figures["txns"])
    table = Table(title="ClickHouse's CPU by statement and merge over the idle window (system.query_log, part_log)")
    for column, justify in (
        ("kind", "left"),
        ("statement or merged table", "left"),
        ("per txn", "right"),
        ("ms CPU per txn", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]  # "left" and "right": rich's JustifyMethod
    lines = figures["clickhouse_by_statement"]
    for line in lines[:top]:
        table.add_row(
            line["kind"], line["statement"], f"{line['count'] / txns:.1f}", f"{1000 * line['cpu_s'] / txns:.1f}"
        )
    rest = lines[top:]
    if rest:
        count, cpu_s = sum(ln["count"] for ln in rest), sum(ln["cpu_s"] for ln in rest)
        table.add_row("", "every other line", f"{count / txns:.1f}", f"{1000 * cpu_s / txns:.1f}")
    total = sum(ln["cpu_s"] for ln in lines)
    table.add_row("", "all", f"{sum(ln['count'] for ln in lines) / txns:.1f}", f"{1000 * total / txns:.1f}")
    return table


if __name__ == "__main__":
    raise SystemExit(main())
