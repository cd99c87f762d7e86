"""The paced phase: events at a fixed rate into a running pipeline, and how fresh they are.

It runs on the processes of ``chtxn_run.Pipeline`` once they have published the backlog, so
Spark's start-up and the catch-up are behind it:

1. wait for ClickHouse's merges of the backlog (``workload.settle``);
2. start ``benchmarks.producer`` (a subprocess): ``rate`` events/s for ``seconds``, each JSON event
   carrying its produce time in ``produced_at_ms``; the pipeline runs as it is configured;
3. when the producer has flushed, wait until the target holds every event (``drain_s``).

After the pipeline has stopped, ``figures`` reads:

- **freshness** per row = ``published_at`` of the txn whose offset range holds the row (ledger)
  - its ``produced_at_ms``, p50/p99/max over every paced row, computed in ClickHouse with an
  ``ASOF JOIN`` of the target on the published ranges: nothing per row in Python, and nothing
  added to the pipeline's own path (the participant inserts the JSON as it is);
- END -> commit point (``commit_ms``) p50/p95 and commit point -> published p50 of the txns
  committed after the backlog, i.e. while not catching up;
- aborts, the phases of those txns (control topic), and CPU by component while producing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import cpu, timeline
from benchmarks.chtxn_run import REPO, SHUTDOWN_REASON, Pipeline, short_reason
from benchmarks.timeline import Phases, TxnTimes
from benchmarks.workload import DATABASE, PRODUCED_AT, TARGET, TOPIC, settle
from clients.clickhouse import make_client
from protocol.config.parse import PipelineConfig
from protocol.errors import ChtxnError
from protocol.ledger.view import TxnSummary


@dataclass
class PacedRun:
    """What happened while producing: the producer's own report and the times around it."""

    rate: float  # the schedule, events/s
    sent: int
    seconds: float  # the producing span
    max_behind: int  # most events the producer was behind its schedule
    producer_cpu_s: float
    after_backlog: float  # unix time the backlog was all published: later data txns are paced ones
    produced_end: float  # unix time the producer had flushed
    visible_end: float  # unix time the target held every paced event
    cpu_s: dict[str, float] = field(default_factory=dict)  # by component, producer start -> all visible
    cpu_window_s: float = 0.0

    @property
    def achieved_rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def drain_s(self) -> float:
        return self.visible_end - self.produced_end

    @property
    def cores_busy(self) -> float:
        """Cores the whole machine kept busy from the producer's start until every event was
        visible: every process (the producer, the stack, other load), not only the pipeline's."""
        used = sum(s for c, s in self.cpu_s.items() if c != "paced producer") + self.producer_cpu_s
        return used / self.cpu_window_s if self.cpu_window_s > 0 else 0.0


@dataclass
class PacedFigures:
    """The paced phase's figures, once the pipeline has stopped."""

    run: PacedRun
    rows: int  # paced rows matched to a published txn
    freshness_ms: dict[str, float]  # p50, p99, max
    data_txns: int
    commit_ms: list[float]
    publish_ms: list[float]
    aborts: Counter = field(default_factory=Counter)  # reason -> count, shutdown aborts excluded
    phases: Phases | None = None


def run(
    cfg: PipelineConfig,
    pipeline: Pipeline,
    *,
    backlog_rows: int,
    after_backlog: float,
    rate: float,
    seconds: float,
    logs: Path,
    timeout_s: float = 900.0,
) -> PacedRun:
    """Steps 1-3 on a running ``pipeline`` whose target holds ``backlog_rows`` rows."""
    if rate <= 0 or seconds <= 0:
        raise ChtxnError(f"the paced phase needs a positive rate and duration, got {rate:g} events/s for {seconds:g} s")
    settle(cfg)  # Step 1
    before = cpu.snapshot()
    since = time.time()
    argv = [
        sys.executable,
        "-m",
        "benchmarks.producer",
        "--bootstrap",
        cfg.kafka.bootstrap_servers,
        "--topic",
        TOPIC,
        "--rate",
        repr(rate),
        "--seconds",
        repr(seconds),
    ]
    with open(logs / "producer.log", "w") as errors:  # Step 2
        producer = subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        deadline = time.monotonic() + seconds + 180
        try:
            while producer.poll() is None:
                pipeline.check()
                if time.monotonic() > deadline:
                    raise ChtxnError(f"the paced producer did not finish within {seconds + 180:g} s")
                time.sleep(0.5)  # polling period of a liveness check
            out = producer.stdout.read() if producer.stdout else ""
        finally:
            if producer.poll() is None:
                producer.kill()
            producer.wait()
    produced_end = time.time()
    if producer.returncode != 0 or not out.strip():
        raise ChtxnError(f"the paced producer failed (exit {producer.returncode}); see {logs / 'producer.log'}")
    report = json.loads(out.strip().splitlines()[-1])
    if report["failed"]:
        raise ChtxnError(f"{report['failed']} paced events were not acknowledged: {report['first_error']}")
    # Step 3
    snapshots = pipeline.wait_for_rows(cfg, backlog_rows + report["sent"], time.monotonic() + timeout_s)
    return PacedRun(
        rate=rate,
        sent=report["sent"],
        seconds=report["seconds"],
        max_behind=report["max_behind"],
        producer_cpu_s=report["cpu_s"],
        after_backlog=after_backlog,
        produced_end=produced_end,
        visible_end=snapshots[-1][0],
        cpu_s=cpu.used(before, snapshots[-1][1]),
        cpu_window_s=snapshots[-1][0] - since,
    )


def figures(cfg: PipelineConfig, paced: PacedRun, txns: list[TxnSummary], control: dict[str, TxnTimes]) -> PacedFigures:
    """The paced figures from the ledger's ``txns`` and the control topic's ``control`` times."""
    later = [t for t in txns if t.started_at > paced.after_backlog or t.committed_at > paced.after_backlog]
    data = [t for t in later if t.state in ("COMMITTED", "PUBLISHED") and t.total_rows]
    aborts = Counter(short_reason(t.reason) for t in later if t.state == "ABORTED" and t.reason != SHUTDOWN_REASON)
    rows, freshness = freshness_ms(cfg, [t for t in txns if t.state == "PUBLISHED"])
    return PacedFigures(
        run=paced,
        rows=rows,
        freshness_ms=freshness,
        data_txns=len(data),
        commit_ms=sorted(t.commit_ms for t in data if t.commit_ms is not None),
        publish_ms=sorted(t.publish_ms for t in data if t.publish_ms is not None),
        aborts=aborts,
        phases=timeline.phases({t.txn: control[t.txn] for t in data if t.txn in control}),
    )


def freshness_ms(cfg: PipelineConfig, published: list[TxnSummary]) -> tuple[int, dict[str, float]]:
    """(rows, {p50, p99, max}) of published_at(txn holding the row) - produced_at_ms over the paced rows."""
    ranges = [
        (r.partition, r.start, r.end, round(t.published_at * 1000))
        for t in published
        for r in t.ranges
        if r.topic == TOPIC and r.end > r.start
    ]
    if not ranges:
        raise ChtxnError("the ledger holds no published range: nothing to measure freshness against")
    values = ", ".join(f"({p}, {s}, {e}, {ms})" for p, s, e, ms in ranges)
    sql = f"""
        SELECT count(), quantileExact(0.5)(f), quantileExact(0.99)(f), max(f)
        FROM (
            SELECT r.published_ms - e.{PRODUCED_AT} AS f
            FROM (SELECT _partition, _offset, {PRODUCED_AT} FROM {DATABASE}.{TARGET} WHERE {PRODUCED_AT} > 0) AS e
            ASOF INNER JOIN (
                SELECT * FROM values('partition Int32, start Int64, stop Int64, published_ms Int64', {values})
            ) AS r ON e._partition = r.partition AND e._offset >= r.start
            WHERE e._offset < r.stop
        )"""
    client = make_client(cfg.clickhouse)
    try:
        count, p50, p99, worst = client.query(sql).result_rows[0]
    finally:
        client.close()
    return int(count), {"p50": float(p50), "p99": float(p99), "max": float(worst)}
