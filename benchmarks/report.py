"""The benchmark's rich tables: rows/s side by side, the chtxn txn figures, and where time and CPU go."""

from __future__ import annotations

import os

from rich.table import Table

from benchmarks import cpu
from benchmarks.ch_profile import Line
from benchmarks.chtxn_run import PipelineFigures
from benchmarks.paced import PacedFigures
from benchmarks.plain import Outcome


def _pct(values: list[float], q: float) -> str:
    """The nearest-rank ``q`` quantile of sorted ``values``."""
    if not values:
        return "-"
    return f"{values[min(len(values) - 1, int(q * len(values)))]:.0f}"


def results(outcomes: list[Outcome], figures: PipelineFigures, title: str) -> Table:
    """Rows/s of every run, and each relative to the plain loop (a)."""
    table = Table(title=title)
    for column in ("run", "rows", "seconds", "rows/s", "vs (a)"):
        table.add_column(column, justify="left" if column == "run" else "right")
    names = {
        "consume": "(c) consume only (confluent-kafka)",
        "insert": "(c) insert only (JSONEachRow, metadata by ClickHouse)",
        "loop": "(a) plain at-least-once loop",
    }
    base = next((o.rows_per_s for o in outcomes if o.mode == "loop"), 0.0)
    for o in outcomes:
        table.add_row(
            names[o.mode],
            f"{o.rows:,}",
            f"{o.window_s:.2f}",
            f"{o.rows_per_s:,.0f}",
            f"{o.rows_per_s / base:.2f}" if base else "-",
        )
    steady = (
        (figures.steady_rows, figures.steady_window_s)
        if figures.steady_window_s > 0
        else (figures.rows, figures.window_s)
    )
    table.add_row(
        "(b) chtxn, steady state (ledger: data txns but the last)",
        f"{steady[0]:,}",
        f"{steady[1]:.2f}",
        f"{figures.rows_per_s:,.0f}",
        f"{figures.rows_per_s / base:.2f}" if base else "-",
    )
    drain = figures.drain_rows_per_s
    table.add_row(
        "(b) chtxn, first START -> last commit",
        f"{figures.rows:,}",
        f"{figures.window_s:.2f}",
        f"{drain:,.0f}",
        f"{drain / base:.2f}" if base else "-",
    )
    wall_rate = figures.rows / figures.wall_s if figures.wall_s else 0.0
    table.add_row(
        "(b) chtxn, wall time incl. Spark start-up",
        f"{figures.rows:,}",
        f"{figures.wall_s:.2f}",
        f"{wall_rate:,.0f}",
        f"{wall_rate / base:.2f}" if base else "-",
    )
    return table


def pipeline_table(f: PipelineFigures) -> Table:
    """The chtxn run's txns, latencies and phases."""
    table = Table(title="chtxn transactions (from the ledger)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    aborts = ", ".join(f"{n} x {reason}" for reason, n in f.aborts.items()) or "0"
    for name, value in (
        ("data txns committed (empty ones)", f"{f.data_txns} ({f.empty_txns})"),
        ("rows per data txn, mean", f"{f.rows / f.data_txns:,.0f}"),
        ("aborts (besides shutdown)", aborts),
        ("END -> commit point, p50 / p95 ms", f"{_pct(f.commit_ms, 0.5)} / {_pct(f.commit_ms, 0.95)}"),
        ("commit point -> published, p50 ms", _pct(f.publish_ms, 0.5)),
        ("START -> END, p50 ms", _pct(f.consume_ms, 0.5)),
        ("processes started -> first data START, s", f"{f.spark_ready_s:.1f}"),
    ):
        table.add_row(name, value)
    p = f.phases
    if p is not None:
        table.add_section()
        for name, value in (
            (
                f"control topic, median of {p.txns} data txns: END -> last WRITE-STATUS ms (inserting the last chunks)",
                f"{p.flush_ms:.0f}",
            ),
            ("END -> next START ms (nothing read; 0 when END carries the next START)", f"{p.turnaround_ms:.0f}"),
            ("last WRITE-STATUS -> ACK-COMMIT ms", f"{p.to_ack_ms:.0f}"),
            ("share of the cycle participants can read", f"{p.reading_share:.0%}"),
            ("chunks per data txn, mean", f"{p.chunks_per_txn:.1f}"),
        ):
            table.add_row(name, value)
    return table


def loop_phases_table(outcomes: list[Outcome]) -> Table:
    """Where the reference loops' processes spend their time."""
    table = Table(title="where the plain loop's processes spend their time (seconds, summed over processes)")
    table.add_column("run")
    for phase in ("consume", "body", "insert", "commit"):
        table.add_column(phase, justify="right")
    for o in outcomes:
        table.add_row(o.mode, *(f"{o.phases_s.get(p, 0.0):.2f}" for p in ("consume", "body", "insert", "commit")))
    return table


def cpu_table(outcomes: list[Outcome], figures: PipelineFigures) -> Table:
    """CPU seconds per 100k rows by component, and how busy the machine was."""
    runs = [(o.mode, o.cpu_s, o.rows, o.cpu_window_s) for o in outcomes]
    runs.append(("chtxn", figures.cpu_s, figures.rows, figures.cpu_window_s))
    table = Table(title="CPU seconds per 100k rows, by component (other: every other process on the machine)")
    table.add_column("component")
    for name, *_ in runs:
        table.add_column(name, justify="right")
    components = [c for c, _ in cpu.COMPONENTS] + ["other"]
    for component in components:
        if any(usage.get(component) for _, usage, _, _ in runs):
            table.add_row(component, *(f"{usage.get(component, 0.0) / rows * 1e5:.2f}" for _, usage, rows, _ in runs))
    table.add_row(
        "share of the machine used by the run (other excluded)",
        *(
            f"{sum(v for c, v in usage.items() if c != 'other') / (window * (os.cpu_count() or 1)):.0%}"
            if window
            else "-"
            for _, usage, _, window in runs
        ),
    )
    return table


def clickhouse_table(profiles: dict[str, tuple[list[Line], int]], top: int = 14) -> Table:
    """ClickHouse's CPU per 100k rows by statement and merge (``benchmarks.ch_profile``), one column
    per run (its lines, its rows): the ``top`` lines of most CPU in any run, then the rest summed."""
    table = Table(title="ClickHouse CPU seconds per 100k rows, by statement and merge (system.query_log, part_log)")
    table.add_column("kind")
    table.add_column("statement or merged table")
    for name in profiles:
        table.add_column(f"{name} (times)", justify="right")
    cells: dict[tuple[str, str], dict[str, Line]] = {}
    for name, (lines, _) in profiles.items():
        for line in lines:
            cells.setdefault((line.kind, line.shape), {})[name] = line
    ranked = sorted(cells, key=lambda key: -max(line.cpu_s for line in cells[key].values()))

    def cell(lines: list[Line], rows: int) -> str:
        return f"{sum(x.cpu_s for x in lines) / rows * 1e5:.3f} ({sum(x.count for x in lines):,})" if rows else "-"

    for key in ranked[:top]:
        table.add_row(
            *key, *(cell([cells[key][n]] if n in cells[key] else [], rows) for n, (_, rows) in profiles.items())
        )
    rest = ranked[top:]
    table.add_row(
        "",
        "every other line",
        *(cell([cells[k][n] for k in rest if n in cells[k]], rows) for n, (_, rows) in profiles.items()),
    )
    table.add_row("", "all", *(cell(lines, rows) for _, (lines, rows) in profiles.items()))
    return table


def paced_table(f: PacedFigures) -> Table:
    """The paced phase: the producer's schedule, freshness, and the txns while not catching up."""
    r = f.run
    table = Table(title=f"paced phase: {r.rate:,.0f} events/s for {r.seconds:.0f} s on the running pipeline")
    table.add_column("figure")
    table.add_column("value", justify="right")
    aborts = ", ".join(f"{n} x {reason}" for reason, n in f.aborts.items()) or "0"
    p = f.phases
    for name, value in (
        (
            "events produced (achieved events/s; most behind schedule)",
            f"{r.sent:,} ({r.achieved_rate:,.0f}; {r.max_behind:,})",
        ),
        ("rows matched to a published txn", f"{f.rows:,}"),
        (
            "freshness (produce -> published), p50 / p99 / max ms",
            f"{f.freshness_ms['p50']:.0f} / {f.freshness_ms['p99']:.0f} / {f.freshness_ms['max']:.0f}",
        ),
        ("producer flushed -> every row visible, s", f"{r.drain_s:.1f}"),
        ("data txns (aborts besides shutdown)", f"{f.data_txns} ({aborts})"),
        ("END -> commit point, p50 / p95 ms", f"{_pct(f.commit_ms, 0.5)} / {_pct(f.commit_ms, 0.95)}"),
        ("commit point -> published, p50 ms", _pct(f.publish_ms, 0.5)),
        ("share of the cycle participants can read", f"{p.reading_share:.0%}" if p else "-"),
        ("producer CPU s", f"{r.producer_cpu_s:.1f}"),
        (f"machine busy (every process, the producer included), cores of {os.cpu_count()}", f"{r.cores_busy:.2f}"),
    ):
        table.add_row(name, value)
    return table


def summary_table(document: dict) -> Table:
    """Every figure of a ``benchmarks.summary`` document: median, min-max, and each repetition's value."""
    reps = document["repetitions"]
    table = Table(title=f"{len(reps)} repetition(s): median and spread (min-max) of every figure")
    table.add_column("figure")
    for column in ("median", "min-max", *(f"rep {i}" for i in range(1, len(reps) + 1))):
        table.add_column(column, justify="right")
    for name, s in document["summary"].items():
        span = f"{_number(s['min'])}-{_number(s['max'])}" if s["n"] else "-"
        table.add_row(name, _number(s["median"]), span, *(_number(rep.get(name)) for rep in reps))
    return table


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"
