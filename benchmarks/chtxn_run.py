"""The chtxn pipeline under benchmark: a coordinator and the ``chtxn participant`` Spark job.

``run`` starts both as ``python -m cli ...`` subprocesses, each in its own process
group (as ``chtxn demo`` does), waits until the target holds every produced event, stops both
(SIGTERM to the group, SIGKILL after a grace period) and reads the figures from the ledger:

- steady-state rows/s: rows of the committed data txns / (last commit time - first data txn's
  START); the coordinator STARTs a txn only once every partition's participant heartbeats, so
  Spark's start-up is outside this window;
- END -> commit point latency (``commit_ms``) p50/p95, commit point -> published (``publish_ms``)
  p50, START -> END (``consume_ms``) p50;
- txns, and aborts with their reasons (shutdown aborts of the idle txn after the last event are
  counted apart);
- the phases of a txn from the control topic (``benchmarks.timeline``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import cpu, timeline
from benchmarks.timeline import Phases
from benchmarks.workload import TARGET, count_rows
from clients.clickhouse import make_client
from coordinator.ledger_store import LedgerStore
from protocol.config import PipelineConfig
from protocol.errors import ChtxnError

REPO = Path(__file__).resolve().parents[1]
SHUTDOWN_REASON = "coordinator shutting down"


@dataclass
class PipelineFigures:
    """What the ledger says of one pipeline run."""

    rows: int
    data_txns: int
    empty_txns: int
    window_s: float
    commit_ms: list[float]
    publish_ms: list[float]
    consume_ms: list[float]
    aborts: Counter = field(default_factory=Counter)  # reason -> count, shutdown aborts excluded
    shutdown_aborts: int = 0
    first_start: float = 0.0  # unix time of the first data txn's START
    wall_s: float = 0.0  # processes started -> every event in the target, Spark start-up included
    spark_ready_s: float = 0.0  # processes started -> first data txn's START
    phases: Phases | None = None  # from the control topic
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by component, first data START -> end
    cpu_window_s: float = 0.0  # the span of those CPU figures

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.window_s if self.window_s > 0 else 0.0


def run(cfg: PipelineConfig, config_path: Path, events: int, logs: Path, *, timeout_s: float = 900.0,
        slots: int | None = None) -> PipelineFigures:
    """Run the pipeline until ``events`` rows are published; both processes are gone on return."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    master = ["--master", f"local[{slots},4]"] if slots else []
    procs: dict[str, subprocess.Popen] = {}
    outputs = []
    started = time.time()
    try:
        for name, argv in (("coordinator", ["coordinator"]), ("participant", ["participant", *master])):
            log = open(logs / f"{name}.log", "w")  # noqa: SIM115 - closed once the process is stopped
            outputs.append(log)
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cli", *argv, "--config", str(config_path)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        snapshots = _wait_for(cfg, events, procs, logs, time.monotonic() + timeout_s)
        wall = time.time() - started
    finally:
        for proc in procs.values():
            stop(proc)
        for log in outputs:
            log.close()
    figures = figures_from_ledger(cfg)
    figures.wall_s = wall
    figures.spark_ready_s = figures.first_start - started
    figures.phases = timeline.phases(timeline.read(cfg, dump=logs / "control.jsonl"))
    before = max((s for s in snapshots if s[0] <= figures.first_start), default=snapshots[0], key=lambda s: s[0])
    figures.cpu_s = cpu.used(before[1], snapshots[-1][1])
    figures.cpu_window_s = snapshots[-1][0] - before[0]
    return figures


def _wait_for(cfg: PipelineConfig, events: int, procs: dict[str, subprocess.Popen], logs: Path,
              deadline: float) -> list[tuple[float, dict]]:
    """Poll until the target holds ``events`` rows; returns a CPU snapshot per poll, with its unix time."""
    snapshots: list[tuple[float, dict]] = []
    while True:
        snapshots.append((time.time(), cpu.snapshot()))
        for name, proc in procs.items():
            if proc.poll() is not None:
                tail = (logs / f"{name}.log").read_text()[-3000:]
                raise ChtxnError(f"the {name} exited with code {proc.returncode} during the benchmark:\n{tail}")
        published = count_rows(cfg, TARGET)
        if published >= events:
            snapshots.append((time.time(), cpu.snapshot()))
            return snapshots
        if time.monotonic() > deadline:
            raise ChtxnError(f"only {published:,} of {events:,} events published before the timeout; logs in {logs}")
        time.sleep(0.5)  # polling period of a progress check, not a synchronisation


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL to it after 60 s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    except ProcessLookupError:
        proc.wait(10)


def figures_from_ledger(cfg: PipelineConfig) -> PipelineFigures:
    client = make_client(cfg.clickhouse)
    try:
        txns = LedgerStore(client, cfg.clickhouse.database, cfg.name).history(limit=100_000)
    finally:
        client.close()
    committed = [t for t in txns if t.state in ("COMMITTED", "PUBLISHED")]
    data = [t for t in committed if t.total_rows]
    if not data:
        raise ChtxnError("the ledger holds no committed txn with rows: the pipeline moved nothing")
    first = min(t.started_at for t in data)
    last = max(t.committed_at for t in data)
    aborted = [t for t in txns if t.state == "ABORTED"]
    aborts = Counter(_short(t.reason) for t in aborted if t.reason != SHUTDOWN_REASON)
    return PipelineFigures(
        rows=sum(t.total_rows for t in data),
        data_txns=len(data),
        empty_txns=len([t for t in committed if not t.total_rows]),
        window_s=last - first,
        commit_ms=sorted(t.commit_ms for t in data if t.commit_ms is not None),
        publish_ms=sorted(t.publish_ms for t in data if t.publish_ms is not None),
        consume_ms=sorted(t.consume_ms for t in data if t.consume_ms is not None),
        aborts=aborts,
        shutdown_aborts=len(aborted) - sum(aborts.values()),
        first_start=first,
    )


def _short(reason: str) -> str:
    return reason.split(":", 1)[0][:60] or "(no reason)"
