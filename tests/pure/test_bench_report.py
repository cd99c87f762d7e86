"""The benchmark's summary: quantiles, median and spread over repetitions, the JSON document.

Only the arithmetic and the assembly: figures are made up, nothing is timed.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest

from benchmarks import cpu, summary
from benchmarks.bench import repetition_figures, result_name
from benchmarks.chtxn_run import PipelineFigures, figures_from_ledger
from benchmarks.paced import PacedFigures, PacedRun
from benchmarks.plain import Outcome
from benchmarks.timeline import Phases
from protocol.ledger.view import TxnSummary


def test_percentile_is_nearest_rank_whatever_the_order() -> None:
    values = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]
    assert summary.percentile(values, 0.5) == 6
    assert summary.percentile(values, 0.95) == 10
    assert summary.percentile(values, 0.0) == 1
    assert summary.percentile(values, 1.0) == 10
    assert summary.percentile([42.0], 0.99) == 42.0
    assert summary.percentile([], 0.5) is None
    with pytest.raises(ValueError, match="quantile"):
        summary.percentile(values, 95)


def test_spread_skips_what_was_not_measured() -> None:
    assert summary.spread([3, 1, 2]) == {"median": 2, "min": 1, "max": 3, "n": 3}
    assert summary.spread([4.0, 1.0, None, 2.0, math.nan, 3.0]) == {"median": 2.5, "min": 1.0, "max": 4.0, "n": 4}
    assert summary.spread([None, math.nan]) == {"median": None, "min": None, "max": None, "n": 0}
    assert summary.spread([True, 5]) == {"median": 5, "min": 5, "max": 5, "n": 1}


def test_summarize_keeps_numeric_figures_in_first_seen_order() -> None:
    reps = [
        {"b": 2.0, "a": 10, "reasons": {"x": 1}, "label": "one"},
        {"b": 4.0, "a": None, "c": 7, "reasons": {}, "label": "two"},
        {"b": 3.0, "a": 30},
    ]
    got = summary.summarize(reps)
    assert list(got) == ["b", "a", "c"]
    assert got["b"] == {"median": 3.0, "min": 2.0, "max": 4.0, "n": 3}
    assert got["a"] == {"median": 20.0, "min": 10, "max": 30, "n": 2}
    assert got["c"] == {"median": 7, "min": 7, "max": 7, "n": 1}


def test_a_figure_never_measured_is_summarised_as_none() -> None:
    got = summary.summarize([{"insert_ceiling_rows_per_s": None}, {"insert_ceiling_rows_per_s": None}])
    assert got == {"insert_ceiling_rows_per_s": {"median": None, "min": None, "max": None, "n": 0}}


def _document(reps: list[dict]) -> dict:
    return summary.assemble(
        reps,
        settings={"events": 1000, "reps": len(reps)},
        git={"commit": "abc", "dirty": False},
        machine={"cores": 2, "python": "CPython 3.11.7"},
        started_at="2026-11-22T21:00:00Z",
        wall_s=12.5,
    )


def test_the_document_puts_headline_medians_on_top_and_keeps_the_raw_repetitions() -> None:
    reps = [
        {"ratio_vs_plain": r, "freshness_p99_ms": f, "cpu": {"clickhouse": 0.5}}
        for r, f in ((0.5, 900.0), (0.7, 1100.0), (0.6, math.nan))
    ]
    doc = _document(reps)
    assert doc["ratio_vs_plain"] == 0.6
    assert doc["freshness_p99_ms"] == 1000.0
    assert doc["summary"]["ratio_vs_plain"] == {"median": 0.6, "min": 0.5, "max": 0.7, "n": 3}
    assert doc["commit_p50_ms"] is None  # a headline figure no repetition has
    assert set(summary.HEADLINE) <= set(doc)
    assert doc["git"] == {"commit": "abc", "dirty": False}
    assert doc["machine"]["cores"] == 2
    assert doc["settings"] == {"events": 1000, "reps": 3}
    assert (doc["schema"], doc["started_at"], doc["wall_s"], doc["repetitions_run"]) == (
        summary.SCHEMA,
        "2026-11-22T21:00:00Z",
        12.5,
        3,
    )
    assert doc["repetitions"][2] == {"ratio_vs_plain": 0.6, "freshness_p99_ms": None, "cpu": {"clickhouse": 0.5}}
    assert json.loads(json.dumps(doc, allow_nan=False)) == doc


def test_a_document_needs_a_repetition() -> None:
    with pytest.raises(ValueError, match="at least one repetition"):
        _document([])


def _outcome(mode: str, rows: int, window_s: float, cpu_s: dict[str, float] | None = None) -> Outcome:
    return Outcome(mode=mode, workers=4, rows=rows, window_s=window_s, cpu_s=cpu_s or {})


def _pipeline(aborts: Counter | None = None) -> PipelineFigures:
    return PipelineFigures(
        rows=1_000_000,
        data_txns=8,
        empty_txns=1,
        window_s=20.0,
        commit_ms=[900.0, 1000.0, 1100.0, 2000.0],
        publish_ms=[100.0, 120.0],
        consume_ms=[1000.0],
        aborts=aborts or Counter(),
        wall_s=40.0,
        spark_ready_s=18.0,
        phases=Phases(txns=8, consume_ms=1000, flush_ms=800, turnaround_ms=1000, to_ack_ms=300, chunks_per_txn=4.0),
        cpu_s={"clickhouse": 8.0, "participant python": 6.0, "other": 50.0, "benchmark driver": 3.0},
    )


def test_a_repetition_without_paced_phase() -> None:
    outcomes = [
        _outcome("insert", 1_000_000, 4.0),
        _outcome("loop", 1_000_000, 8.0, {"clickhouse": 5.0, "plain loop": 4.0, "other": 9.0}),
    ]
    got = repetition_figures(outcomes, _pipeline(Counter({"insert failed": 2})), None)
    assert got["plain_rows_per_s"] == 125_000
    assert got["chtxn_rows_per_s"] == 50_000
    assert got["ratio_vs_plain"] == 0.4
    assert got["insert_ceiling_rows_per_s"] == 250_000
    assert got["consume_ceiling_rows_per_s"] is None
    assert (got["commit_p50_ms"], got["commit_p95_ms"], got["publish_p50_ms"]) == (1100.0, 2000.0, 120.0)
    assert got["read_share"] == 0.5
    assert got["cpu_s_per_100k_rows_plain"] == pytest.approx(0.9)  # "other" left out
    assert got["cpu_s_per_100k_rows_chtxn"] == pytest.approx(1.4)  # nor the benchmark's own process
    assert got["cpu_ratio_vs_plain"] == pytest.approx(1.4 / 0.9)  # the two sides of the same repetition
    assert got["freshness_p50_ms"] is None and got["paced_commit_p95_ms"] is None
    assert (got["aborts"], got["abort_reasons"]) == (2, {"insert failed": 2})
    assert json.dumps(got, allow_nan=False)


def test_a_repetition_with_a_paced_phase() -> None:
    run = PacedRun(
        rate=60_000.0,
        sent=600_000,
        seconds=10.0,
        max_behind=500,
        producer_cpu_s=1.5,
        after_backlog=100.0,
        produced_end=111.0,
        visible_end=113.5,
        cpu_s={"clickhouse": 3.0, "paced producer": 1.5, "other": 2.0},
        cpu_window_s=13.0,
    )
    paced = PacedFigures(
        run=run,
        rows=600_000,
        freshness_ms={"p50": 1900.0, "p99": 3900.0, "max": 4300.0},
        data_txns=10,
        commit_ms=[600.0, 700.0, 1500.0],
        publish_ms=[90.0, 110.0],
        aborts=Counter({"participant lost": 1}),
    )
    got = repetition_figures([_outcome("loop", 1_000_000, 8.0)], _pipeline(), paced)
    assert got["cpu_ratio_vs_plain"] is None  # the loop's CPU was not measured: no ratio, not infinity
    assert (got["paced_rate"], got["paced_rate_achieved"], got["paced_drain_s"]) == (60_000.0, 60_000.0, 2.5)
    assert got["paced_load"] == 1.2  # of chtxn's backlog rows/s: more than it can take
    assert (got["freshness_p50_ms"], got["freshness_p99_ms"], got["freshness_max_ms"]) == (1900.0, 3900.0, 4300.0)
    assert (got["paced_commit_p50_ms"], got["paced_commit_p95_ms"]) == (700.0, 1500.0)
    assert got["paced_cpu_s_per_100k_rows_chtxn"] == pytest.approx(0.5)  # producer and "other" left out
    assert got["paced_cores_busy"] == pytest.approx(0.5)  # everything: 3.0 + 2.0 + the producer's own 1.5, in 13 s
    assert got["paced_read_share"] is None  # no control-topic phases given
    assert (got["aborts"], got["paced_aborts"], got["abort_reasons"]) == (1, 1, {"participant lost": 1})


def test_a_worker_that_exits_before_the_second_snapshot_keeps_its_component_and_counts_from_the_first() -> None:
    # A plain-loop worker that has exited but is not reaped yet has no command line left: its
    # CPU is still the loop's, and only what it used between the two snapshots counts.
    before = {10: ("plain loop", 0.5), 11: ("plain loop", 0.4), 12: ("other", 3.0)}
    after = {10: ("plain loop", 1.5), 11: (cpu.EXITED, 1.2), 12: ("other", 3.5), 13: (cpu.EXITED, 2.0)}
    used = cpu.used(before, after)
    assert used == pytest.approx({"plain loop": 1.0 + 0.8, "other": 0.5 + 2.0})


def test_steady_state_leaves_out_the_last_data_txn_which_waits_out_its_interval() -> None:
    # Four txns of one second read 240k rows each; the fifth reads the last 40k, then idles until
    # its END. START to START over the first four is the rate the pipeline held.
    def txn(i: int, rows: int, state: str = "PUBLISHED") -> TxnSummary:
        return TxnSummary(
            txn=f"t{i}", state=state, epoch=1, total_rows=rows, started_at=100.0 + i, committed_at=100.0 + i + 1.4
        )

    txns = [txn(0, 0), *(txn(i, 240_000) for i in range(1, 5)), txn(5, 40_000), txn(6, 0), txn(7, 0, "ABORTED")]
    got = figures_from_ledger(None, txns=txns)  # type: ignore[arg-type]  # the config is read only without txns
    assert (got.rows, got.steady_rows) == (1_000_000, 960_000)
    assert got.rows_per_s == pytest.approx(240_000)
    assert got.drain_rows_per_s == pytest.approx(1_000_000 / 5.4)
    single = figures_from_ledger(None, txns=[txn(1, 240_000)])  # type: ignore[arg-type]  # as above
    assert single.rows_per_s == pytest.approx(240_000 / 1.4)


def test_a_run_comparing_commit_points_never_takes_the_headlines_file_name() -> None:
    assert result_name(["token"], "token", "20261129T001314Z") == "20261129T001314Z.json"
    assert result_name(["keeper"], "keeper", "20261129T001314Z") == "20261129T001314Z-keeper.json"
    compared = [result_name(["token", "keeper"], p, "20261129T001314Z") for p in ("token", "keeper")]
    assert compared == ["commit-point-token-20261129T001314Z.json", "commit-point-keeper-20261129T001314Z.json"]
