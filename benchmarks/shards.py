"""The shards benchmark: what a sharded ClickHouse (``clickhouse.shards``) costs as the shards grow.

    PYTHONPATH=. .venv/bin/python -m benchmarks.shards [--shards 1,2,4] [--events 1000000] [--partitions 8]
        [--placement NAME] [--interval 1.0] [--results benchmarks/results]

For every shard count N, on a fresh ``EmbeddedStack`` and N - 1 more embedded endpoints
(``tests.sharded.more_shards``; the stack's endpoint is shard 1 and holds the ledger): the same
``--events`` of the demo's JSON events (``benchmarks.workload``) in a topic of ``--partitions``
partitions, the target table on every shard, ``clickhouse.shards`` naming the N endpoints (one shard
too, so every run takes the sharded code path); then a coordinator and the ``chtxn participant``
Spark job (``benchmarks.chtxn_run.Pipeline``): the product's own participant, whose stagers put each
partition's chunks on its shard (``participant.shard_stagers``). A run ends once the union of the
shards holds every event. ``--placement`` is passed on as ``clickhouse.placement`` when given.

The figures, over the data txns (``benchmarks.chtxn_run.figures``): END -> commit point p50/p95 and
steady rows/s from the ledger; CPU per row from ``/proc`` (``benchmarks.cpu``) for the participants
(the Spark JVM and its Python workers), the coordinator, the broker and each shard's endpoint apart
(by its pid); and per shard the server's ``Query`` and ``InsertQuery`` event counters
(``system.events``, as ``benchmarks.tables`` reads them) per txn started in that span, less this
process's own polls (each shard answers one statement per poll, whose cost on the counter is measured
before the run). Rows on a shard other than the one ``protocol.shards.shard_of`` names are counted
(with the default placement). Each figure is also given relative to the first shard count.

On a 2-core machine the shards share the cores with everything else: the ratios say what sharding
costs here, not what it gains on servers of their own. It prints a table and writes
``benchmarks/results/shards-<UTC time>.json``. It asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import msgspec
from rich.table import Table

from benchmarks import chtxn_run, cpu, workload
from benchmarks.bench import NOT_MEASURED, RESULTS, cpu_probe, git_state, machine, write_results
from benchmarks.console import console as bench_console
from benchmarks.summary import percentile
from clients.clickhouse import make_client
from embedded.stack import EmbeddedStack
from protocol import shards as shard_rules
from protocol.config.parse import PipelineConfig, load_config
from protocol.config.sections import TransactionSection
from protocol.errors import ChtxnError
from tests.sharded import more_shards

#: What the participants' CPU is (``benchmarks.cpu``'s components): the job's launcher is left out.
PARTICIPANTS = ("spark jvm", "participant python")
#: One statement per shard and poll: its event counters and the target's rows.
POLL = (
    "SELECT sumIf(value, event = 'Query'), sumIf(value, event = 'InsertQuery'), "
    f"(SELECT count() FROM {workload.DATABASE}.{workload.TARGET}) FROM system.events"
)


@dataclass(frozen=True)
class Poll:
    """One look at every shard: unix time, CPU snapshot, and per shard (Query, InsertQuery, target rows)."""

    at: float
    cpu: dict[int, tuple[str, float]]
    shards: list[tuple[int, int, int]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shards", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", default="1,2,4", help="shard counts (default 1,2,4)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events per run (default 1000000)")
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the source topic (default 8)")
    parser.add_argument(
        "--placement",
        default=None,
        choices=["partition", "sharding-key"],
        help=f"clickhouse.placement (default: not set, by partition); sharding-key places by {SHARDING_KEY}",
    )
    parser.add_argument("--interval", type=float, default=1.0, help="transaction.interval_s (default 1.0)")
    parser.add_argument("--chunk-rows", type=int, default=20_000, help="participant.chunk_rows (default 20000)")
    parser.add_argument("--timeout", type=float, default=900, help="give up on a run after this many seconds")
    parser.add_argument("--dir", default=".chtxn/bench-shards", help="working directory (wiped at start)")
    parser.add_argument("--results", default=str(RESULTS), help="directory of the JSON results")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.shards.split(",") if n]
    if not counts or min(counts) < 1 or args.events < 1 or args.partitions < 1:
        parser.error("--shards takes counts of at least 1, e.g. 1,2,4; --events and --partitions at least 1")
    chtxn_run.stop_on_sigterm()
    console = bench_console()
    started_at = datetime.now(timezone.utc)
    t0, load_before, probe_before = time.monotonic(), os.getloadavg(), cpu_probe()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    runs = []
    for n in counts:
        with console.status(f"{n} shards"):
            runs.append(run_one(args, work / f"{n}-shards", n))
        console.print(line(runs[-1]))
    for run in runs:
        run["relative"] = relative(run, runs[0])
    console.print(table(runs, args))
    document = {
        "benchmark": "shards",
        "started_at": started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "wall_s": round(time.monotonic() - t0, 1),
        "git": git_state(),
        "settings": {
            k: getattr(args, k) for k in ("shards", "events", "partitions", "placement", "interval", "chunk_rows")
        },
        "machine": machine(load_before, os.getloadavg(), probe_before, cpu_probe()),
        "runs": runs,
    }
    out = write_results(document, args.results, "shards", started_at)
    console.print(f"wall time {document['wall_s']:.0f} s; results in {out}")
    return 0


def run_one(args: argparse.Namespace, work: Path, n: int) -> dict[str, object]:
    """One run over ``n`` shards on a fresh stack in ``work``: set up, produce, run until every event
    is on its shard, stop, read back."""
    logs = work / "logs"
    logs.mkdir(parents=True)
    with EmbeddedStack(work / "stack") as stack, more_shards(stack, work, n - 1) as shards:
        cfg, path = configure(stack, shards.urls, work, args)
        workload.prepare(cfg, args.partitions)
        for section in cfg.shard_sections[1:]:
            client = make_client(msgspec.structs.replace(section, database="default"))
            try:
                client.command(f"CREATE DATABASE IF NOT EXISTS {workload.DATABASE}")
                client.command(workload.table_ddl(workload.TARGET))
            finally:
                client.close()
        workload.produce(cfg, args.events)
        clients = [make_client(s) for s in cfg.shard_sections]
        try:
            cost = [poll_cost(c) for c in clients]
            with chtxn_run.Pipeline(path, logs) as pipeline:
                polls = wait_for_rows(pipeline, clients, args.events, time.monotonic() + args.timeout)
            txns = chtxn_run.ledger_history(cfg)
            fig = chtxn_run.figures(cfg, pipeline, [(p.at, p.cpu) for p in polls], logs, txns=txns)
            misplaced = misplaced_rows(cfg, clients) if args.placement is None else None
        finally:
            for client in clients:
                client.close()
        pids = [stack.clickhouse.pid, *(e.pid for e in shards.extra)]
    # the span chtxn_run.figures took its CPU over: the last poll at or before the first data START, to the end
    first = max((i for i, p in enumerate(polls) if p.at <= fig.first_start), default=0)
    before, after = polls[first], polls[-1]
    started = [t for t in txns if before.at <= t.started_at <= after.at]
    own = len(polls) - 1 - first  # this process's polls in the span, each shard answering one statement each
    per_txn = max(1, len(started))
    shard_cpu = [after.cpu.get(pid, ("", 0.0))[1] - before.cpu.get(pid, ("", 0.0))[1] for pid in pids]
    rows = fig.rows or 1
    return {
        "shards": n,
        "rows": fig.rows,
        "data_txns": fig.data_txns,
        "txns_in_window": len(started),
        "rows_per_s": fig.rows_per_s,
        "drain_rows_per_s": fig.drain_rows_per_s,
        "commit_p50_ms": percentile(fig.commit_ms, 0.5),
        "commit_p95_ms": percentile(fig.commit_ms, 0.95),
        "publish_p50_ms": percentile(fig.publish_ms, 0.5),
        "aborts": sum(fig.aborts.values()),
        "cpu_window_s": fig.cpu_window_s,
        "cpu_s": fig.cpu_s,
        "cpu_us_per_row": {
            "participants": 1e6 * sum(fig.cpu_s.get(c, 0.0) for c in PARTICIPANTS) / rows,
            "coordinator": 1e6 * fig.cpu_s.get("coordinator", 0.0) / rows,
            "broker": 1e6 * fig.cpu_s.get("broker", 0.0) / rows,
            "clickhouse": 1e6 * fig.cpu_s.get("clickhouse", 0.0) / rows,
            "pipeline": 1e6 * sum(v for k, v in fig.cpu_s.items() if k not in NOT_MEASURED) / rows,
        },
        "cpu_us_per_row_by_shard": [1e6 * s / rows for s in shard_cpu],
        "statements_per_txn_by_shard": [
            (a[0] - b[0] - own * c) / per_txn for a, b, c in zip(after.shards, before.shards, cost)
        ],
        "inserts_per_txn_by_shard": [(a[1] - b[1]) / per_txn for a, b in zip(after.shards, before.shards)],
        "own_polls": own,
        "poll_cost_by_shard": cost,
        "rows_by_shard": [s[2] for s in after.shards],
        "misplaced_rows": misplaced,
    }


#: The key ``--placement sharding-key`` places rows by: the demo event's user, hashed.
SHARDING_KEY = "cityHash64(user_id)"


def configure(
    stack: EmbeddedStack, urls: list[str], work: Path, args: argparse.Namespace
) -> tuple[PipelineConfig, Path]:
    """``benchmarks.workload``'s pipeline, with ``clickhouse.shards`` (and ``clickhouse.placement``) added."""
    path = work / "pipeline.toml"
    workload.write_config(
        path,
        kafka=stack.kafka_bootstrap,
        clickhouse=urls[0],
        interval_s=args.interval,
        size_trigger_rows=TransactionSection().size_trigger_rows,
        chunk_rows=args.chunk_rows,
    )
    anchor = f'target_table = "{workload.TARGET}"\n'
    text = path.read_text()
    if anchor not in text:
        raise ChtxnError("benchmarks.workload.PIPELINE_TOML changed: benchmarks.shards needs a new anchor for its keys")
    keys = f"shards = {json.dumps(urls)}\n"
    if args.placement is not None:
        keys += f"placement = {json.dumps(args.placement)}\n"
    if args.placement == "sharding-key":  # as a Distributed table of the demo's events would shard them
        keys += f"sharding_key = {json.dumps(SHARDING_KEY)}\n"
    path.write_text(text.replace(anchor, anchor + keys))
    return load_config(str(path), {}), path


def poll_cost(client: object) -> float:
    """How far one ``POLL`` moves the ``Query`` counter of an idle server (three polls, two steps)."""
    first = _poll(client)[0]
    _poll(client)
    return (_poll(client)[0] - first) / 2


def _poll(client: object) -> tuple[int, int, int]:
    (row,) = client.query(POLL).result_rows  # type: ignore[attr-defined]  # a clickhouse-connect client
    return int(row[0]), int(row[1]), int(row[2])


def wait_for_rows(pipeline: chtxn_run.Pipeline, clients: list, rows: int, deadline: float) -> list[Poll]:
    """Poll every shard until they hold ``rows`` rows together; every poll, with a CPU snapshot."""
    polls: list[Poll] = []
    while True:
        polls.append(Poll(time.time(), cpu.snapshot(), [_poll(c) for c in clients]))
        pipeline.check()
        published = sum(s[2] for s in polls[-1].shards)
        if published >= rows:
            return polls
        if time.monotonic() > deadline:
            raise ChtxnError(f"only {published:,} of {rows:,} rows over the shards before the timeout")
        time.sleep(0.5)  # polling period of a progress check, not a synchronisation


def misplaced_rows(cfg: PipelineConfig, clients: list) -> int:
    """Rows on a shard other than the one their partition is placed on (``protocol.shards.shard_of``)."""
    found = 0
    for i, client in enumerate(clients):
        for topic, partition, count in client.query(
            f"SELECT _topic, _partition, count() FROM {workload.DATABASE}.{workload.TARGET} GROUP BY _topic, _partition"
        ).result_rows:
            if shard_rules.shard_of(topic, int(partition), len(clients)) != i:
                found += int(count)
    return found


#: The figures given relative to the first shard count, and where each is in a run.
RELATIVE = {
    "commit_p50_ms": ("commit_p50_ms",),
    "commit_p95_ms": ("commit_p95_ms",),
    "rows_per_s": ("rows_per_s",),
    "cpu_us_per_row": ("cpu_us_per_row", "pipeline"),
    "participants_cpu_us_per_row": ("cpu_us_per_row", "participants"),
    "coordinator_cpu_us_per_row": ("cpu_us_per_row", "coordinator"),
    "clickhouse_cpu_us_per_row": ("cpu_us_per_row", "clickhouse"),
}


def relative(run: dict, base: dict) -> dict[str, float | None]:
    """``run``'s figures over ``base``'s; statements per txn summed over the shards."""

    def get(r: dict, keys: tuple[str, ...]) -> float | None:
        value: object = r
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, (int, float)) else None

    ratios = {}
    pairs = {name: (get(run, keys), get(base, keys)) for name, keys in RELATIVE.items()}
    pairs["statements_per_txn"] = (sum(run["statements_per_txn_by_shard"]), sum(base["statements_per_txn_by_shard"]))
    for name, (mine, theirs) in pairs.items():
        ratios[name] = round(mine / theirs, 3) if mine is not None and theirs else None
    return ratios


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def line(run: dict) -> str:
    us = run["cpu_us_per_row"]
    return (
        f"{run['shards']} shards: {run['rows']:,} rows in {run['data_txns']} data txns, {run['rows_per_s']:,.0f} rows/s, "
        f"END->commit p50 {_ms(run['commit_p50_ms'])} ms p95 {_ms(run['commit_p95_ms'])} ms, "
        f"{us['pipeline']:.1f} µs CPU/row, rows by shard {run['rows_by_shard']}, misplaced {run['misplaced_rows']}"
    )


def table(runs: list[dict], args: argparse.Namespace) -> Table:
    placement = args.placement or "by partition"
    t = Table(title=f"{args.events:,} events, {args.partitions} partitions, placement {placement}; ratio to the first")
    headers = (
        "shards",
        "rows/s",
        "END->commit p50 / p95",
        "CPU µs/row all",
        "participants",
        "coordinator",
        "each shard",
        "statements/txn by shard",
        "inserts/txn by shard",
    )
    for header in headers:
        t.add_column(header, justify="right")
    for run in runs:
        us, rel = run["cpu_us_per_row"], run["relative"]

        def x(name: str, rel: dict = rel) -> str:
            return f" ({rel[name]:.2f}x)" if rel.get(name) is not None else ""

        t.add_row(
            str(run["shards"]),
            f"{run['rows_per_s']:,.0f}{x('rows_per_s')}",
            f"{_ms(run['commit_p50_ms'])}{x('commit_p50_ms')} / {_ms(run['commit_p95_ms'])}{x('commit_p95_ms')} ms",
            f"{us['pipeline']:.1f}{x('cpu_us_per_row')}",
            f"{us['participants']:.1f}{x('participants_cpu_us_per_row')}",
            f"{us['coordinator']:.2f}{x('coordinator_cpu_us_per_row')}",
            " ".join(f"{v:.1f}" for v in run["cpu_us_per_row_by_shard"]),
            " ".join(f"{v:.1f}" for v in run["statements_per_txn_by_shard"]) + x("statements_per_txn"),
            " ".join(f"{v:.1f}" for v in run["inserts_per_txn_by_shard"]),
        )
    return t


if __name__ == "__main__":
    raise SystemExit(main())
