"""``chtxn pause`` / ``resume`` against a running pipeline (a coordinator replica on a thread, test
code playing the participants, the embedded stack): paused, the open txn commits and none starts,
records produced meanwhile stay in Kafka; the pause survives a take-over; resumed, every record
is committed exactly once. ``chtxn status`` shows the pause."""

from __future__ import annotations

import json

from tests.helpers import last_txn, run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import assert_exactly_once, make_pipeline


def test_a_pause_holds_across_a_take_over_and_a_resume_commits_everything_once(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pause"))
    config = str(pipeline.config_path)
    produced = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants:
        with ServiceThread(pipeline.cfg, "c1"):
            wait_until(lambda: pipeline.target_count() == produced, 60, "the first records committed")
            paused = run_chtxn("pause", "--config", config, "--reason", "widening a column", "--by", "alice")
            assert paused.returncode == 0, paused.stderr
            assert "paused by alice: widening a column" in paused.stdout
            # The open txn ends at once and commits; then nothing starts.
            wait_until(lambda: last_txn(pipeline.ledger()).state == "PUBLISHED", 30, "the open txn done")
            starts = len(participants.starts)
            held = pipeline.produce(200, start_id=produced)
            # The next txn's stage table is ready and every partition is held: unpaused, it would start now.
            wait_until(lambda: len(pipeline.stage_tables()) == 1, 30, "the spare stage table of the next txn")
            shown = json.loads(run_chtxn("status", "--config", config, "--json").stdout)
            assert (shown["paused"], shown["paused_by"]) == (True, "alice")
            assert len(participants.starts) == starts, "a txn started while paused"
            assert pipeline.target_count() == produced
        # c1 stopped; c2 takes over a paused pipeline and starts nothing either.
        with ServiceThread(pipeline.cfg, "c2"):
            ledger = pipeline.ledger()
            wait_until(lambda: ledger.epoch_owner(ledger.max_epoch()) == "c2", 30, "c2 leads")
            wait_until(lambda: any(c.epoch == ledger.max_epoch() for c in ledger.commits()), 30, "c2 sealed")
            wait_until(lambda: len(pipeline.stage_tables()) == 1, 30, "c2's spare stage table")
            shown = json.loads(run_chtxn("status", "--config", config, "--json").stdout)
            assert (shown["paused"], shown["paused_by"], shown["paused_reason"]) == (True, "alice", "widening a column")
            assert "commits" not in shown["failed"]
            assert len(participants.starts) == starts and pipeline.target_count() == produced

            resumed = run_chtxn("resume", "--config", config, "--json")
            assert resumed.returncode == 0, resumed.stderr
            assert json.loads(resumed.stdout)["state"] == "resumed"
            produced += held
            wait_until(lambda: pipeline.target_count() == produced, 60, "the held records committed")
    assert_exactly_once(pipeline, produced)
