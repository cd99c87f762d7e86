"""The tables benchmark: what one txn across many tables (``[[route]]``) costs as the tables grow.

    .venv/bin/python -m benchmarks.tables [--tables 1,10,50] [--rate 4000] [--window 30]

For every table count N, on one ``EmbeddedStack`` (a fresh pipeline per run): N routes, each a topic
of 4 partitions into a table of its own; ``benchmarks.producer`` writes ``--rate`` events/s in all,
round-robin over the N topics (the same total rate for every N); ``benchmarks.fleet`` plays the
participants (``--tasks`` tasks) and stages each partition's records into its table's stage table;
``chtxn coordinator`` runs as its own process. After ``--warmup`` commits, ``--window`` seconds are
measured, as ``benchmarks.partitions`` measures them: END -> commit point p50/p95 (ledger), the
coordinator's CPU per txn, txns and rows per second; and ClickHouse statements per txn, from the
server's ``Query`` event counter (``system.events``) less the fleet's inserts and this process's
two reads of it: every other statement in the window is the coordinator's.

It prints a table and writes ``benchmarks/results/tables-<UTC time>.json``. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.table import Table

from benchmarks import workload
from benchmarks.bench import RESULTS, git_state, write_results
from benchmarks.chtxn_run import REPO, stop, stop_on_sigterm
from benchmarks.console import console as bench_console
from benchmarks.fleet import Fleet, tasks_of
from benchmarks.partitions import wait_for_commits
from benchmarks.partitions_report import RunFigures, figures, threads_cpu
from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from embedded.stack import EmbeddedStack
from protocol.config.parse import PipelineConfig, load_config
from protocol.messages import TopicPartition

PARTITIONS_PER_TABLE = 4

PIPELINE_TOML = """
[pipeline]
name = "{name}"

[kafka]
bootstrap_servers = "{kafka}"

[clickhouse]
url = "{clickhouse}"
database = "{name}"

[transaction]
interval_s = {interval_s}

[coordinator]
id = "bench-coordinator"
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", default="1,10,50", help="table counts (default 1,10,50)")
    parser.add_argument("--tasks", type=int, default=8, help="participant tasks (default 8)")
    parser.add_argument("--rate", type=float, default=4000.0, help="events/s over all topics (default 4000)")
    parser.add_argument("--window", type=float, default=30.0, help="measured seconds per run (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="commits before the window opens (default 3)")
    parser.add_argument("--interval", type=float, default=1.0, help="transaction.interval_s (default 1.0)")
    parser.add_argument(
        "--one-table",
        action="store_true",
        help="the control: the same N topics, all routed to one table (what the partitions cost, without the tables)",
    )
    parser.add_argument(
        "--per-partition",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the fleet inserts each partition's records on their own, as a participant's chunks are "
        "(the default); --no-per-partition: one insert per task and table, fewer inserts than chtxn makes",
    )
    parser.add_argument("--dir", default=".chtxn/bench-tables", help="working directory (wiped at start)")
    parser.add_argument("--results", default=str(RESULTS), help="directory of the JSON results")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    counts = [int(n) for n in args.tables.split(",") if n]
    console = bench_console()
    started_at = datetime.now(timezone.utc)
    t0, load_before = time.monotonic(), os.getloadavg()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    runs: list[tuple[RunFigures, float]] = []
    with EmbeddedStack(work / "stack") as stack:
        for n in counts:
            with console.status(f"{n} tables"):
                runs.append(run_one(stack, work, args, n))
            console.print(line(*runs[-1]))
    console.print(table(runs, args))
    document = {
        "benchmark": "tables",
        "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.monotonic() - t0, 1),
        "git": git_state(),
        "settings": {
            k: getattr(args, k)
            for k in ("tables", "tasks", "rate", "window", "warmup", "interval", "one_table", "per_partition")
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        "runs": [
            {
                **run.flat(),
                "topics": run.partitions // PARTITIONS_PER_TABLE,
                "tables": 1 if args.one_table else run.partitions // PARTITIONS_PER_TABLE,
                "statements_per_txn": s,
            }
            for run, s in runs
        ],
    }
    out = write_results(document, args.results, "tables", started_at)
    console.print(f"wall time {document['wall_s']:.0f} s; results in {out}")
    return 0


def run_one(stack: EmbeddedStack, work: Path, args: argparse.Namespace, n: int) -> tuple[RunFigures, float]:
    """One pipeline of ``n`` tables under the paced load: set up, warm up, measure, stop, read back."""
    name = f"t{n}"
    cfg = prepare(stack, work, name, n, args.interval, one_table=args.one_table)
    topics = [f"{name}_src{i}" for i in range(n)]
    partitions = [TopicPartition(topic=t, partition=p) for t in topics for p in range(PARTITIONS_PER_TABLE)]
    groups = tasks_of(partitions, args.tasks)
    logs = work / "logs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    procs: list[subprocess.Popen] = []
    outputs = []
    server = make_client(cfg.clickhouse)
    try:
        outputs.append(open(logs / f"{name}-producer.log", "w"))  # noqa: SIM115 -- closed below
        argv = ["-m", "benchmarks.producer", "--bootstrap", cfg.kafka.bootstrap_servers, "--topic", ",".join(topics)]
        procs.append(
            subprocess.Popen(
                [sys.executable, *argv, "--rate", str(args.rate), "--seconds", "3600"],
                cwd=REPO,
                env=env,
                stdout=outputs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
        with Fleet(cfg, groups, read_data=True, per_partition=args.per_partition) as fleet:
            outputs.append(open(logs / f"{name}-coordinator.log", "w"))  # noqa: SIM115 -- closed below
            coordinator = subprocess.Popen(
                [sys.executable, "-m", "cli", "coordinator", "--config", str(work / f"{name}.toml")],
                cwd=REPO,
                env=env,
                stdout=outputs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(coordinator)
            wait_for_commits(cfg, args.warmup + 1, coordinator, fleet)
            queries0, inserts0 = _queries(server), fleet.counts.inserts
            before, t0 = threads_cpu(coordinator.pid), time.time()
            deadline = time.monotonic() + args.window
            while time.monotonic() < deadline:
                fleet.check()
                if coordinator.poll() is not None:
                    raise RuntimeError(f"the coordinator exited (code {coordinator.returncode}); see {logs}")
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # polling period of the checks
            after, t1 = threads_cpu(coordinator.pid), time.time()
            statements = _queries(server) - queries0 - (fleet.counts.inserts - inserts0) - 1
            stop(coordinator)
        counts = fleet.counts
    finally:
        server.close()
        for proc in reversed(procs):
            stop(proc)
        for out in outputs:
            out.close()
    by_thread = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}
    run = figures(cfg, len(partitions), len(groups), "busy", t0, t1, by_thread, counts, "")
    return run, statements / run.txns if run.txns else float("nan")


def _queries(client: object) -> int:
    """The server's count of statements run so far (``system.events``, event ``Query``)."""
    return int(client.command("SELECT value FROM system.events WHERE event = 'Query'"))  # type: ignore[attr-defined]


def prepare(
    stack: EmbeddedStack, work: Path, name: str, n: int, interval_s: float, *, one_table: bool = False
) -> PipelineConfig:
    """A fresh pipeline ``name`` of ``n`` routes (``one_table``: one route of the ``n`` topics): topics,
    database, tables, ledger, config file."""
    if one_table:
        topics_list = ", ".join(f'"{name}_src{i}"' for i in range(n))
        routes = f'\n[[route]]\ntopics = [{topics_list}]\ntable = "events0"\n'
    else:
        routes = "".join(f'\n[[route]]\ntopics = ["{name}_src{i}"]\ntable = "events{i}"\n' for i in range(n))
    path = work / f"{name}.toml"
    path.write_text(
        PIPELINE_TOML.format(
            name=name, kafka=stack.kafka_bootstrap, clickhouse=stack.clickhouse_url, interval_s=interval_s
        )
        + routes
    )
    cfg = load_config(str(path), {})
    topics = {f"{name}_src{i}": PARTITIONS_PER_TABLE for i in range(n)}
    kafka_clients.create_topics(kafka_clients.admin(cfg), {**topics, cfg.control_topic: 1, cfg.dead_letter_topic: 1})
    client = make_client(cfg.clickhouse.__class__(url=cfg.clickhouse.url, database="default"))
    try:
        client.command(f"CREATE DATABASE IF NOT EXISTS {name}")
        for table_name in cfg.tables:
            client.command(workload.table_ddl("events").replace(f"{workload.DATABASE}.events", f"{name}.{table_name}"))
        LedgerStore(client, name, name).ensure_tables()
    finally:
        client.close()
    return cfg


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def line(run: RunFigures, statements: float) -> str:
    return (
        f"{run.partitions // PARTITIONS_PER_TABLE} topics: {run.txns} txns, {run.rows / run.window_s:,.0f} rows/s, "
        f"END->commit p50 {_pct(run.commit_ms, 50):.0f} ms p95 {_pct(run.commit_ms, 95):.0f} ms, "
        f"{run.cpu_ms_per_txn or 0:.0f} ms CPU/txn, {statements:.1f} statements/txn, {run.aborts} aborts"
    )


def table(runs: list[tuple[RunFigures, float]], args: argparse.Namespace) -> Table:
    into = "all into one table" if args.one_table else "each into a table of its own"
    t = Table(title=f"N topics of {PARTITIONS_PER_TABLE} partitions, {into}, {args.rate:,.0f} events/s in all")
    for header in ("topics", "txns/s", "rows/s", "END->commit p50", "p95", "coord CPU/txn", "statements/txn", "aborts"):
        t.add_column(header, justify="right")
    for run, statements in runs:
        t.add_row(
            str(run.partitions // PARTITIONS_PER_TABLE),
            f"{run.txns_per_s:.2f}",
            f"{run.rows / run.window_s:,.0f}",
            f"{_pct(run.commit_ms, 50):.0f} ms",
            f"{_pct(run.commit_ms, 95):.0f} ms",
            f"{run.cpu_ms_per_txn or 0:.0f} ms",
            f"{statements:.1f}",
            str(run.aborts),
        )
    return t


if __name__ == "__main__":
    raise SystemExit(main())
