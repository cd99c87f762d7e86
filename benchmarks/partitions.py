"""The partitions benchmark: what one coordinator leader costs as the source partitions grow.

    .venv/bin/python -m benchmarks.partitions [--partitions 16,64,256] [--tasks 16,32,32]
        [--loads idle,busy] [--rate 2000] [--window 30] [--profile 256]

For every partition count and load, on one ``EmbeddedStack`` (a fresh pipeline per run: its own
topic, control topic, database and ledger):

1. ``chtxn coordinator`` runs as its own process (its CPU is read from ``/proc/<pid>/stat``,
   every thread of it included: the leader loop, its lease thread, librdkafka's threads);
2. ``benchmarks.fleet`` plays the participants in this process: the partitions round-robin over
   ``--tasks`` tasks, each heartbeating with its own sender id and answering START/END/ABORT;
3. idle: nothing is produced, every txn is an empty commit. Busy: ``benchmarks.producer`` (its own
   process) writes ``--rate`` events/s spread over every partition, and the fleet stages them;
4. after the ledger shows ``--warmup`` commits, the window of ``--window`` seconds is measured:
   coordinator CPU (total, and by thread: leader loop, librdkafka, other), txns/s and aborts and
   END -> commit point latency (ledger); END -> ACK-COMMIT, last WRITE-STATUS -> ACK-COMMIT (the
   coordinator's own part: verify, commit point, broadcast) and messages/s by kind, read back from
   the control topic.

``--profile P`` repeats the runs of partition count P with the coordinator under cProfile (its
main thread, which runs the leader loop; windows of at most 20 s) and prints the top functions; the
``.prof`` files stay in ``<--dir>/profiles``. Figures of profiled runs are kept apart (cProfile
slows the loop).

It prints a table and writes ``benchmarks/results/partitions-<UTC time>.json``. It measures and
reports; it asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import workload
from benchmarks.bench import RESULTS, git_state, write_results
from benchmarks.chtxn_run import REPO, stop, stop_on_sigterm
from benchmarks.console import console as bench_console
from benchmarks.fleet import Fleet, tasks_of
from benchmarks.partitions_report import RunFigures, figures, summary_line, table, threads_cpu, top_functions
from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from embedded.stack import EmbeddedStack
from protocol.config.parse import PipelineConfig, load_config
from protocol.messages import TopicPartition

#: Longest window of a profiled run (cProfile's figures need fewer txns than the table's).
PROFILED_WINDOW_S = 20.0

PIPELINE_TOML = """
[pipeline]
name = "{name}"
topics = ["{name}_events"]

[kafka]
bootstrap_servers = "{kafka}"

[clickhouse]
url = "{clickhouse}"
database = "{name}"
target_table = "events"

[transaction]
interval_s = {interval_s}

[coordinator]
id = "bench-coordinator"
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.partitions", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", default="16,64,256", help="source partition counts (default 16,64,256)")
    parser.add_argument(
        "--tasks",
        default="16,32,32",
        help="participant tasks per partition count, in the same order (default 16,32,32)",
    )
    parser.add_argument("--loads", default="idle,busy", help="idle, busy or both (default idle,busy)")
    parser.add_argument("--rate", type=float, default=2000.0, help="events/s of the busy load (default 2000)")
    parser.add_argument("--window", type=float, default=30.0, help="measured seconds per run (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="commits before the window opens (default 3)")
    parser.add_argument("--interval", type=float, default=1.0, help="transaction.interval_s (default 1.0)")
    parser.add_argument("--profile", default="", help="partition counts to run again under cProfile (e.g. 256)")
    parser.add_argument("--dir", default=".chtxn/bench-partitions", help="working directory (wiped at start)")
    parser.add_argument("--results", default=str(RESULTS), help="directory of the JSON results")
    args = parser.parse_args(argv)
    stop_on_sigterm()
    counts = [int(p) for p in args.partitions.split(",") if p]
    tasks = [int(t) for t in args.tasks.split(",") if t]
    loads = [load for load in args.loads.split(",") if load]
    profiled = [int(p) for p in args.profile.split(",") if p]
    if len(tasks) != len(counts) or any(n < 1 for n in counts + tasks) or not set(loads) <= {"idle", "busy"}:
        parser.error("--tasks needs one count per --partitions entry (each at least 1); --loads takes idle,busy")
    if not set(profiled) <= set(counts):
        parser.error("--profile takes partition counts that --partitions runs")

    console = bench_console()
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    (work / "profiles").mkdir()
    runs: list[RunFigures] = []
    profiles: list[RunFigures] = []
    with EmbeddedStack(work / "stack") as stack:
        for n, t in zip(counts, tasks):
            for load in loads:
                with console.status(f"{n} partitions, {t} tasks, {load}"):
                    runs.append(run_one(stack, work, args, n, t, load))
                console.print(summary_line(runs[-1]))
        for n in profiled:
            t = tasks[counts.index(n)]
            for load in loads:
                with console.status(f"{n} partitions, {t} tasks, {load}, under cProfile"):
                    profiles.append(run_one(stack, work, args, n, t, load, profile=True))
                console.print(summary_line(profiles[-1]))
    console.print(table(runs, f"one coordinator, interval_s {args.interval:g}, busy = {args.rate:,.0f} events/s"))
    tops = {}
    for run in profiles:
        key = f"{run.partitions}-{run.load}"
        tops[key] = top_functions(run.profile, 25)
        console.rule(
            f"cProfile of the leader loop, {run.partitions} partitions, {run.load} "
            f"({run.txns} txns in {run.window_s:.0f} s)"
        )
        console.print(tops[key], markup=False, highlight=False)
    document = {
        "benchmark": "partitions",
        "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.monotonic() - t0, 1),
        "git": git_state(),
        "settings": {
            "partitions": counts,
            "tasks": tasks,
            "loads": loads,
            "rate": args.rate,
            "window_s": args.window,
            "warmup_commits": args.warmup,
            "interval_s": args.interval,
        },
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
        },
        "runs": [r.flat() for r in runs],
        "profiled_runs": [r.flat() for r in profiles],
        "profiles": tops,
    }
    out = write_results(document, args.results, "partitions", started_at)
    console.print(
        f"wall time {document['wall_s']:.0f} s, load average {load_before[0]:.2f} before, "
        f"{os.getloadavg()[0]:.2f} after; results in {out}"
    )
    return 0


def run_one(
    stack: EmbeddedStack, work: Path, args: argparse.Namespace, n: int, tasks: int, load: str, *, profile: bool = False
) -> RunFigures:
    """One pipeline of ``n`` partitions under ``load``: set up, warm up, measure, stop, read back."""
    name = f"p{n}_{load}" + ("_prof" if profile else "")
    cfg = prepare(stack, work, name, n, args.interval)
    partitions = [TopicPartition(topic=cfg.pipeline.topics[0], partition=p) for p in range(n)]
    groups = tasks_of(partitions, tasks)
    logs = work / "logs"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    prof = work / "profiles" / f"{name}.prof"
    coordinator_argv = [
        sys.executable,
        *(["-m", "cProfile", "-o", str(prof)] if profile else []),
        "-m",
        "cli",
        "coordinator",
        "--config",
        str(work / f"{name}.toml"),
    ]
    producer = None
    procs: list[subprocess.Popen] = []
    outputs = []
    try:
        if load == "busy":
            outputs.append(open(logs / f"{name}-producer.log", "w"))  # noqa: SIM115 -- closed below
            producer = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.producer",
                    "--bootstrap",
                    cfg.kafka.bootstrap_servers,
                    "--topic",
                    cfg.pipeline.topics[0],
                    "--rate",
                    str(args.rate),
                    "--seconds",
                    "3600",
                ],
                cwd=REPO,
                env=env,
                stdout=outputs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(producer)
        with Fleet(cfg, groups, read_data=load == "busy") as fleet:
            outputs.append(open(logs / f"{name}-coordinator.log", "w"))  # noqa: SIM115 -- closed below
            coordinator = subprocess.Popen(
                coordinator_argv,
                cwd=REPO,
                env=env,
                stdout=outputs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            procs.append(coordinator)
            wait_for_commits(cfg, args.warmup + 1, coordinator, fleet)  # +1: the seal of take-over
            before, t0 = threads_cpu(coordinator.pid), time.time()
            deadline = time.monotonic() + (min(args.window, PROFILED_WINDOW_S) if profile else args.window)
            while time.monotonic() < deadline:
                fleet.check()
                if coordinator.poll() is not None:
                    raise RuntimeError(f"the coordinator exited (code {coordinator.returncode}); see {logs}")
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))  # polling period of the checks
            after, t1 = threads_cpu(coordinator.pid), time.time()
            stop(coordinator)  # SIGTERM: aborts the open txn, exits (and writes the profile)
        counts = fleet.counts
    finally:
        for proc in reversed(procs):
            stop(proc)
        for out in outputs:
            out.close()
    by_thread = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}
    return figures(cfg, n, len(groups), load, t0, t1, by_thread, counts, str(prof) if profile else "")


def prepare(stack: EmbeddedStack, work: Path, name: str, n: int, interval_s: float) -> PipelineConfig:
    """A fresh pipeline ``name``: config file, a source topic of ``n`` partitions, database, target, ledger."""
    path = work / f"{name}.toml"
    path.write_text(
        PIPELINE_TOML.format(
            name=name, kafka=stack.kafka_bootstrap, clickhouse=stack.clickhouse_url, interval_s=interval_s
        )
    )
    cfg = load_config(str(path), {})
    kafka_clients.create_topics(
        kafka_clients.admin(cfg), {cfg.pipeline.topics[0]: n, cfg.control_topic: 1, cfg.dead_letter_topic: 1}
    )
    client = make_client(cfg.clickhouse.__class__(url=cfg.clickhouse.url, database="default"))
    try:
        client.command(f"CREATE DATABASE IF NOT EXISTS {name}")
        client.command(workload.table_ddl("events").replace(f"{workload.DATABASE}.events", f"{name}.events"))
        LedgerStore(client, name, name).ensure_tables()
    finally:
        client.close()
    return cfg


def wait_for_commits(
    cfg: PipelineConfig, commits: int, coordinator: subprocess.Popen, fleet: Fleet, timeout_s: float = 180.0
) -> None:
    """Until the ledger's head is at slot ``commits`` or beyond."""
    client = make_client(cfg.clickhouse)
    deadline = time.monotonic() + timeout_s
    try:
        while LedgerStore(client, cfg.clickhouse.database, cfg.name).head()[0] < commits:
            fleet.check()
            if coordinator.poll() is not None:
                raise RuntimeError(
                    f"the coordinator of {cfg.name} exited (code {coordinator.returncode}) before its first commits"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cfg.name}: fewer than {commits} commits after {timeout_s:g} s")
            time.sleep(0.25)  # polling period of a progress check
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
