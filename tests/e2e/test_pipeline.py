"""The whole pipeline on the embedded stack: a coordinator process and the Spark participant job
(real Spark in local mode), with faults. Every test ends with the exactly-once oracle.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.processes import committed, running
from tests.helpers import unique_name, wait_until
from tests.pipelines import assert_exactly_once, make_pipeline

pytestmark = pytest.mark.e2e


def test_four_partitions_100k_events_exactly_once(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("e2e100k"),
        partitions=4,
        settings={"transaction.interval_s": 1.0, "participant.chunk_rows": 10_000},
    )
    produced = pipeline.produce(100_000)
    with running(pipeline, tmp_path, slots=4) as procs:
        committed(pipeline, produced, procs)
    assert_exactly_once(pipeline, produced)
    aborted = pipeline.ledger().history(limit=1000, state="ABORTED")
    assert all(
        t.reason == "coordinator shutting down" or "orphan" in t.reason or "heartbeats" in t.reason for t in aborted
    ), [t.reason for t in aborted]


def test_python_worker_sigkill_mid_transaction(stack, tmp_path):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("e2ekillw"), partitions=2, settings={"participant.chunk_rows": 2_000}
    )
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        wait_until(lambda: procs.alive() or pipeline.target_count() > 0, 180, "the first rows committed")
        workers = wait_until(procs.python_workers, 30, "a PySpark Python worker")
        os.kill(workers[0], signal.SIGKILL)
        more = pipeline.produce(20_000, start_id=produced)
        committed(pipeline, produced + more, procs)
    assert_exactly_once(pipeline, produced + more)


def test_coordinator_sigkill_mid_transaction_and_restart(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("e2ekillc"), partitions=2)
    produced = pipeline.produce(20_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        wait_until(lambda: procs.alive() or pipeline.target_count() > 0, 180, "the first rows committed")
        more = pipeline.produce(20_000, start_id=produced)
        procs.kill("coordinator")
        procs.coordinator("coordinator-restarted")
        committed(pipeline, produced + more, procs)
    assert_exactly_once(pipeline, produced + more)


def test_malformed_records_go_to_the_dead_letter_topic(stack, tmp_path):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("e2edlq"), partitions=2, settings={"participant.chunk_rows": 2_000}
    )
    produced = pipeline.produce(20_000, bad_every=100)  # 1% malformed
    bad = produced // 100
    with running(pipeline, tmp_path, slots=2) as procs:
        committed(pipeline, produced - bad, procs)
    dead = pipeline.dead_letter_offsets()
    assert sum(len(v) for v in dead.values()) == bad
    for tp, offsets in dead.items():  # the malformed ones are every 100th id, spread by id % 2
        assert all(o % 50 == 49 for o in offsets), (tp, sorted(offsets)[:5])
    assert_exactly_once(pipeline, produced - bad, dead)


def test_idle_topic_commits_an_empty_transaction_per_idle_interval(stack, tmp_path):
    """Past its data, a txn with nothing to read stays open for ``idle_interval_s``, not ``interval_s``,
    then commits empty; none aborts."""
    idle_s = 2.0
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("e2eidle"),
        partitions=2,
        settings={"transaction.interval_s": 0.5, "transaction.idle_interval_s": idle_s},
    )
    produced = pipeline.produce(1_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        committed(pipeline, produced, procs)
        ledger = pipeline.ledger()
        base = len(ledger.commits())
        wait_until(lambda: procs.alive() or len(ledger.commits()) >= base + 3, 60, "three more (empty) commits")
        idle = ledger.commits()[base:]
        assert all(c.total_rows == 0 for c in idle)
        assert all(c.ended_at - c.started_at >= idle_s for c in idle[1:]), [c.ended_at - c.started_at for c in idle]
        assert ledger.history(limit=1000, state="ABORTED") == []
    assert_exactly_once(pipeline, produced)
