"""``chtxn status`` and ``chtxn verify`` against a running pipeline (scripted participants)."""

from __future__ import annotations

import json
import time
from functools import partial

from coordinator.ledger_store import LedgerStore
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import make_pipeline

#: ``python -m cli`` of this checkout, with no time limit.
chtxn = partial(run_chtxn, timeout_s=None)


def test_status_names_leader_and_participants_and_verify_passes(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("status"))
    produced = pipeline.produce(1_000)
    config = str(pipeline.config_path)
    idle = chtxn("status", "--config", config, "--json")
    assert idle.returncode == 1, idle.stderr
    assert json.loads(idle.stdout)["healthy"] is False
    with (
        ScriptedParticipants(pipeline.cfg, pipeline.partitions, sender="scripted-p"),
        coordinator(pipeline, coordinator_id="status-c1"),
    ):
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows published")
        result = chtxn("status", "--config", config, "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        status = json.loads(result.stdout)
        assert status["leader"].startswith("status-c1")
        assert {p["participant"] for p in status["partitions"]} == {"scripted-p"}
        assert sum(p["committed"] for p in status["partitions"]) == produced
        table = chtxn("status", "--config", config)
        assert "status-c1" in table.stdout and "scripted-p" in table.stdout
    verified = chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] and report["deep"]["rows_in_target"] == produced


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
    checked = sum(p["rows"] for p in report["deep"]["partitions"])
    assert checked == sum(p["expected_rows"] for p in report["deep"]["partitions"]) < first + more
    status = json.loads(chtxn("status", "--config", str(pipeline.config_path), "--json").stdout)
    assert sum(p["committed"] for p in status["partitions"]) == first + more  # the head survived the expiry
