"""Coordinator features past the basic commit, against the embedded stack: insert-select publish
with materialized views, refusals at start, orphan clean-up at take-over, metrics, SIGTERM.

Test code plays the participants; every test that moves data ends with the exactly-once oracle
of docs/architecture.md §11.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from coordinator.lanes import LANES
from coordinator.leader import Leader
from coordinator.metrics import LEADER_STEPS
from coordinator.service import CoordinatorService
from coordinator.stage.sets import StageSet
from coordinator.stage.tables import StageTables
from protocol import naming
from protocol.config.parse import PipelineConfig
from protocol.errors import SetupError
from protocol.ledger.rows import LedgerEvent, LedgerRow
from tests.helpers import unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import TARGET_DDL, Pipeline, assert_exactly_once, make_pipeline

REPO = Path(__file__).resolve().parents[2]
CHTXN = Path(sys.executable).with_name("chtxn")  # the console script of the installed distribution
DEDUP_TARGET_DDL = TARGET_DDL.rstrip() + "\nSETTINGS non_replicated_deduplication_window = 1000\n"


class ServiceThread:
    """A coordinator replica on a thread. Leaving the ``with`` block is its SIGTERM; an error that
    ended the thread and was not taken with ``ended()`` is raised there."""

    def __init__(self, cfg: PipelineConfig, coordinator_id: str = "c1", **service_kwargs: object) -> None:
        cfg = msgspec.structs.replace(cfg, coordinator=msgspec.structs.replace(cfg.coordinator, id=coordinator_id))
        self.service = CoordinatorService(cfg, **service_kwargs)
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"coordinator-{coordinator_id}", daemon=True)

    def _run(self) -> None:
        try:
            self.service.run(self.stop)
        except BaseException as exc:  # handed to the test by ended() or __exit__
            self.error = exc

    def __enter__(self) -> ServiceThread:
        self.thread.start()
        return self

    def ended(self, timeout_s: float, what: str) -> BaseException | None:
        """Wait for the replica to end on its own; return (and take) the error that ended it."""
        wait_until(lambda: not self.thread.is_alive(), timeout_s, what)
        error, self.error = self.error, None
        return error

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "coordinator did not stop within 60 s of its stop signal"
        if self.error is not None:
            raise self.error


def spawn_chtxn(pipeline: Pipeline, coordinator_id: str, log_path: Path, *extra: str) -> subprocess.Popen:
    """``chtxn coordinator --config F`` as its own process, its output in ``log_path``."""
    env = {**os.environ, "CHTXN_COORDINATOR_ID": coordinator_id, "PYTHONPATH": str(REPO)}
    with log_path.open("w") as log:
        return subprocess.Popen(
            [str(CHTXN), "coordinator", "--config", str(pipeline.config_path), *extra],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        proc.wait(30)


def add_view(pipeline: Pipeline, *, dedup: bool = True) -> None:
    """``events_mv``: rows and amount per source partition, into ``totals_by_partition``."""
    db = f"`{pipeline.cfg.clickhouse.database}`"
    client = pipeline.client()
    client.command(
        f"CREATE TABLE {db}.totals_by_partition (_partition Int32, rows UInt64, amount Float64) "
        "ENGINE = MergeTree ORDER BY _partition"
        + (" SETTINGS non_replicated_deduplication_window = 1000" if dedup else "")
    )
    client.command(
        f"CREATE MATERIALIZED VIEW {db}.events_mv TO {db}.totals_by_partition AS "
        f"SELECT _partition, count() AS rows, sum(amount) AS amount FROM {db}.events GROUP BY _partition"
    )


def per_partition(pipeline: Pipeline, table: str, rows: str) -> list[tuple]:
    db = f"`{pipeline.cfg.clickhouse.database}`"
    return (
        pipeline.client()
        .query(f"SELECT _partition, {rows}, sum(amount) FROM {db}.{table} GROUP BY _partition ORDER BY _partition")
        .result_rows
    )


def assert_view_matches_target(pipeline: Pipeline, produced: int) -> None:
    view = per_partition(pipeline, "totals_by_partition", "sum(rows)")
    assert sum(r[1] for r in view) == produced, f"the view counted {view}, the target holds {produced} rows"
    assert view == per_partition(pipeline, "events", "count()")


# ---- 1. insert-select fires the views, and a repeated publish stores rows once ----------------


class Crash(BaseException):
    """Ends the coordinator thread at once, as SIGKILL ends a process: the leader does no clean-up."""


class CrashBeforeDrop(StageTables):
    """Publishes, then dies between the INSERT and the PUBLISHED row of the first txn that has rows."""

    def publish(self, stage: str, txn: str, on_move: object = None) -> int:
        rows = super().publish(stage, txn, on_move)
        if rows:
            raise Crash(stage)
        return rows


class CrashingPublishLeader(Leader):
    def __init__(self, cfg: PipelineConfig, *, stages: StageSet, **kwargs: object) -> None:
        (table, one), *_ = stages.tables.items()
        crashing = CrashBeforeDrop(
            one.client, database=one.database, target=one.target, pipeline=one.pipeline, publish_mode=one.publish_mode
        )
        super().__init__(cfg, stages=StageSet({table: crashing}), **kwargs)


def test_insert_select_fires_the_views_and_a_repeated_publish_stores_rows_once(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("inssel"),
        target_ddl=DEDUP_TARGET_DDL,
        settings={"transaction.publish_mode": "insert-select"},
    )
    add_view(pipeline)
    produced = pipeline.produce(1_000)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        with ServiceThread(pipeline.cfg, "crasher", leader_class=CrashingPublishLeader) as crasher:
            crash = crasher.ended(60, "the leader to die between the publish INSERT and the PUBLISHED row")
        assert isinstance(crash, Crash), crash
        stage = crash.args[0]
        txn = naming.txn_of_stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, stage)
        assert pipeline.ledger().txn(txn).state == "COMMITTED"
        assert stage in pipeline.stage_tables(), "the crash left the published stage table behind"
        assert pipeline.target_count() == produced
        assert_view_matches_target(pipeline, produced)

        with ServiceThread(pipeline.cfg, "restarted"):
            wait_until(lambda: pipeline.ledger().txn(txn).state == "PUBLISHED", 30, f"{txn} published again")
            assert stage not in pipeline.stage_tables()
            assert pipeline.target_count() == produced, "the repeated publish stored rows twice"
            assert_view_matches_target(pipeline, produced)
            more = pipeline.produce(500, start_id=produced)
            wait_until(lambda: pipeline.target_count() == produced + more, 60, "the second batch published")
            produced += more
    assert_view_matches_target(pipeline, produced)
    assert_exactly_once(pipeline, produced)


# ---- 2. refusals at start -------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, target_dedup, view, expected",
    [
        (
            "move",
            False,
            "dedup",
            ["has dependent materialized views (", ".events_mv)", 'set transaction.publish_mode = "insert-select"'],
        ),
        (
            "insert-select",
            False,
            None,
            [
                "publish_mode insert-select needs deduplication on",
                "MODIFY SETTING non_replicated_deduplication_window = 1000",
            ],
        ),
        (
            "insert-select",
            True,
            "no-dedup",
            [
                ".events_mv on ",
                "writes to ",
                ".totals_by_partition, which does not deduplicate",
                "MODIFY SETTING non_replicated_deduplication_window = 1000",
            ],
        ),
        (
            "insert-select",
            "zero",
            None,
            [
                "publish_mode insert-select needs deduplication on",
                "MODIFY SETTING non_replicated_deduplication_window = 1000",
            ],
        ),
    ],
)
def test_a_publish_that_cannot_be_exactly_once_is_refused(stack, tmp_path, mode, target_dedup, view, expected):
    ddl = {
        True: DEDUP_TARGET_DDL,
        False: TARGET_DDL,
        "zero": TARGET_DDL.rstrip() + "\nSETTINGS non_replicated_deduplication_window = 0\n",
    }[target_dedup]
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("refuse"), settings={"transaction.publish_mode": mode}, target_ddl=ddl
    )
    if view is not None:
        add_view(pipeline, dedup=view == "dedup")
    with ServiceThread(pipeline.cfg) as replica:
        error = replica.ended(60, "the coordinator to refuse to lead")
    assert isinstance(error, SetupError), error
    for fragment in expected:
        assert fragment in str(error)


def test_chtxn_coordinator_exits_1_naming_the_view(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("refusecli"))
    add_view(pipeline)
    proc = subprocess.run(
        [str(CHTXN), "coordinator", "--config", str(pipeline.config_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    db = pipeline.cfg.clickhouse.database
    assert f"chtxn: target table {db}.events has dependent materialized views ({db}.events_mv)" in proc.stderr
    assert 'set transaction.publish_mode = "insert-select"' in proc.stderr


def test_a_coordinator_with_a_missing_target_exits_before_it_claims_an_epoch(stack, tmp_path):
    """Its config is checked against the server before the lease: a wrong target_table must not
    take the real pipeline's lease (a new epoch fences the running leader) on its way out."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("wrongtarget"))
    proc = subprocess.run(
        [str(CHTXN), "coordinator", "--config", str(pipeline.config_path)],
        env={**os.environ, "PYTHONPATH": str(REPO), "CHTXN_CLICKHOUSE_TARGET_TABLE": "nosuch"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"chtxn: target table {pipeline.cfg.clickhouse.database}.nosuch does not exist")
    ), proc.stderr
    assert pipeline.ledger().max_epoch() == 0, "the coordinator claimed an epoch before checking its target"


# ---- 3. orphan stage tables at take-over ----------------------------------------------------


def test_orphan_stage_table_is_dropped_and_aborted_at_take_over(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("orphan"))
    db, target = f"`{pipeline.cfg.clickhouse.database}`", pipeline.cfg.clickhouse.target_table
    orphan = naming.stage_table(target, pipeline.cfg.name, "e99_t1")
    client = pipeline.client()
    client.command(f"CREATE TABLE {db}.`{orphan}` AS {db}.{target}")
    client.command(
        f"INSERT INTO {db}.`{orphan}` SELECT number, 'orphan', 1.0, '{pipeline.topic}', 0, number FROM numbers(50)"
    )  # the same offsets the real records have: a leak would duplicate them
    produced = pipeline.produce(400)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg):
        summary = wait_until(lambda: pipeline.ledger().txn("e99_t1"), 30, "a ledger row for the orphan's txn")
        assert summary.state == "ABORTED"
        assert "orphan" in summary.reason
        assert orphan not in pipeline.stage_tables()
        wait_until(lambda: pipeline.target_count() == produced, 60, "all rows published")
    assert int(client.command(f"SELECT count() FROM {db}.{target} WHERE user = 'orphan'")) == 0
    assert_exactly_once(pipeline, produced)


def test_an_unused_spare_stage_table_is_dropped_at_take_over_without_an_abort(stack, tmp_path):
    """A dead leader's spare (made one txn ahead, no row, no ledger row) leaves no ABORTED row; an
    empty stage table whose txn reached the ledger still does."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("spare"))
    db, target = f"`{pipeline.cfg.clickhouse.database}`", pipeline.cfg.clickhouse.target_table
    spare = naming.stage_table(target, pipeline.cfg.name, "e99_t2")
    started = naming.stage_table(target, pipeline.cfg.name, "e99_t1")
    client = pipeline.client()
    for table in (spare, started):
        client.command(f"CREATE TABLE {db}.`{table}` AS {db}.{target}")
    pipeline.ledger().append(LedgerRow(pipeline=pipeline.cfg.name, txn="e99_t1", event=LedgerEvent.STARTED, epoch=99))
    produced = pipeline.produce(100)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg):
        wait_until(lambda: pipeline.target_count() == produced, 60, "all rows published")
        assert not {spare, started} & set(pipeline.stage_tables())
    assert pipeline.ledger().txn("e99_t2") is None, "the unused spare left a ledger row"
    assert pipeline.ledger().txn("e99_t1").state == "ABORTED"
    assert_exactly_once(pipeline, produced)


# ---- 4. Prometheus metrics ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample on ``/metrics``, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_lane_action_is_a_named_leader_step():
    assert set(LEADER_STEPS) == set(LANES)
    assert len(set(LEADER_STEPS.values())) == len(LEADER_STEPS)


def test_metrics_count_commits_rows_latency_and_aborts(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("metrics"),
        settings={"transaction.write_status_timeout_s": 3.0, "transaction.heartbeat_misses": 5},
    )
    name = pipeline.cfg.name
    port = free_port()

    def value(metric: str, **labels: str) -> float:
        samples = scrape(port)
        return samples[(metric, tuple(sorted({"pipeline": name, **labels}.items())))]

    produced = pipeline.produce(600)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants:
        proc = spawn_chtxn(pipeline, "metered", tmp_path / "metered.log", "--metrics-port", str(port))
        try:
            wait_until(lambda: pipeline.target_count() == produced, 60, "the first batch published")
            assert value("chtxn_transactions_total", outcome="committed") > 0
            assert value("chtxn_rows_committed_total") == produced
            assert value("chtxn_leader") == 1
            assert value("chtxn_commit_latency_seconds_count") > 0
            assert value("chtxn_flush_latency_seconds_count") > 0
            for step in ("create-stage", "check", "commit", "publish"):  # steps 2, 5, 6 and 7 of a txn
                # A step is timed once it returns; publish returns after the rows are visible.
                wait_until(
                    lambda step=step: value("chtxn_leader_step_seconds_count", step=step) > 0,
                    30,
                    f"the leader's {step} step timed",
                )

            participants.knobs.withhold_status = {pipeline.partitions[1]}
            more = pipeline.produce(300, start_id=produced)
            wait_until(
                lambda: value("chtxn_aborts_total", reason="write-status-timeout") > 0,
                30,
                "a write-status-timeout abort counted",
                ignore=(urllib.error.URLError,),
            )
            assert value("chtxn_transactions_total", outcome="aborted") > 0
            participants.knobs.withhold_status = set()
            produced += more
            wait_until(lambda: pipeline.target_count() == produced, 60, "the second batch published")
            assert value("chtxn_rows_committed_total") == produced
        finally:
            stop_process(proc)
    assert proc.returncode == 0, (tmp_path / "metered.log").read_text()
    assert_exactly_once(pipeline, produced)


# ---- 5. SIGTERM -----------------------------------------------------------------------------


def test_sigterm_aborts_the_open_txn_drops_its_stage_and_exits_0(stack, tmp_path):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("sigterm"), settings={"transaction.write_status_timeout_s": 60.0}
    )
    held = pipeline.partitions[1]
    produced = pipeline.produce(500)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants:
        proc = spawn_chtxn(pipeline, "terminated", tmp_path / "terminated.log")
        try:
            wait_until(lambda: pipeline.target_count() == produced, 60, "the first batch published")
            participants.knobs.withhold_status = {held}
            produced += pipeline.produce(300, start_id=produced)
            txn, _ = wait_until(
                lambda: participants.withheld and participants.withheld[0],
                30,
                "a txn waiting for a withheld WRITE-STATUS",
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, (tmp_path / "terminated.log").read_text()
        finally:
            stop_process(proc)
        assert pipeline.stage_tables() == [], "SIGTERM left a stage table"
        summary = pipeline.ledger().txn(txn)
        assert summary.state == "ABORTED"
        assert "coordinator shutting down" in summary.reason

        participants.knobs.withhold_status = set()
        with ServiceThread(pipeline.cfg, "successor"):
            wait_until(lambda: pipeline.target_count() == produced, 60, "every row published by the successor")
    assert_exactly_once(pipeline, produced)
