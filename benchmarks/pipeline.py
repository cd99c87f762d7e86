"""The pipeline benchmark: chtxn side by side with a plain at-least-once loop, on the embedded stack.

    .venv/bin/python -m benchmarks.pipeline [--events 3000000] [--partitions 4] [--workload demo]

Steps, all on one fresh ``EmbeddedStack`` (stopped at the end, with every process started here):

1. produce ``--events`` of the demo's JSON events (or, with ``--workload``, a ClickPipes-like
   workload's nested records: ``benchmarks.clickpipes``) into a topic of ``--partitions`` partitions;
2. raw ceilings (skip with ``--no-ceilings``): consume only, and insert only (the plain loop's
   bodies and statements, built before the clock starts);
3. (a) the plain loop: consume, ``raw_insert`` batches of ``--chunk-rows``, commit offsets;
4. (b) the chtxn pipeline (coordinator + ``chtxn participant``), figures from the ledger.

The plain loop runs one process per partition, at most two per core: a serial loop needs the
second process per core to read while the other waits for an insert (on 2 cores, 4 partitions in 4
processes: 276k-309k rows/s; in 2: 194k). The ceilings use the same processes. The chtxn pipeline
runs with its own defaults (``chtxn participant`` without ``--master``: one task per core). Between
steps the benchmark waits for ClickHouse's background merges to finish. It measures and
reports; it asserts nothing about speed. ``benchmarks.bench`` (``make bench``) repeats these
steps and adds a paced phase.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from benchmarks import ch_profile, chtxn_run, clickpipes, plain, report, workload
from benchmarks.console import console as bench_console
from benchmarks.plain import Outcome
from clients.clickhouse import make_client
from embedded.stack import EmbeddedStack
from participant.job import group_partitions
from protocol.config.parse import PipelineConfig
from protocol.config.sections import ParticipantSection, TransactionSection
from protocol.messages import TopicPartition


@dataclass
class Setup:
    """A prepared stack: the pipeline's config, each partition's end offset, the process groups."""

    cfg: PipelineConfig
    config_path: Path
    ends: dict[int, int]
    groups: list[list[int]]  # the plain loop's processes
    value_bytes: int = 0  # the bytes of every record value produced


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the backlog steps (shared with ``benchmarks.bench``)."""
    parser.add_argument(
        "--events", type=int, default=3_000_000, help="events to produce (default 3000000: about 8 txns of backlog)"
    )
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the source topic (default 4)")
    parser.add_argument(
        "--chunk-rows",
        type=int,
        default=ParticipantSection().chunk_rows,
        help="participant.chunk_rows, and the plain loop's batch size (default: chtxn's default)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=TransactionSection().interval_s,
        help="transaction.interval_s (default: chtxn's default)",
    )
    parser.add_argument(
        "--size-trigger",
        type=int,
        default=TransactionSection().size_trigger_rows,
        help="transaction.size_trigger_rows (default: chtxn's default)",
    )
    parser.add_argument(
        "--kafka-property",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property for every client of both loops, as [kafka.properties] (repeatable)",
    )
    parser.add_argument(
        "--workload",
        choices=clickpipes.WORKLOADS,
        default="demo",
        help="the records: demo (the demo's ~200-byte JSON events, the default), clickpipes-json "
        "(~1.6 KB nested JSON, JSONEachRow) or clickpipes-avro (the same records as AvroConfluent, "
        "the schema served from files), with MB/s per core beside ClickPipes' published figures "
        "(make bench: with --no-paced), e.g. --workload clickpipes-avro --events 300000 --no-ceilings",
    )
    parser.add_argument("--no-ceilings", action="store_true", help="skip the consume-only and insert-only runs")
    parser.add_argument("--dir", default=".chtxn/bench", help="working directory (wiped at start)")
    parser.add_argument("--timeout", type=float, default=900, help="give up on a step after this many seconds")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.events < 1 or args.partitions < 1 or args.chunk_rows < 1:
        parser.error("--events, --partitions and --chunk-rows must be at least 1")
    if any("=" not in item for item in args.kafka_property):
        parser.error("--kafka-property takes KEY=VALUE, e.g. --kafka-property fetch.queue.backoff.ms=50")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pipeline", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    chtxn_run.stop_on_sigterm()

    console = bench_console()
    work = Path(args.dir).resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    load_before = os.getloadavg()
    with (
        clickpipes.serving(args.workload, work / "registry") as insert_settings,
        EmbeddedStack(work / "stack") as stack,
    ):
        setup = prepare(args, work, stack, console, insert_settings=insert_settings)
        outcomes = reference_runs(args, setup, console)
        workload.settle(setup.cfg)
        with console.status("running the chtxn pipeline (coordinator + Spark participant job)"):
            figures = chtxn_run.run(setup.cfg, setup.config_path, args.events, work / "logs", timeout_s=args.timeout)
        profiles = clickhouse_profiles(setup.cfg, outcomes, figures)
    title = (
        f"{args.events:,} events, {args.partitions} partitions, plain loop {len(setup.groups)} processes, "
        f"batch/chunk {args.chunk_rows:,} rows"
    )
    for table in (
        report.results(outcomes, figures, title),
        report.pipeline_table(figures),
        report.loop_phases_table(outcomes),
        report.cpu_table(outcomes, figures),
        report.clickhouse_table(profiles),
    ):
        console.print(table)
    if args.workload != "demo":
        console.print(clickpipes.table(args.workload, workload_figures(setup, outcomes, figures)))
    load_after = os.getloadavg()
    console.print(
        f"machine: {os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}, "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; logs in {work / 'logs'}"
    )
    return 0


def prepare(
    args: argparse.Namespace,
    work: Path,
    stack: EmbeddedStack,
    console: Console,
    *,
    insert_settings: dict[str, str] | None = None,
) -> Setup:
    """Step 1: config, topics and tables of ``--workload`` on a fresh ``stack``, and ``--events``
    produced; ``insert_settings`` (``clickpipes.serving``) go to ``[clickhouse.insert_settings]``."""
    config_path = work / "pipeline.toml"
    cfg = workload.write_config(
        config_path,
        kafka=stack.kafka_bootstrap,
        clickhouse=stack.clickhouse_url,
        interval_s=args.interval,
        size_trigger_rows=args.size_trigger,
        chunk_rows=args.chunk_rows,
        properties=dict(item.split("=", 1) for item in args.kafka_property),
        commit_point=getattr(args, "commit_point", "token"),
        input_format=clickpipes.FORMATS.get(args.workload),
        insert_settings=insert_settings,
    )
    workload.prepare(cfg, args.partitions, args.workload)
    with console.status(f"producing {args.events:,} events"):
        t0 = time.monotonic()
        produced, value_bytes = workload.produce_workload(cfg, args.events, args.workload)
        console.print(
            f"produced {args.events:,} events into {args.partitions} partitions in {time.monotonic() - t0:.1f} s"
        )
    processes = max(1, min(args.partitions, 2 * (os.cpu_count() or 1)))
    groups = [
        [p for _, p in g]
        for g in group_partitions(
            [TopicPartition(topic=workload.TOPIC, partition=p) for p in range(args.partitions)], processes
        )
    ]
    ends = {p: produced.get(p, 0) for p in range(args.partitions)}
    return Setup(cfg, config_path, ends, groups, value_bytes)


def workload_figures(setup: Setup, outcomes: list[Outcome], figures: chtxn_run.PipelineFigures) -> dict[str, object]:
    """The ClickPipes-comparable figures of one run (``clickpipes.per_core``), both sides, and the
    values' mean size; the backlog's every row has one of the values produced."""
    loop = next(o for o in outcomes if o.mode == "loop")
    mean = setup.value_bytes / sum(setup.ends.values()) if setup.ends and any(setup.ends.values()) else 0.0
    return {
        "value_bytes_mean": mean,
        "chtxn_mb_per_s": figures.rows_per_s * mean / 1e6,
        "plain_mb_per_s": loop.rows_per_s * mean / 1e6,
        **clickpipes.per_core("chtxn", figures.rows, mean, figures.cpu_s, figures.cpu_window_s),
        **clickpipes.per_core("plain", loop.rows, mean, loop.cpu_s, loop.cpu_window_s),
    }


def clickhouse_profiles(
    cfg: PipelineConfig, outcomes: list[Outcome], figures: chtxn_run.PipelineFigures, *, whole_run: bool = True
) -> dict[str, tuple[list[ch_profile.Line], int]]:
    """ClickHouse's CPU by statement and merge in the CPU window of each run, with the run's rows;
    with ``whole_run``, also every merge of each run's tables once ClickHouse runs none (the rows'
    whole merge cost: a window ends before the merges of its last parts)."""
    client = make_client(cfg.clickhouse)
    try:
        runs = [(o.mode, o.cpu_since, o.cpu_window_s, o.rows) for o in outcomes if o.mode != "consume"]
        runs.append(("chtxn", figures.cpu_since, figures.cpu_window_s, figures.rows))
        profiles = {name: (ch_profile.profile(client, since, since + span), rows) for name, since, span, rows in runs}
        if whole_run:
            workload.settle(cfg)
            merges = [line for line in ch_profile.profile(client, 0.0, time.time()) if line.kind == "merge"]
            loop_rows = next((o.rows for o in outcomes if o.mode == "loop"), 0)
            profiles["merges, whole run (loop)"] = ([m for m in merges if m.shape == workload.PLAIN], loop_rows)
            chtxn_merges = [m for m in merges if m.shape not in (workload.PLAIN, workload.CEILING)]
            profiles["merges, whole run (chtxn)"] = (chtxn_merges, figures.rows)
        return profiles
    finally:
        client.close()


def reference_runs(args: argparse.Namespace, setup: Setup, console: Console) -> list[Outcome]:
    """Steps 2 and 3: the ceilings (unless ``--no-ceilings``), then the plain loop."""
    outcomes: list[Outcome] = []
    modes = ("loop",) if args.no_ceilings else ("consume", "insert", "loop")
    for mode in modes:
        workload.settle(setup.cfg)
        with console.status(f"running {mode} ({len(setup.groups)} processes)"):
            outcomes.append(
                plain.run(mode, setup.cfg, setup.groups, setup.ends, batch_rows=args.chunk_rows, timeout_s=args.timeout)
            )
        console.print(f"{mode}: {outcomes[-1].rows:,} rows in {outcomes[-1].window_s:.2f} s")
        if mode == "insert":  # the ceiling's parts must not merge in the loop's window (measured: 0.07 s per 100k)
            workload.clear(setup.cfg, workload.CEILING)
    return outcomes


if __name__ == "__main__":
    raise SystemExit(main())
