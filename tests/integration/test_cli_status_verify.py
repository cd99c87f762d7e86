"""``chtxn status`` and ``chtxn verify`` against a running pipeline (scripted participants)."""

from __future__ import annotations

import json
import time
from functools import partial

from confluent_kafka import Producer

from coordinator.ledger.store import LedgerStore
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import Pipeline, make_pipeline

#: ``python -m cli`` of this checkout, with no time limit.
chtxn = partial(run_chtxn, timeout_s=None)


def test_status_names_leader_and_participants_and_verify_passes(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("status"))
    produced = produce_in_one_batch(pipeline, 1_000)
    config = str(pipeline.config_path)
    idle = chtxn("status", "--config", config, "--json")
    assert idle.returncode == 1, idle.stderr
    before = json.loads(idle.stdout)
    assert before["healthy"] is False and before["failed"] == ["leader", "participants", "commits"]
    assert (before["leader"], before["leader_epoch"], before["replicas"], before["commit_age_s"]) == ("", 0, [], None)
    assert [p["log_end"] for p in before["partitions"]] == [produced // 2, produced // 2]
    idle_table = chtxn("status", "--config", config)
    assert idle_table.returncode == 1
    assert "failed: leader, participants, commits" in idle_table.stdout
    with (
        ScriptedParticipants(pipeline.cfg, pipeline.partitions, sender="scripted-p"),
        coordinator(pipeline, coordinator_id="status-c1"),
    ):
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows published")
        result = chtxn("status", "--config", config, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        status = json.loads(result.stdout)
        assert (status["leader"], status["leader_epoch"], status["epoch"]) == ("status-c1", 1, 1)
        assert [(r["id"], r["role"], r["epoch"]) for r in status["replicas"]] == [("status-c1", "leader", 1)]
        assert {p["participant"] for p in status["partitions"]} == {"scripted-p"}
        assert sum(p["committed"] for p in status["partitions"]) == produced
        # the embedded broker's ListOffsets answer trails the log: the log end must not
        assert all(p["log_end"] == p["committed"] and p["lag"] == 0 for p in status["partitions"])
        assert [(c["name"], c["status"]) for c in status["checks"]] == [
            ("leader", "ok"),
            ("participants", "ok"),
            ("commits", "ok"),
            ("routes", "ok"),
            ("partition logs", "ok"),
        ]
        assert status["failed"] == [] and 0 <= status["commit_age_s"] < 21
        assert status["last_commit_seq"] >= 2 and status["rows_per_s"] > 0 and status["rate_commits"] >= 2
        table = chtxn("status", "--config", config)
        assert "status-c1" in table.stdout and "scripted-p" in table.stdout and "healthy" in table.stdout
        assert "rows/s over the latest" in table.stdout
    verified = chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["deep"]["rows_in_target"] == produced


def produce_in_one_batch(pipeline: Pipeline, count: int) -> int:
    """``count`` records, half to each of two partitions, each half in one record batch (a long linger)."""
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 1000})
    for i in range(count):
        value = json.dumps({"id": i, "user": "u", "amount": 1.0}).encode()
        producer.produce(pipeline.topic, value=value, key=str(i).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    return count


def test_status_lists_a_leader_and_a_standby_then_a_take_over(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("statusha"))
    config = str(pipeline.config_path)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions, sender="scripted-p"):
        with coordinator(pipeline, coordinator_id="first"):
            wait_until(lambda: pipeline.ledger().max_epoch() == 1, 60, "first to lead")
            with coordinator(pipeline, coordinator_id="second"):

                def both_heard() -> dict | None:
                    status = json.loads(chtxn("status", "--config", config, "--json").stdout)
                    return status if len(status["replicas"]) == 2 else None

                led = wait_until(both_heard, 30, "status to list the standby's heartbeat")
                # the leader, then the standby (which never led: epoch 0), each heard within the lease
                assert [(r["id"], r["role"], r["epoch"]) for r in led["replicas"]] == [
                    ("first", "leader", 1),
                    ("second", "standby", 0),
                ]
                lease_s = pipeline.cfg.coordinator.leader_lease_s
                assert all(0 <= r["heard_s"] <= lease_s for r in led["replicas"]), led["replicas"]
                assert (led["leader"], led["leader_epoch"]) == ("first", 1) and pipeline.ledger().max_epoch() == 1
                assert led["checks"][0] == {**led["checks"][0], "name": "leader", "status": "ok"}, (
                    "a standby leads nothing"
                )
                table = chtxn("status", "--config", config).stdout.splitlines()
                rows = {
                    line.split()[0]: line.split()[1:] for line in table if line.split()[:1] in (["first"], ["second"])
                }
                assert (rows["first"][:2], rows["second"][:2]) == (["leader", "1"], ["standby", "-"]), table
                assert all(words[-2:] == ["s", "ago"] for words in rows.values()), table
            wait_until(lambda: pipeline.ledger().head()[0] >= 3, 60, "commits")
        # "first" is gone; a new replica takes over
        with coordinator(pipeline, coordinator_id="third"):
            wait_until(lambda: pipeline.ledger().epoch_owner(2) == "third", 60, "third to lead epoch 2")

            def status_after_take_over() -> dict | None:
                status = json.loads(chtxn("status", "--config", config, "--json").stdout)
                return status if status["leader"] == "third" else None

            status = wait_until(status_after_take_over, 30, "status to name the new leader")
            assert (status["leader_epoch"], status["epoch"]) == (2, 2)
            roles = {r["id"]: (r["role"], r["epoch"]) for r in status["replicas"]}
            assert roles.pop("third") == ("leader", 2)
            # stopped: "left" once a stopping leader hands its lease over, or a stopping standby says so
            assert roles == {"first": ("left", 1), "second": ("left", 0)}


def test_verify_deep_fails_on_a_duplicated_row(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("verifydup"))
    produced = pipeline.produce(200)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), coordinator(pipeline):
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows published")
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    pipeline.client().command(f"INSERT INTO `{db}`.`{table}` SELECT * FROM `{db}`.`{table}` LIMIT 1")
    result = chtxn("verify", "--config", str(pipeline.config_path), "--deep")
    assert result.returncode == 1
    assert "1 duplicates" in result.stdout and "FAILED" in result.stdout


def test_verify_deep_after_the_first_commits_expired_checks_from_the_oldest_checkpoint(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("verifyexp"))
    first = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), coordinator(pipeline):
        wait_until(lambda: pipeline.target_count() == first, 60, "the first rows published")
    more = pipeline.produce(200, start_id=first)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), coordinator(pipeline, coordinator_id="c2"):
        # c2's seal checkpointed everything c1 committed
        wait_until(lambda: pipeline.target_count() == first + more, 60, "the later rows published")
    store = pipeline.ledger()
    horizon = store.latest_checkpoint()
    assert horizon is not None and horizon.commit_seq > 1
    later = LedgerStore(
        pipeline.client(),
        pipeline.cfg.clickhouse.database,
        pipeline.cfg.name,
        retention_s=86400,
        wall_clock=lambda: time.time() + 2 * 86400,
    )
    assert later.expire() >= horizon.commit_seq
    start, commits, _ = store.retained_chain()
    assert start is not None and all(c.commit_seq > start.commit_seq for c in commits)
    verified = chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["anomalies"] == []
    # the rows of the expired commits are neither passed nor failed: their evidence is gone
    assert report["outcome"] == "EXPIRED" and sum(p["expired"] for p in report["deep"]["partitions"]) == first
    checked = sum(p["rows"] for p in report["deep"]["partitions"])
    assert checked == sum(p["expected_rows"] for p in report["deep"]["partitions"]) < first + more
    status = json.loads(chtxn("status", "--config", str(pipeline.config_path), "--json").stdout)
    assert sum(p["committed"] for p in status["partitions"]) == first + more  # the head survived the expiry
