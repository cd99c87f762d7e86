"""The chtxn pipeline under benchmark: a coordinator and the ``chtxn participant`` Spark job.

``run`` starts both as ``python -m cli ...`` subprocesses (``Pipeline``), each in its own process
group (as ``chtxn demo`` does), waits until the target holds every produced event, stops both
(SIGTERM to the group, SIGKILL after a grace period) and reads the figures from the ledger
(``figures``; a paced phase, ``benchmarks.paced``, may run in between on the same processes):

- steady-state rows/s: rows of every committed data txn but the last / (the last one's START -
  the first one's START). Each END carries the next START, so these txns cover that span without
  a gap, all of it with a backlog to read. The last txn is left out: it reads what is left of the
  backlog, then waits out its interval with nothing to read, which would count up to one
  ``interval_s`` of idling against the pipeline (with 1M events at ~240k rows/s, 4 or 5 txns,
  whichever the rate falls on: a 20% swing). The coordinator STARTs a txn only once every
  partition's participant heartbeats, so Spark's start-up is outside this window. With a single
  data txn: its rows / (its commit - its START);
- drain rows/s: every row / (last commit - first data START), the last txn's wait included;
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
from benchmarks.timeline import Phases, TxnTimes
from benchmarks.workload import DATABASE, TARGET
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from protocol.config.parse import PipelineConfig
from protocol.errors import ChtxnError
from protocol.ledger.view import TxnSummary

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
    cpu_since: float = 0.0  # unix time at which that span starts
    txn_ids: list[str] = field(default_factory=list)  # the data txns these figures come from

    steady_rows: int = 0  # rows of the data txns but the last (see the module's docstring)
    steady_window_s: float = 0.0  # the first data START -> the last data txn's START

    @property
    def rows_per_s(self) -> float:
        """Steady-state rows/s (the module's docstring)."""
        return self.steady_rows / self.steady_window_s if self.steady_window_s > 0 else self.drain_rows_per_s

    @property
    def drain_rows_per_s(self) -> float:
        """Every row / (last commit - first data START)."""
        return self.rows / self.window_s if self.window_s > 0 else 0.0


def run(
    cfg: PipelineConfig, config_path: Path, events: int, logs: Path, *, timeout_s: float = 900.0
) -> PipelineFigures:
    """Run the pipeline until ``events`` rows are published; both processes are gone on return."""
    with Pipeline(config_path, logs) as pipeline:
        snapshots = pipeline.wait_for_rows(cfg, events, time.monotonic() + timeout_s)
    return figures(cfg, pipeline, snapshots, logs)


class Pipeline:
    """The coordinator and the participant job as subprocesses, for the span of a ``with`` block.

    Entering starts both (each in its own process group, the job on ``chtxn participant``'s default
    master); leaving stops both, SIGTERM then SIGKILL. ``started`` is the unix time they were started.
    """

    def __init__(self, config_path: Path, logs: Path) -> None:
        self.config_path, self.logs = config_path, logs
        self.procs: dict[str, subprocess.Popen] = {}
        self._outputs: list = []
        self.started = 0.0

    def __enter__(self) -> Pipeline:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
        self.started = time.time()
        try:
            for name, argv in (("coordinator", ["coordinator"]), ("participant", ["participant"])):
                log = open(self.logs / f"{name}.log", "w")  # closed once the process is stopped
                self._outputs.append(log)
                self.procs[name] = subprocess.Popen(
                    [sys.executable, "-m", "cli", *argv, "--config", str(self.config_path)],
                    cwd=REPO,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            stop(proc)
        for log in self._outputs:
            log.close()
        self._outputs.clear()

    def check(self) -> None:
        """Raise if the coordinator or the participant job has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text()[-3000:]
                raise ChtxnError(f"the {name} exited with code {proc.returncode} during the benchmark:\n{tail}")

    def wait_for_rows(self, cfg: PipelineConfig, rows: int, deadline: float) -> list[tuple[float, dict]]:
        """Poll until the target holds ``rows`` rows; returns a CPU snapshot per poll, with its unix time."""
        snapshots: list[tuple[float, dict]] = []
        client = make_client(cfg.clickhouse)  # one for every poll: a client costs the server 3 queries to set up
        try:
            while True:
                snapshots.append((time.time(), cpu.snapshot()))
                self.check()
                published = int(client.command(f"SELECT count() FROM {DATABASE}.{TARGET}"))  # type: ignore[arg-type]  # count(): an int
                if published >= rows:
                    snapshots.append((time.time(), cpu.snapshot()))
                    return snapshots
                if time.monotonic() > deadline:
                    raise ChtxnError(
                        f"only {published:,} of {rows:,} rows published before the timeout; logs in {self.logs}"
                    )
                time.sleep(0.5)  # polling period of a progress check, not a synchronisation
        finally:
            client.close()


def figures(
    cfg: PipelineConfig,
    pipeline: Pipeline,
    snapshots: list[tuple[float, dict]],
    logs: Path,
    *,
    txns: list[TxnSummary] | None = None,
    control: dict[str, TxnTimes] | None = None,
) -> PipelineFigures:
    """The figures of the backlog that ``snapshots`` (from ``wait_for_rows``) covered, after the run.

    Only the data txns committed by the last snapshot count, so txns of a later paced phase are
    left out. ``txns`` (the ledger's history) and ``control`` (``timeline.read``) are read here
    unless given.
    """
    until = snapshots[-1][0]
    result = figures_from_ledger(cfg, until=until, txns=txns)
    result.wall_s = until - pipeline.started
    result.spark_ready_s = result.first_start - pipeline.started
    if control is None:
        control = timeline.read(cfg, dump=logs / "control.jsonl")
    result.phases = timeline.phases({k: control[k] for k in result.txn_ids if k in control})
    before = max((s for s in snapshots if s[0] <= result.first_start), default=snapshots[0], key=lambda s: s[0])
    result.cpu_s = cpu.used(before[1], snapshots[-1][1])
    result.cpu_window_s = snapshots[-1][0] - before[0]
    result.cpu_since = before[0]
    return result


def stop_on_sigterm() -> None:
    """Make SIGTERM (``kill``, a CI job's timeout) leave like Ctrl-C does: every ``with`` and
    ``finally`` block runs, so the processes a benchmark started in sessions of their own (the
    coordinator, the participant job, the paced producer) are stopped with it, not left running."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))


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


def ledger_history(cfg: PipelineConfig) -> list[TxnSummary]:
    """Every txn of the pipeline in the ledger, newest first."""
    client = make_client(cfg.clickhouse)
    try:
        return LedgerHistory(client, cfg.clickhouse.database, cfg.name).history(limit=100_000)
    finally:
        client.close()


def figures_from_ledger(
    cfg: PipelineConfig, *, until: float = float("inf"), txns: list[TxnSummary] | None = None
) -> PipelineFigures:
    """The ledger's figures of the txns started by ``until`` (unix time), data txns committed by then."""
    txns = [t for t in (ledger_history(cfg) if txns is None else txns) if t.started_at <= until]
    committed = [t for t in txns if t.state in ("COMMITTED", "PUBLISHED")]
    data = [t for t in committed if t.total_rows and t.committed_at <= until]
    if not data:
        raise ChtxnError("the ledger holds no committed txn with rows: the pipeline moved nothing")
    first = min(t.started_at for t in data)
    last = max(t.committed_at for t in data)
    *full, tail = sorted(data, key=lambda t: t.started_at)
    aborted = [t for t in txns if t.state == "ABORTED"]
    aborts = Counter(short_reason(t.reason) for t in aborted if t.reason != SHUTDOWN_REASON)
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
        txn_ids=[t.txn for t in data],
        steady_rows=sum(t.total_rows for t in full),
        steady_window_s=tail.started_at - first if full else 0.0,
    )


def short_reason(reason: str) -> str:
    return reason.split(":", 1)[0][:60] or "(no reason)"
