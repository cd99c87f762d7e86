"""The participant job on a real Spark standalone cluster: a master and two workers of 2 cores
(``tests/spark_cluster.py``), ``chtxn participant --master spark://...`` against the embedded stack
with a coordinator. The workers have nothing of chtxn: their executors run the packed environment
that the launcher ships with ``--archives``, and the tests check that in the executors' processes.
Every pipeline test ends with the exactly-once oracle.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cli.packaging import ARCHIVE_ALIAS
from procs import start_token
from tests.e2e.processes import Processes, committed
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline
from tests.spark_cluster import SparkCluster, Worker, process_table

pytestmark = pytest.mark.e2e

#: Two executors of 2 cores (one per worker), and the job starts only once both are registered,
#: so its tasks are spread over both workers.
CLUSTER_CONF = (
    "spark.executor.memory=512m",
    "spark.cores.max=4",
    "spark.scheduler.minRegisteredResourcesRatio=1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
)


def start_participants(
    procs: Processes, cluster: SparkCluster, cache_dir: Path, *extra: str, conf: tuple[str, ...] = CLUSTER_CONF
) -> subprocess.Popen:
    argv = ["participant", "--master", cluster.url, "--cache-dir", str(cache_dir), *extra]
    for item in conf:
        argv += ["--conf", item]
    return procs.start("participant", *argv)


def participants_by_worker(cluster: SparkCluster) -> dict[int, list[int]]:
    table = process_table()
    return {w.index: cluster.participant_processes(w, table) for w in cluster.workers}


def assert_runs_the_archive(cluster: SparkCluster, worker: Worker) -> None:
    """The worker's executors run ``./environment/bin/python`` from the shipped archive, and their
    participants load their compiled dependencies from it, nothing from this test's virtualenv."""
    pythons = cluster.python_processes(worker)
    assert pythons, f"no Python process under the executors of worker {worker.index}"
    ours = str(Path(sys.prefix).resolve())
    work_dir = re.escape(str(worker.work_dir.resolve()))
    environment = re.compile(rf"^{work_dir}/app-[^/]+/\d+/{ARCHIVE_ALIAS}/lib/python3\.\d+/site-packages/")
    kafka_from_archive = False
    for pid in pythons:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        cwd = Path(f"/proc/{pid}/cwd").resolve()
        assert os.path.normpath(cwd / argv0) == str(cwd / ARCHIVE_ALIAS / "bin" / "python"), (pid, argv0, cwd)
        mapped = {
            line.split(None, 5)[5]
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split(None, 5)) == 6 and line.split(None, 5)[5].startswith("/")
        }
        assert not [m for m in mapped if m.startswith(ours + "/")], f"pid {pid} maps files of the test's venv {ours}"
        kafka = [m for m in mapped if "/confluent_kafka/cimpl" in m]
        assert all(environment.match(m) for m in kafka), kafka
        kafka_from_archive |= bool(kafka)
    assert kafka_from_archive, f"no participant of worker {worker.index} has loaded confluent_kafka"


#: One 1-core executor on each worker (the master spreads executors out), so the two tasks run on
#: different workers; a lost executor is replaced on the survivor, which has a core to spare.
ONE_TASK_PER_WORKER = (
    *[c for c in CLUSTER_CONF if not c.startswith("spark.cores.max=")],
    "spark.cores.max=2",
    "spark.executor.cores=1",
)


def run_pipeline(
    pipeline: Pipeline, tmp_path: Path, cluster: SparkCluster, cache_dir: Path, conf: tuple[str, ...] = CLUSTER_CONF
) -> Processes:
    procs = Processes(pipeline, tmp_path)
    procs.coordinator()
    start_participants(procs, cluster, cache_dir, conf=conf)
    return procs


def test_a_clean_run_on_a_standalone_cluster_is_exactly_once(stack, tmp_path, spark_cluster, executor_archive_dir):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("cluclean"),
        partitions=2,
        settings={"participant.task_slots": 2, "participant.chunk_rows": 2_000},
    )
    produced = pipeline.produce(20_000)
    procs = run_pipeline(pipeline, tmp_path, spark_cluster, executor_archive_dir)
    try:
        committed(pipeline, produced, procs)
        placed = wait_until(
            lambda: (
                sum(map(len, participants_by_worker(spark_cluster).values())) >= 2
                and participants_by_worker(spark_cluster)
            ),
            60,
            "two participant tasks running",
        )
        for worker in spark_cluster.workers:
            if placed[worker.index]:
                assert_runs_the_archive(spark_cluster, worker)
        more = pipeline.produce(10_000, start_id=produced)
        committed(pipeline, produced + more, procs)
    finally:
        procs.stop_all()
    assert_exactly_once(pipeline, produced + more)


def test_a_worker_and_its_executor_sigkilled_mid_txn(stack, tmp_path, spark_cluster, executor_archive_dir):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("clukill"),
        partitions=2,
        settings={"participant.task_slots": 2, "participant.chunk_rows": 2_000},
    )
    produced = pipeline.produce(20_000)
    procs = run_pipeline(pipeline, tmp_path, spark_cluster, executor_archive_dir, conf=ONE_TASK_PER_WORKER)
    try:
        wait_until(lambda: procs.alive() or pipeline.target_count() > 0, 180, "the first rows committed")
        wait_until(lambda: all(participants_by_worker(spark_cluster).values()), 60, "a participant on each worker")
        victim, survivor = spark_cluster.workers
        orphans = {pid: start_token(pid) for pid in spark_cluster.python_processes(victim)}
        more = pipeline.produce(40_000, start_id=produced)
        assert pipeline.target_count() < produced + more, "everything was committed before the kill"
        spark_cluster.kill_worker(victim)
        wait_until(
            lambda: not any(start_token(pid) == token for pid, token in orphans.items()),
            60,
            "the Python processes of the killed executor to exit",
        )
        committed(pipeline, produced + more, procs)
        assert len(spark_cluster.participant_processes(survivor)) >= 2, "the lost task did not move to the survivor"
        assert_runs_the_archive(spark_cluster, survivor)
    finally:
        procs.stop_all()
    assert_exactly_once(pipeline, produced + more)
    reasons = [t.reason for t in pipeline.ledger().history(limit=1000, state="ABORTED")]
    assert any("stopped sending heartbeats" in r for r in reasons), reasons


def test_more_task_groups_than_slots_is_refused_saying_what_to_do(stack, tmp_path, spark_cluster, executor_archive_dir):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("cluslots"), partitions=6, settings={"participant.task_slots": 6}
    )
    procs = Processes(pipeline, tmp_path)
    try:
        job = start_participants(procs, spark_cluster, executor_archive_dir, "--startup-timeout", "30")
        code = job.wait(300)
    finally:
        procs.stop_all()
    log = procs.tail("participant")
    assert code == 5, log  # a Spark problem (docs/operations.md, "When the participant job stops")
    match = re.search(
        r"the participant job needs 6 task slots running at once but only (\d) started within 30 s: "
        r"give the application 6 cores on the cluster's workers: .*--conf spark\.cores\.max=6 .*"
        r"or set participant\.task_slots to (\d) or fewer",
        log,
    )
    assert match, log
    assert 1 <= int(match.group(1)) <= 4 and match.group(2) == match.group(1)
