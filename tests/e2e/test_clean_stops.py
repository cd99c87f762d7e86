"""Clean stops are not aborts: SIGTERM of the participant job (``chtxn participant``) and of the leader coordinator,
mid-run, on the embedded stack with real Spark. Each test ends with the exactly-once oracle.

- The participant job's driver tells its tasks to leave: they finish their part of the open txn,
  the leader ends it at once and commits it, and no txn aborts for their silence. A restarted job
  goes on from where they stopped.
- The leader hands its lease over when it stops: the standby claims the next epoch at once, not
  ``leader_lease_s`` after the leader's last heartbeat.
"""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request

import pytest
from confluent_kafka import Consumer, TopicPartition as KafkaTP

from participant.leaving import driver_pid
from procs import free_port
from protocol.messages import Heartbeat, LeaderHeartbeat, Leave
from tests.e2e.processes import Processes, committed
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, assert_exactly_once, control_messages, make_pipeline

pytestmark = pytest.mark.e2e


def ledger_rows(pipeline: Pipeline) -> list[tuple[int, str, str, int]]:
    """(epoch, event, coordinator, event time in ms) of every ledger row of the pipeline, oldest first."""
    db = pipeline.cfg.clickhouse.database
    return [
        (int(epoch), str(event), str(coordinator), int(ms))
        for epoch, event, coordinator, ms in pipeline.client()
        .query(
            f"SELECT epoch, event, coordinator, toUnixTimestamp64Milli(event_time) FROM `{db}`.chtxn_ledger "
            "WHERE pipeline = {p:String} ORDER BY event_time",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    ]


def control_end(pipeline: Pipeline) -> int:
    consumer = Consumer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "group.id": "control-end"})
    try:
        return consumer.get_watermark_offsets(KafkaTP(pipeline.cfg.control_topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def ready_line(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return answer.read().decode().strip()
    except (urllib.error.URLError, OSError):
        return ""


def settled(pipeline: Pipeline) -> list:
    """The pipeline's txns once none is open (every one PUBLISHED or ABORTED), else nothing."""
    txns = pipeline.ledger().history(limit=1000)
    return txns if txns and all(t.state in ("PUBLISHED", "ABORTED") for t in txns) else []


def test_a_participant_job_stopped_with_sigterm_leaves_and_no_txn_aborts(stack, tmp_path):
    pipeline = make_pipeline(
        stack, tmp_path, unique_name("e2eleave"), partitions=2, settings={"participant.chunk_rows": 2_000}
    )
    produced = pipeline.produce(20_000)
    procs = Processes(pipeline, tmp_path)
    try:
        procs.coordinator()
        launcher = procs.participants(2)
        committed(pipeline, produced, procs)
        wait_until(lambda: driver_pid(launcher.pid), 120, "the participant job's Python driver")
        more = pipeline.produce(100_000, start_id=produced)
        wait_until(lambda: procs.alive() or pipeline.target_count() > produced, 120, "the second batch committing")
        os.kill(launcher.pid, signal.SIGTERM)  # as an operator stops it: chtxn participant passes it to the driver
        assert launcher.wait(120) == 0, procs.tail("participant")
        assert "the participant tasks are done" in procs.tail("participant")
        del procs.procs["participant"]  # it exited, as asked
        txns = wait_until(lambda: settled(pipeline), 60, "every txn of the stopped job committed")
        aborted = [(t.txn, t.reason) for t in txns if t.state == "ABORTED"]
        assert aborted == [], f"a clean stop of the participant job aborted txns: {aborted}"
        messages = control_messages(pipeline)
        (leave,) = [m for m in messages if isinstance(m, Leave)]
        leavers = {m.sender for m in messages if isinstance(m, Heartbeat) and m.leaving}
        assert len(leavers) == 2, f"expected both tasks of job {leave.job} to heartbeat leaving: {leavers}"
        # A restarted job goes on from where the stopped one left.
        procs.participants(2)
        later = pipeline.produce(10_000, start_id=produced + more)
        committed(pipeline, produced + more + later, procs)
        txns = pipeline.ledger().history(limit=1000)
    finally:
        procs.stop_all()
    dead = [(t.txn, t.reason) for t in txns if t.state == "ABORTED" and "heartbeats" in t.reason]
    assert dead == [], f"txns aborted for a silent participant: {dead}"
    assert_exactly_once(pipeline, produced + more + later)


def test_a_leader_stopped_with_sigterm_hands_over_to_the_standby_at_once(stack, tmp_path):
    lease_s = 12.0
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("e2ehand"),
        partitions=2,
        settings={"participant.chunk_rows": 2_000, "coordinator.leader_lease_s": lease_s},
    )
    produced = pipeline.produce(10_000)
    procs = Processes(pipeline, tmp_path)
    try:
        leader = procs.coordinator("coordinator-a")
        procs.participants(2)
        committed(pipeline, produced, procs)
        port = free_port()
        procs.start("coordinator-b", "coordinator", "--metrics-port", str(port))
        wait_until(lambda: ready_line(port) == "ready: standby", 60, "coordinator-b standing by")
        since = control_end(pipeline)  # coordinator-b reads the control topic from about here on
        wait_until(lambda: control_end(pipeline) > since + 20, 30, "control traffic coordinator-b reads")
        more = pipeline.produce(10_000, start_id=produced)
        os.killpg(leader.pid, signal.SIGTERM)
        assert leader.wait(60) == 0, procs.tail("coordinator-a")
        del procs.procs["coordinator-a"]  # it exited, as asked
        wait_until(
            lambda: any(e == 2 and event == "EPOCH" for e, event, _, _ in ledger_rows(pipeline)),
            3 * lease_s,
            "coordinator-b claiming epoch 2",
        )
        committed(pipeline, produced + more, procs)
        rows = ledger_rows(pipeline)
        handed_over = [m for m in control_messages(pipeline) if isinstance(m, LeaderHeartbeat) and m.leaving]
    finally:
        procs.stop_all()
    claim = next((coordinator, ms) for e, event, coordinator, ms in rows if e == 2 and event == "EPOCH")
    last_of_a = max(ms for e, _, _, ms in rows if e == 1)
    # Without the hand-over coordinator-b claims only after lease_s of silence: at least two thirds of
    # the lease after coordinator-a's last ledger row (its last heartbeat is at most a third before it).
    gap_s = (claim[1] - last_of_a) / 1000
    print(f"coordinator-b claimed epoch 2 {gap_s:.2f} s after coordinator-a's last ledger row (lease {lease_s:g} s)")
    assert claim[0] == "coordinator-b"
    assert gap_s < lease_s / 2, f"coordinator-b claimed epoch 2 {gap_s:.2f} s after coordinator-a's last row"
    assert [(m.epoch, m.sender) for m in handed_over] == [(1, "coordinator-a")]
    assert_exactly_once(pipeline, produced + more)
