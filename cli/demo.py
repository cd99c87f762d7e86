"""``chtxn demo``: the whole pipeline end to end on the embedded stack (what ``make demo`` runs).

Starts the embedded broker and ClickHouse, creates a 4-partition topic and a target table with
the metadata columns, produces realistic JSON events, runs a coordinator and the Spark
participant job, shows progress, then prints the transaction summary and the exactly-once
check (docs/architecture.md §11), and stops everything it started.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from clients.kafka import KafkaClientFactory
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from coordinator.verify import merged, verify_pipeline
from embedded.stack import EmbeddedStack
from protocol.config.parse import PipelineConfig, load_config
from protocol.errors import ChtxnError

TARGET_DDL = """
CREATE TABLE IF NOT EXISTS demo.events
(
    event_id UInt64,
    ts DateTime64(3, 'UTC'),
    user_id UInt32,
    session String,
    kind LowCardinality(String),
    url String,
    amount Float64,
    country LowCardinality(String),
    device LowCardinality(String),
    _topic LowCardinality(String),
    _partition Int32,
    _offset Int64
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (kind, ts, event_id)
"""

PIPELINE_TOML = """
[pipeline]
name = "demo"
topics = ["demo_events"]

[kafka]
bootstrap_servers = "{kafka}"

[clickhouse]
url = "{clickhouse}"
database = "demo"
target_table = "events"

[transaction]
interval_s = 1.0
size_trigger_rows = 50000
heartbeat_interval_s = 0.5
heartbeat_misses = 6

[participant]
chunk_rows = 20000
"""

KINDS = ("page_view",) * 6 + ("click",) * 3 + ("add_to_cart", "purchase", "signup")
COUNTRIES = ("DE", "US", "FR", "GB", "IN", "BR", "JP", "NL", "ES", "IT")
DEVICES = ("mobile", "desktop", "tablet")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole pipeline end to end on the embedded stack",
        description="Start the embedded stack, produce JSON events into a 4-partition topic, run a coordinator "
        "and the Spark participant job until every event is committed, then print the transactions and the "
        "exactly-once check. Everything started is stopped at the end.",
        epilog="Example: chtxn demo --events 200000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--events", type=int, default=200_000, help="events to produce (default 200000)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the demo topic (default 4)")
    parser.add_argument("--dir", default=".chtxn/demo", help="working directory for data and logs")
    parser.add_argument("--timeout", type=float, default=900, help="give up after this many seconds")
    parser.set_defaults(func=run)


def events(count: int, seed: int = 7):
    rng = random.Random(seed)
    start = time.time() - 3600
    for i in range(count):
        kind = rng.choice(KINDS)
        yield (
            i,
            json.dumps(
                {
                    "event_id": i,
                    "ts": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start + i * 0.018)) + f".{i % 1000:03d}",
                    "user_id": rng.randrange(1, 50_000),
                    "session": f"{rng.getrandbits(48):012x}",
                    "kind": kind,
                    "url": f"/products/{rng.randrange(1, 5000)}" if kind != "signup" else "/signup",
                    "amount": round(rng.uniform(3, 300), 2) if kind == "purchase" else 0.0,
                    "country": rng.choice(COUNTRIES),
                    "device": rng.choice(DEVICES),
                },
                separators=(",", ":"),
            ).encode(),
        )


def run(args: argparse.Namespace) -> int:
    console = Console(soft_wrap=not sys.stdout.isatty())  # in a pipe or a log, each line whole
    work = Path(args.dir).resolve()
    # The broker keeps its data in memory, so a ledger left from an earlier run would point at
    # offsets of topics that are gone: every demo starts from empty.
    shutil.rmtree(work / "stack", ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    with EmbeddedStack(work / "stack") as stack:
        console.print(f"[bold]embedded stack[/]: Kafka {stack.kafka_bootstrap}, ClickHouse {stack.clickhouse_url}")
        config_path = work / "pipeline.toml"
        config_path.write_text(PIPELINE_TOML.format(kafka=stack.kafka_bootstrap, clickhouse=stack.clickhouse_url))
        cfg = load_config(str(config_path), {})
        _prepare(cfg, args.partitions, console)
        produced = _produce(cfg, args.events, console)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        try:
            for name, argv in (
                ("coordinator", ["coordinator", "--config", str(config_path)]),
                ("participant", ["participant", "--config", str(config_path)]),
            ):
                log = open(work / f"{name}.log", "w")  # noqa: SIM115 -- closed with the process
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "cli", *argv],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
            elapsed = _follow(cfg, produced, procs, args.timeout, console, work)
        finally:
            for proc in procs:
                _stop(proc)
        console.print(
            f"[bold]wall time[/]: {produced:,} events committed {elapsed:.1f} s after start (Spark start-up included)"
        )
        _throughput(cfg, console)
        subprocess.run(
            [sys.executable, "-m", "cli", "txn", "list", "--config", str(config_path), "--limit", "12"],
            check=False,
            env={**os.environ, "COLUMNS": "200"},
        )
        ok = _verify(cfg, console)
    console.print("[bold]stopped[/]: coordinator, participant job and the embedded stack")
    return 0 if ok else 1


def _prepare(cfg: PipelineConfig, partitions: int, console: Console) -> None:
    admin = KafkaClientFactory(cfg).admin()
    kafka_clients.create_topics(
        admin, {cfg.pipeline.topics[0]: partitions, cfg.control_topic: 1, cfg.dead_letter_topic: 1}
    )
    client = make_client(msgspec.structs.replace(cfg.clickhouse, database="default"))
    client.command("CREATE DATABASE IF NOT EXISTS demo")
    client.command(TARGET_DDL)
    LedgerStore.of(cfg, client).ensure_tables()
    console.print(
        f"[bold]created[/]: topic {cfg.pipeline.topics[0]} ({partitions} partitions), "
        f"table demo.events with _topic/_partition/_offset, ledger demo.chtxn_ledger"
    )


def _produce(cfg: PipelineConfig, count: int, console: Console) -> int:
    producer = KafkaClientFactory(cfg).producer(**{"linger.ms": 20, "batch.size": 1_000_000})
    with Progress(
        TextColumn("producing events"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("produce", total=count)
        for i, value in events(count):
            while True:
                try:
                    producer.produce(cfg.pipeline.topics[0], value=value, key=str(i % 50_000).encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 5_000 == 4_999:
                producer.poll(0)
                progress.update(task, completed=i + 1)
        if producer.flush(60) > 0:
            raise ChtxnError("the demo's events were not all delivered to the broker within 60 s")
        progress.update(task, completed=count)
    return count


def _follow(
    cfg: PipelineConfig, produced: int, procs: list[subprocess.Popen], timeout: float, console: Console, work: Path
) -> float:
    client = make_client(cfg.clickhouse)
    started = time.monotonic()
    with Progress(
        TextColumn("rows committed"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rate]}"),
        console=console,
    ) as progress:
        task = progress.add_task("commit", total=produced, rate="")
        committed = 0
        while committed < produced:
            for proc, name in zip(procs, ("coordinator", "participant")):
                if proc.poll() is not None:
                    tail = (work / f"{name}.log").read_text()[-3000:]
                    raise ChtxnError(f"the {name} exited with code {proc.returncode}:\n{tail}")
            if time.monotonic() - started > timeout:
                raise ChtxnError(
                    f"only {committed:,} of {produced:,} rows committed after {timeout:g} s; logs in {work}"
                )
            committed = int(client.command("SELECT count() FROM demo.events"))  # type: ignore[arg-type]  # count(): an int
            elapsed = time.monotonic() - started
            progress.update(task, completed=committed, rate=f"{committed / elapsed:,.0f} rows/s")
            time.sleep(0.5)  # a progress display's refresh period, not a synchronisation
    return time.monotonic() - started


def _throughput(cfg: PipelineConfig, console: Console) -> None:
    """Steady-state figures from the ledger: first data txn's START to the last commit."""
    ledger = LedgerHistory(make_client(cfg.clickhouse), cfg.clickhouse.database, cfg.name)
    data = [t for t in ledger.history(limit=10_000, state="PUBLISHED") if t.total_rows]
    if not data:
        return
    first = min(t.started_at for t in data)
    last = max(t.committed_at for t in data)
    rows = sum(t.total_rows for t in data)
    commit_ms = sorted(t.commit_ms for t in data if t.commit_ms is not None)
    p50 = commit_ms[len(commit_ms) // 2] if commit_ms else float("nan")
    console.print(
        f"[bold]throughput[/]: {rows:,} rows in {len(data)} transactions over {last - first:.2f} s "
        f"= [bold]{rows / max(last - first, 1e-9):,.0f} rows/s[/] (first START to last commit); "
        f"commit latency END->commit p50 {p50:.0f} ms"
    )


def _verify(cfg: PipelineConfig, console: Console) -> bool:
    client = make_client(cfg.clickhouse)
    ledger = LedgerHistory(client, cfg.clickhouse.database, cfg.name)
    report = merged(verify_pipeline(client, cfg, ledger))  # what chtxn verify --deep checks
    for check in report.partitions:
        console.print(
            f"  {check.topic}-{check.partition}: offsets [{check.committed_from}, {check.committed_to}) "
            f"-> {check.rows:,} rows, {check.duplicates} duplicates, {check.outside} outside"
        )
    if report.ok:
        console.print(
            f"[bold green]exactly-once check passed[/]: {report.rows_in_target:,} rows, every committed "
            "offset exactly once, nothing else"
        )
    else:
        for anomaly in report.anomalies:
            console.print(f"[red]anomaly[/]: {anomaly}")
        console.print("[bold red]exactly-once check FAILED[/]")
    return report.ok


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
