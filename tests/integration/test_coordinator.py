"""The coordinator against the embedded stack, with test code playing the participants.

Every test ends with the exactly-once oracle of docs/architecture.md §11.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.helpers import REPO, unique_name, wait_until
from tests.integration.live_pipeline import coordinator
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline


def spawn_coordinator(pipeline: Pipeline, coordinator_id: str, *module_args: str) -> subprocess.Popen:
    env = {**os.environ, "CHTXN_COORDINATOR_ID": coordinator_id, "PYTHONPATH": str(REPO)}
    args = module_args or ("-m", "cli", "coordinator", "--config", str(pipeline.config_path))
    return subprocess.Popen(
        [sys.executable, *args], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def states(pipeline: Pipeline) -> dict[str, str]:
    return {t.txn: t.state for t in pipeline.ledger().history(limit=1000)}


def test_committed_txn_lands_once_and_is_listed(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("commit"))
    produced = pipeline.produce(2_000)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), coordinator(pipeline):
        wait_until(lambda: pipeline.target_count() == produced, 60, "all rows published")
    assert pipeline.stage_tables() == [], "a clean shutdown leaves no stage table"
    assert_exactly_once(pipeline, produced)
    listed = subprocess.run(
        [sys.executable, "-m", "cli", "txn", "list", "--config", str(pipeline.config_path), "--json", "--limit", "500"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    txns = json.loads(listed.stdout)
    published = [t for t in txns if t["state"] == "PUBLISHED"]
    assert sum(t["total_rows"] for t in published) == produced


def test_write_status_timeout_aborts_and_leaves_nothing(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("wstimeout"),
        settings={"transaction.write_status_timeout_s": 3.0, "transaction.heartbeat_misses": 5},
    )
    produced = pipeline.produce(500)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, coordinator(pipeline):
        participants.knobs.withhold_status = {pipeline.partitions[1]}
        wait_until(lambda: "ABORTED" in states(pipeline).values(), 30, "a txn aborted on the write-status timeout")
        aborted = [t for t in pipeline.ledger().history(limit=100, state="ABORTED")]
        assert any("write-status timeout" in t.reason for t in aborted)
        assert pipeline.target_count() == 0
        wait_until(
            lambda: all(s.rsplit("__", 1)[1] not in {t.txn for t in aborted} for s in pipeline.stage_tables()),
            30,
            "aborted txns' stage tables dropped",
        )
        participants.knobs.withhold_status = set()
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows committed once the participant answers")
    assert_exactly_once(pipeline, produced)


def test_silent_participant_aborts_before_the_write_status_timeout(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("silent"),
        settings={
            "transaction.write_status_timeout_s": 60.0,
            "transaction.heartbeat_misses": 5,
            "transaction.interval_s": 2.0,
        },
    )
    produced = pipeline.produce(500)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, coordinator(pipeline):
        wait_until(lambda: participants.starts, 30, "a START")
        participants.knobs.silent = True
        participants.knobs.withhold_status = set(pipeline.partitions)
        wait_until(
            lambda: any("heartbeats" in t.reason for t in pipeline.ledger().history(limit=50, state="ABORTED")),
            30,
            "an abort for a dead participant (well before the 60 s write-status timeout)",
        )
        participants.knobs.silent = False
        participants.knobs.withhold_status = set()
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows committed after the participant is back")
    assert_exactly_once(pipeline, produced)


def test_row_count_mismatch_aborts(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("mismatch"))
    produced = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, coordinator(pipeline):
        participants.knobs.extra_reported_rows = 1
        wait_until(
            lambda: any("row-count mismatch" in t.reason for t in pipeline.ledger().history(limit=50, state="ABORTED")),
            30,
            "an abort for a row-count mismatch",
        )
        assert pipeline.target_count() == 0
        participants.knobs.extra_reported_rows = 0
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows committed once the counts agree")
    assert_exactly_once(pipeline, produced)


def test_sigkill_after_commit_before_publish_is_rolled_forward(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("rollfwd"))
    produced = pipeline.produce(1_000)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        crashing = spawn_coordinator(
            pipeline,
            "crasher",
            "-m",
            "tests.integration.crashing_coordinator",
            str(pipeline.config_path),
            "after-commit",
        )
        assert crashing.wait(60) == -signal.SIGKILL, crashing.stdout.read()
        committed = [t for t in pipeline.ledger().history(limit=10) if t.state == "COMMITTED"]
        assert committed, "the crashing coordinator left a COMMITTED, unpublished txn"
        assert pipeline.target_count() == 0
        with coordinator(pipeline, coordinator_id="restarted"):
            wait_until(lambda: states(pipeline).get(committed[0].txn) == "PUBLISHED", 30, "the committed txn published")
            wait_until(lambda: pipeline.target_count() == produced, 60, "all rows published")
    assert_exactly_once(pipeline, produced)


def test_two_leaders_at_once_never_share_a_commit_slot(stack, tmp_path):
    """Two replicas forced to lead (each claims its own epoch); participants answer both."""
    from coordinator.control import ControlChannel
    from coordinator.leader import Leader
    from coordinator.metrics import CoordinatorMetrics
    from coordinator.stage.tables import StageTables

    pipeline = make_pipeline(stack, tmp_path, unique_name("twoleaders"))
    produced = pipeline.produce(1_000)
    stop = threading.Event()
    outcomes: dict[str, str] = {}

    def lead(epoch: int, name: str) -> None:
        ledger = pipeline.ledger()
        assert ledger.claim_epoch(epoch, name)
        control = ControlChannel(pipeline.cfg, client_id=name)
        control.open()
        stages = StageTables(
            pipeline.client(),
            database=pipeline.cfg.clickhouse.database,
            target=pipeline.cfg.clickhouse.target_table,
            pipeline=pipeline.cfg.name,
        )
        try:
            outcomes[name] = Leader(
                pipeline.cfg,
                epoch=epoch,
                coordinator=name,
                control=control,
                ledger=ledger,
                stages=stages,
                metrics=CoordinatorMetrics(pipeline.cfg.name),
            ).run(stop)
        finally:
            control.close()

    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants:
        participants.knobs.obey_all_epochs = True
        threads = [threading.Thread(target=lead, args=(e, f"leader{e}"), daemon=True) for e in (1, 2)]
        for t in threads:
            t.start()
        wait_until(lambda: outcomes, 60, "one of the two leaders to step down")
        wait_until(lambda: pipeline.target_count() == produced, 60, "all rows published by the survivor")
        stop.set()
        for t in threads:
            t.join(60)
    assert any(o.startswith("stepped down") for o in outcomes.values()), outcomes
    commits = pipeline.ledger().commits()
    assert [c.commit_seq for c in commits] == list(range(1, len(commits) + 1))
    raw = (
        pipeline.client()
        .query(
            f"SELECT commit_seq, count() FROM `{pipeline.cfg.clickhouse.database}`.chtxn_ledger "
            "WHERE event = 'COMMITTED' GROUP BY commit_seq HAVING count() > 1"
        )
        .result_rows
    )
    assert raw == [], f"slots claimed twice: {raw}"
    assert_exactly_once(pipeline, produced)


def test_standby_takes_over_after_leader_sigkill(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("standby"))
    produced = pipeline.produce(500)
    procs = {}
    try:
        with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
            procs["a"] = spawn_coordinator(pipeline, "replica-a")
            wait_until(lambda: pipeline.target_count() == produced, 60, "first batch published")
            procs["b"] = spawn_coordinator(pipeline, "replica-b")
            said: list[dict] = []
            reader = threading.Thread(target=lambda: said.extend(_json_lines(procs["b"].stdout)), daemon=True)
            reader.start()
            # A standby says what it waits on, once it has heard the leader.
            wait_until(lambda: any(m["msg"] == "standing by" for m in said), 30, "replica-b standing by")
            assert next(m for m in said if m["msg"] == "standing by")["leader"] == "replica-a"
            ledger = pipeline.ledger()
            leader_epoch = ledger.max_epoch()
            leader = ledger.epoch_owner(leader_epoch)
            assert leader == "replica-a"
            killed_at = time.monotonic()
            procs["a"].send_signal(signal.SIGKILL)
            procs["a"].wait(10)
            wait_until(
                lambda: ledger.epoch_owner(ledger.max_epoch()) == "replica-b", 30, "replica-b claims a new epoch"
            )
            took_over_s = time.monotonic() - killed_at
            print(f"standby took over {took_over_s:.2f} s after the leader's SIGKILL")
            more = pipeline.produce(500, start_id=produced)
            wait_until(lambda: pipeline.target_count() == produced + more, 60, "second batch published by replica-b")
            produced += more
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    assert_exactly_once(pipeline, produced)


def _json_lines(stream) -> Iterator[dict]:
    for line in stream:
        if line.startswith("{"):
            yield json.loads(line)


@pytest.mark.parametrize("partitions", [2])
def test_control_topic_with_two_partitions_is_refused(stack, tmp_path, partitions):
    from confluent_kafka.admin import AdminClient

    from clients import kafka as kafka_clients

    name = unique_name("twopart")
    kafka_clients.create_topics(AdminClient({"bootstrap.servers": stack.kafka_bootstrap}), {f"{name}_ctl2": partitions})
    pipeline = make_pipeline(stack, tmp_path, name, settings={"pipeline.control_topic": f"{name}_ctl2"})
    proc = spawn_coordinator(pipeline, "refuser")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert f"control topic {name}_ctl2 has 2 partitions; chtxn needs exactly 1" in out
