"""``make bench``: the backlog benchmark plus a paced phase, repeated, summarised into one JSON file.

    .venv/bin/python -m benchmarks.bench [--reps 3] [--paced-rate ROWS_PER_S] [--paced-seconds 60]
        [--no-paced] [every option of benchmarks.pipeline]

Each repetition runs on its own fresh ``EmbeddedStack`` (``<--dir>/repN``):

1. the backlog steps of ``benchmarks.pipeline``: produce ``--events``, the ceilings (unless
   ``--no-ceilings``), the plain loop, then the chtxn pipeline until it has published them all;
2. the paced phase (``benchmarks.paced``) on the same, still running, pipeline: ``--paced-rate``
   events/s (default: half the plain loop's rows/s of this repetition) for ``--paced-seconds``,
   and the freshness of those events.

It prints each repetition's tables, then every figure's median and spread (min-max), and writes
``benchmarks/results/<UTC time>.json`` (``benchmarks.summary`` describes the document). With a
ClickPipes-like ``--workload`` (``benchmarks.clickpipes``; ``--no-paced`` required) it adds the
MB/s and rows/s per ingesting core, and writes ``<workload>-<UTC time>.json`` instead, which
``tools.benchdoc`` never takes for the headline. It measures and reports; it asserts nothing
about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from benchmarks import ch_profile, chtxn_run, clickpipes, paced, pipeline, report, summary, timeline, workload
from benchmarks.chtxn_run import REPO, PipelineFigures
from benchmarks.console import console as bench_console
from benchmarks.paced import PacedFigures
from benchmarks.plain import Outcome
from embedded.stack import EmbeddedStack

RESULTS = Path(__file__).resolve().parent / "results"
#: Components that are not the pipeline's: the machine's other load, the paced producer, and the
#: benchmark's own process (its progress polls and CPU snapshots).
NOT_MEASURED = ("other", "paced producer", "benchmark driver")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0])
    pipeline.add_arguments(parser)
    parser.add_argument("--reps", type=int, default=3, help="repetitions, each on a fresh stack (default 3)")
    parser.add_argument(
        "--paced-rate",
        type=float,
        default=None,
        help="events/s of the paced phase (default: half the plain loop's rows/s of the repetition)",
    )
    parser.add_argument(
        "--commit-points",
        default="token",
        help='ledger.commit_point of the chtxn runs, comma-separated: "token,keeper" measures both in one run, '
        "repetitions alternating, each on a fresh stack with a ZooKeeper (default token)",
    )
    parser.add_argument("--paced-seconds", type=float, default=60.0, help="length of the paced phase (default 60)")
    parser.add_argument("--no-paced", action="store_true", help="skip the paced phase")
    parser.add_argument(
        "--results", default=str(RESULTS), help="directory of the JSON results (default benchmarks/results)"
    )
    args = parser.parse_args(argv)
    pipeline.check_arguments(parser, args)
    chtxn_run.stop_on_sigterm()
    if args.reps < 1 or args.paced_seconds <= 0 or (args.paced_rate is not None and args.paced_rate <= 0):
        parser.error("--reps must be at least 1, and --paced-rate and --paced-seconds positive")
    if args.workload != "demo" and not args.no_paced:
        parser.error(f"--workload {args.workload} has no paced phase (its producer is the demo's): add --no-paced")

    console = bench_console()
    started_at = datetime.now(timezone.utc)
    t0 = time.monotonic()
    load_before, probe_before = os.getloadavg(), cpu_probe()
    git = git_state()
    points = [p.strip() for p in args.commit_points.split(",") if p.strip()]
    if not points or set(points) - {"token", "keeper"}:
        parser.error('--commit-points takes "token", "keeper" or both, comma-separated')
    keeper = "keeper" in points  # every stack gets a ZooKeeper then, so the runs differ only in the claim
    repetitions: dict[str, list[dict[str, object]]] = {p: [] for p in points}
    for i in range(1, args.reps + 1):
        for point in points:
            console.rule(f"repetition {i} of {args.reps}, commit point {point}")
            args.commit_point = point
            work = Path(args.dir).resolve() / f"rep{i}-{point}"
            repetitions[point].append(repetition(args, work, console, keeper=keeper))
    wall_s = round(time.monotonic() - t0, 1)
    the_machine = machine(load_before, os.getloadavg(), probe_before, cpu_probe())
    for point in points:
        document = summary.assemble(
            repetitions[point],
            settings={**settings(args), "commit_point": point, "keeper_running": keeper},
            git=git,
            machine=the_machine,
            started_at=started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            wall_s=wall_s,
        )
        name = result_name(points, point, started_at.strftime("%Y%m%dT%H%M%SZ"))
        out = write_document(
            Path(args.results) / (name if args.workload == "demo" else f"{args.workload}-{name}"), document
        )
        console.rule(f"commit point {point}")
        console.print(report.summary_table(document))
        console.print(f"wall time {wall_s:.0f} s; results in {out}")
    return 0


def repetition(args: argparse.Namespace, work: Path, console: Console, *, keeper: bool = False) -> dict[str, object]:
    """One repetition on a fresh stack in ``work`` (with a ZooKeeper if ``keeper``): its flat
    figures (``repetition_figures``)."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    logs = work / "logs"
    probe = cpu_probe()  # this repetition's machine speed: a slower minute shows here, not as chtxn's
    with (
        clickpipes.serving(args.workload, work / "registry") as insert_settings,
        EmbeddedStack(work / "stack", keeper=keeper) as stack,
    ):
        setup = pipeline.prepare(args, work, stack, console, insert_settings=insert_settings)
        outcomes = pipeline.reference_runs(args, setup, console)
        loop = next(o for o in outcomes if o.mode == "loop")
        rate = args.paced_rate or loop.rows_per_s / 2
        workload.settle(setup.cfg)
        run = None
        with (
            console.status("running the chtxn pipeline on the backlog"),
            chtxn_run.Pipeline(setup.config_path, logs) as pipe,
        ):
            snapshots = pipe.wait_for_rows(setup.cfg, args.events, time.monotonic() + args.timeout)
            if not args.no_paced:
                console.print(
                    f"chtxn: backlog published; paced phase at {rate:,.0f} events/s for {args.paced_seconds:g} s"
                )
                run = paced.run(
                    setup.cfg,
                    pipe,
                    backlog_rows=args.events,
                    after_backlog=snapshots[-1][0],
                    rate=rate,
                    seconds=args.paced_seconds,
                    logs=logs,
                    timeout_s=args.timeout,
                )
        txns = chtxn_run.ledger_history(setup.cfg)
        control = timeline.read(setup.cfg, dump=logs / "control.jsonl")
        figures = chtxn_run.figures(setup.cfg, pipe, snapshots, logs, txns=txns, control=control)
        paced_figures = paced.figures(setup.cfg, run, txns, control) if run else None
        profiles = pipeline.clickhouse_profiles(setup.cfg, outcomes, figures, whole_run=False)
    title = (
        f"{args.events:,} events, {args.partitions} partitions, plain loop {len(setup.groups)} processes, "
        f"batch/chunk {args.chunk_rows:,} rows"
    )
    for table in (
        report.results(outcomes, figures, title),
        report.pipeline_table(figures),
        report.cpu_table(outcomes, figures),
        report.clickhouse_table(profiles),
    ):
        console.print(table)
    if paced_figures is not None:
        console.print(report.paced_table(paced_figures))
    found = {**repetition_figures(outcomes, figures, paced_figures), "cpu_probe_s": probe}
    found["clickhouse_cpu_by_statement"] = {
        "plain" if name == "loop" else name: ch_profile.per_100k(lines, rows)
        for name, (lines, rows) in profiles.items()
    }
    if args.workload != "demo":
        found.update(pipeline.workload_figures(setup, outcomes, figures))
        console.print(clickpipes.table(args.workload, found))
    return found


def repetition_figures(
    outcomes: list[Outcome], figures: PipelineFigures, paced_figures: PacedFigures | None
) -> dict[str, object]:
    """The flat figures of one repetition (``None`` where not measured); see ``benchmarks/README.md``."""
    rate = {o.mode: o.rows_per_s for o in outcomes}
    loop = next(o for o in outcomes if o.mode == "loop")
    phases = figures.phases
    found: dict[str, object] = {
        "plain_rows_per_s": rate["loop"],
        "chtxn_rows_per_s": figures.rows_per_s,
        "ratio_vs_plain": figures.rows_per_s / rate["loop"] if rate["loop"] else None,
        "consume_ceiling_rows_per_s": rate.get("consume"),
        "insert_ceiling_rows_per_s": rate.get("insert"),
        "chtxn_wall_rows_per_s": figures.rows / figures.wall_s if figures.wall_s else None,
        "chtxn_drain_rows_per_s": figures.drain_rows_per_s,
        "spark_ready_s": figures.spark_ready_s,
        "data_txns": figures.data_txns,
        "rows_per_txn": figures.rows / figures.data_txns,
        "commit_p50_ms": summary.percentile(figures.commit_ms, 0.5),
        "commit_p95_ms": summary.percentile(figures.commit_ms, 0.95),
        "publish_p50_ms": summary.percentile(figures.publish_ms, 0.5),
        "read_share": phases.reading_share if phases else None,
        "flush_ms": phases.flush_ms if phases else None,
        "turnaround_ms": phases.turnaround_ms if phases else None,
        "backlog_aborts": sum(figures.aborts.values()),
        "cpu_s_per_100k_rows_plain": _cpu_per_100k(loop.cpu_s, loop.rows),
        "cpu_s_per_100k_rows_chtxn": _cpu_per_100k(figures.cpu_s, figures.rows),
    }
    # both sides of one repetition ran on the same machine minutes: their ratio drifts less than either
    plain_cpu, chtxn_cpu = _cpu_per_100k(loop.cpu_s, loop.rows), _cpu_per_100k(figures.cpu_s, figures.rows)
    found["cpu_ratio_vs_plain"] = chtxn_cpu / plain_cpu if chtxn_cpu is not None and plain_cpu else None
    p = paced_figures
    found.update(
        {
            "paced_rate": p.run.rate if p else None,
            "paced_rate_achieved": p.run.achieved_rate if p else None,
            "paced_load": p.run.rate / figures.rows_per_s if p and figures.rows_per_s else None,
            "paced_rows": p.rows if p else None,
            "paced_max_behind": p.run.max_behind if p else None,
            "paced_drain_s": p.run.drain_s if p else None,
            "freshness_p50_ms": p.freshness_ms["p50"] if p else None,
            "freshness_p99_ms": p.freshness_ms["p99"] if p else None,
            "freshness_max_ms": p.freshness_ms["max"] if p else None,
            "paced_txns": p.data_txns if p else None,
            "paced_commit_p50_ms": summary.percentile(p.commit_ms, 0.5) if p else None,
            "paced_commit_p95_ms": summary.percentile(p.commit_ms, 0.95) if p else None,
            "paced_publish_p50_ms": summary.percentile(p.publish_ms, 0.5) if p else None,
            "paced_read_share": p.phases.reading_share if p and p.phases else None,
            "paced_aborts": sum(p.aborts.values()) if p else None,
            "paced_cpu_s_per_100k_rows_chtxn": _cpu_per_100k(p.run.cpu_s, p.run.sent) if p else None,
            "paced_producer_cpu_s": p.run.producer_cpu_s if p else None,
            "paced_cores_busy": p.run.cores_busy if p else None,
        }
    )
    found["aborts"] = sum(figures.aborts.values()) + (sum(p.aborts.values()) if p else 0)  # backlog + paced
    found["abort_reasons"] = dict(figures.aborts + (p.aborts if p else Counter()))
    found["cpu_s_by_component"] = {
        "plain": _per_100k(loop.cpu_s, loop.rows),
        "chtxn": _per_100k(figures.cpu_s, figures.rows),
        **({"paced": _per_100k(p.run.cpu_s, p.run.sent)} if p else {}),
    }
    return found


def _per_100k(cpu_s: dict[str, float], rows: int) -> dict[str, float]:
    return {c: round(s / rows * 1e5, 3) for c, s in sorted(cpu_s.items())} if rows else {}


def _cpu_per_100k(cpu_s: dict[str, float], rows: int) -> float | None:
    return sum(s for c, s in cpu_s.items() if c not in NOT_MEASURED) / rows * 1e5 if rows else None


def settings(args: argparse.Namespace) -> dict[str, object]:
    return {
        "events": args.events,
        "partitions": args.partitions,
        "chunk_rows": args.chunk_rows,
        "interval_s": args.interval,
        "size_trigger_rows": args.size_trigger,
        "kafka_properties": dict(item.split("=", 1) for item in args.kafka_property),
        "ceilings": not args.no_ceilings,
        "reps": args.reps,
        "paced": not args.no_paced,
        "paced_rate": args.paced_rate,  # None: half the plain loop's rows/s of each repetition
        "paced_seconds": args.paced_seconds,
        **({} if args.workload == "demo" else {"workload": args.workload}),
    }


def write_results(document: Mapping[str, object], results: str | Path, name: str, started_at: datetime) -> Path:
    """``document`` as ``<results>/<name>-<UTC start, YYYYMMDDTHHMMSSZ>.json``; returns the path."""
    return write_document(Path(results) / f"{name}-{started_at.strftime('%Y%m%dT%H%M%SZ')}.json", document)


def write_document(out: Path, document: Mapping[str, object]) -> Path:
    """``document`` as indented JSON in ``out`` (its directory made if need be); returns ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=2) + "\n")
    return out


def git_state() -> dict[str, object]:
    """The checked-out commit, and whether tracked files differ from it."""

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def machine(
    load_before: tuple[float, ...], load_after: tuple[float, ...], probe_before: float, probe_after: float
) -> dict[str, object]:
    return {
        "cores": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "cpu_probe_s_before": probe_before,
        "cpu_probe_s_after": probe_after,
    }


def cpu_probe(loops: int = 10_000_000) -> float:
    """CPU seconds of a fixed pure-Python loop: how fast one of this machine's cores is now.

    A shared VM's cores are not equally fast every day (on 2026-11-23 the plain loop made
    151-237k rows/s here, against 306-322k the day before): compare the absolute figures of two
    runs only when their probes agree.
    """
    t0 = time.process_time()
    total = 0
    for i in range(loops):
        total += i
    return round(time.process_time() - t0, 3)


def result_name(points: list[str], point: str, stamp: str) -> str:
    """The results file of ``point``: ``<time>.json`` for the token headline, ``<time>-keeper.json`` for
    keeper alone, ``commit-point-<point>-<time>.json`` when the run compares commit points (so that
    ``tools.benchdoc`` puts the pair side by side and never takes a comparison for the headline)."""
    if len(points) > 1:
        return f"commit-point-{point}-{stamp}.json"
    return f"{stamp}.json" if point == "token" else f"{stamp}-{point}.json"


if __name__ == "__main__":
    raise SystemExit(main())
