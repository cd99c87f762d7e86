"""A participant task told to leave, against the real broker and ClickHouse, with the test as coordinator.

The driver's side is ``participant.leaving.leave``: it sends LEAVE on the control topic and waits for
its tasks; the task heartbeats ``leaving``, finishes the txn it is in and returns by itself. With no
leader to end that txn the driver gives up after ``transaction.write_status_timeout_s``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from participant.leaving import leave
from participant.runner import TaskRunner
from protocol.messages import Leave
from tests.helpers import unique_name, wait_until
from tests.integration.live_pipeline import StoppableThread
from tests.integration.test_participant_runner import WAIT_S, TestCoordinator, good, produce
from tests.pipelines import Pipeline, make_pipeline

JOB = "driver-test-1"


@pytest.fixture
def pipeline(stack, tmp_path: Path) -> Pipeline:
    return make_pipeline(
        stack,
        tmp_path,
        unique_name("leave"),
        partitions=2,
        settings={"participant.chunk_rows": 3, "transaction.write_status_timeout_s": 3.0},
    )


def run_task(
    pipeline: Pipeline, coordinator: TestCoordinator, job: str = JOB
) -> tuple[StoppableThread, threading.Event]:
    """A task of both partitions in the participant job ``job``, listening; and an event set once it returned."""
    returned = threading.Event()
    runner = TaskRunner(pipeline.cfg, pipeline.partitions, participant_id="task-0", job=job)

    def run(stop: threading.Event) -> None:
        try:
            runner.run(stop)
        finally:
            returned.set()

    thread = StoppableThread("task-0", run)
    wait_until(lambda: any(h.sender == "task-0" for h in coordinator.heartbeats()), WAIT_S, "a first heartbeat")
    return thread, returned


def test_a_task_told_to_leave_reports_its_txn_and_returns_by_itself(pipeline):
    coordinator = TestCoordinator(pipeline)
    tp0, tp1 = pipeline.partitions
    thread, returned = run_task(pipeline, coordinator)
    try:
        produce(pipeline, 0, [good(i) for i in range(5)])
        coordinator.start("e1_t1", {tp0: 0, tp1: 0})
        coordinator.wait_read("e1_t1", {tp0: 5})
        outcome: list[bool] = []
        driver = threading.Thread(target=lambda: outcome.append(leave(pipeline.cfg, JOB, returned)))
        driver.start()
        wait_until(
            lambda: any(h.leaving and h.txn == "e1_t1" for h in coordinator.heartbeats()),
            WAIT_S,
            "a leaving heartbeat naming the open txn",
        )
        assert not returned.is_set()  # it owes e1_t1: it waits for END
        coordinator.end("e1_t1")
        statuses = coordinator.wait_statuses("e1_t1", 2)
        assert (statuses[tp0].start_offset, statuses[tp0].end_offset, statuses[tp0].rows) == (0, 5, 5)
        assert (statuses[tp1].end_offset, statuses[tp1].errors) == (0, ())
        driver.join(WAIT_S)
        assert outcome == [True] and returned.is_set()
        leaves = [m for m in coordinator.collect() if isinstance(m, Leave)]
        assert [(m.job, m.epoch, m.sender) for m in leaves] == [(JOB, 0, JOB)]
    finally:
        thread.stop()
        coordinator.close()


def test_a_leave_of_another_job_is_not_for_this_task(pipeline):
    coordinator = TestCoordinator(pipeline)
    tp0, tp1 = pipeline.partitions
    thread, returned = run_task(pipeline, coordinator, job="driver-test-2")
    try:
        assert leave(pipeline.cfg, JOB, returned) is False  # waited write_status_timeout_s for nothing
        assert not any(h.leaving for h in coordinator.heartbeats())
        coordinator.start("e1_t1", {tp0: 0, tp1: 0})  # it still takes part as before
        coordinator.end("e1_t1")
        coordinator.wait_statuses("e1_t1", 2)
    finally:
        thread.stop()
        coordinator.close()


def test_with_no_leader_ending_the_open_txn_the_driver_gives_up_after_the_write_status_timeout(pipeline):
    coordinator = TestCoordinator(pipeline)
    tp0, tp1 = pipeline.partitions
    thread, returned = run_task(pipeline, coordinator)
    try:
        coordinator.start("e1_t1", {tp0: 0, tp1: 0})  # and no END ever comes
        assert leave(pipeline.cfg, JOB, returned) is False  # the caller then cancels the task
        assert any(h.leaving and h.txn == "e1_t1" for h in coordinator.heartbeats())
        assert not returned.is_set()  # a task never walks out of a txn it is in by itself
    finally:
        thread.stop()
        coordinator.close()
    assert returned.is_set()
