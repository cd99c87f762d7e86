"""Real table engines and real neighbours: pipelines sharing a target, collapsing engines, ALTERs.

Real ``Leader``s in threads against the embedded stack, with test code playing the participants;
failpoints hold a leader at a chosen step. Every test ends with the exactly-once oracle.
"""

from __future__ import annotations

import json

import pytest

from clients import failpoints
from protocol import naming
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import TARGET_DDL, Pipeline, assert_exactly_once, make_pipeline


def own_rows(pipeline: Pipeline) -> int:
    """Rows of this pipeline's topics in the (maybe shared) target."""
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    return int(
        pipeline.client().command(
            f"SELECT count() FROM `{db}`.`{table}` WHERE _topic IN {{t:Array(String)}}",
            parameters={"t": list(pipeline.cfg.pipeline.topics)},
        )
    )


def test_a_pipelines_take_over_never_touches_another_pipelines_stage_table(stack, tmp_path):
    """Defect 2: B holds an uncommitted stage table in the target A also feeds; A takes over
    (roll-forward and orphan clean-up) and must leave it alone, and B then commits it once."""
    a = make_pipeline(stack, tmp_path, unique_name("sharea"))
    b = make_pipeline(
        stack, tmp_path, unique_name("shareb"), settings={"clickhouse.database": a.cfg.clickhouse.database}
    )
    made_a, made_b = a.produce(500), b.produce(300)
    b1 = LeaderThread(b, 1, "B1")
    a1 = LeaderThread(a, 1, "A1")
    with (
        ScriptedParticipants(b.cfg, b.partitions, sender="pb") as pb,
        ScriptedParticipants(a.cfg, a.partitions, sender="pa"),
        leaders(b1, a1),
    ):
        held = failpoints.arm("leader.before-commit", "pause*1", who="B1")
        b1.start()
        assert held.reached.wait(60), "B never reached its commit point"
        k = next(s.txn for s in reversed(pb.statuses) if s.rows)
        stage_k = naming.stage_table("events", b.cfg.name, k)
        a1.start()
        wait_until(lambda: own_rows(a) == made_a, 60, "A commits its own records")
        assert stage_k in b.stage_tables(), "A's take-over dropped B's stage table"
        assert own_rows(b) == 0, "A published B's uncommitted rows"
        failpoints.release("leader.before-commit")
        wait_until(lambda: own_rows(b) == made_b, 60, "B commits its records")
    assert_exactly_once(a, made_a, nothing_lost=True)
    assert_exactly_once(b, made_b, nothing_lost=True)


MERGING_TARGETS = {
    "ReplacingMergeTree": "ReplacingMergeTree",
    "SummingMergeTree": "SummingMergeTree(amount)",
    "CollapsingMergeTree": "CollapsingMergeTree(sign)",
    "VersionedCollapsingMergeTree": "VersionedCollapsingMergeTree(sign, id)",
    "AggregatingMergeTree": "AggregatingMergeTree",
}


@pytest.mark.parametrize("engine", sorted(MERGING_TARGETS))
def test_a_target_that_merges_rows_away_still_commits_every_record_once(stack, tmp_path, engine):
    """Defect 3: every record has the same sorting key, so the target's engine would merge them
    into one row; staged rows must stay apart until publish or the count check fails forever."""
    ddl = (
        TARGET_DDL.replace("ENGINE = MergeTree", f"ENGINE = {MERGING_TARGETS[engine]}")
        .replace("ORDER BY (_topic, _partition, _offset)", "ORDER BY (_topic, _partition)")
        .replace("    _offset Int64\n", "    _offset Int64,\n    sign Int8 DEFAULT 1\n")
    )
    pipeline = make_pipeline(stack, tmp_path, unique_name("merging"), target_ddl=ddl)
    produced = pipeline.produce(600)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1 := LeaderThread(pipeline, 1, "E1")):
        e1.start()
        wait_until(
            lambda: sum(c.total_rows for c in pipeline.ledger().commits()) == produced, 60, "every record committed"
        )
        wait_until(lambda: pipeline.ledger().committed_unpublished() == [], 30, "every commit published")
    aborted = pipeline.ledger().history(limit=200, state="ABORTED")
    assert not [t.reason for t in aborted if "row-count" in t.reason], "staged rows collapsed before the count"
    db = pipeline.cfg.clickhouse.database
    # Rows reach the target as staged; the target's own merges may then collapse them.
    staged = int(pipeline.client().command(f"SELECT count() FROM `{db}`.events"))
    assert 0 < staged <= produced


def test_a_target_altered_mid_txn_aborts_before_the_commit_point_and_restages(stack, tmp_path):
    """Defect 6, before the commit point: the txn whose stage table has the old structure aborts
    (target-altered) and the next one stages in the new structure."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("alterpre"))
    produced = pipeline.produce(500)
    db = pipeline.cfg.clickhouse.database
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1 := LeaderThread(pipeline, 1, "E1")):
        counting = failpoints.arm("leader.before-count", "pause*1", who="E1")
        e1.start()
        assert counting.reached.wait(60)
        pipeline.client().command(f"ALTER TABLE `{db}`.events ADD COLUMN note String DEFAULT 'new'")
        failpoints.release("leader.before-count")
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed after the ALTER")
    kinds = [t.reason for t in pipeline.ledger().history(limit=100, state="ABORTED")]
    assert any("target table changed" in r for r in kinds), kinds
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def test_a_stage_table_dropped_before_step_5_aborts_its_txn_and_the_records_are_read_again(stack, tmp_path):
    """Someone drops the stage table of a txn whose WRITE-STATUS set is complete: step 5 finds it
    gone, the txn aborts before the commit point, and the next txn stages the records again."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("stagegone"))
    produced = pipeline.produce(500)
    db = pipeline.cfg.clickhouse.database
    with (
        ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants,
        leaders(e1 := LeaderThread(pipeline, 1, "E1")),
    ):
        counting = failpoints.arm("leader.before-count", "pause*1", who="E1")
        e1.start()
        assert counting.reached.wait(60)
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        stage = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, k)
        pipeline.client().command(f"DROP TABLE `{db}`.`{stage}`")
        failpoints.release("leader.before-count")
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed after the drop")
    aborted = {t.txn: t.reason for t in pipeline.ledger().history(limit=100, state="ABORTED")}
    assert "does not exist" in aborted.get(k, ""), aborted
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def test_a_target_altered_after_the_commit_point_is_published_by_aligning_its_stage_table(stack, tmp_path):
    """Defect 6, after the commit point: MOVE PARTITION would fail for ever (code 122); the stage
    table is aligned with the target's new structure and moved, and a new leader can finish it."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("alterpost"))
    produced = pipeline.produce(500)
    db = pipeline.cfg.clickhouse.database
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        publishing = failpoints.arm("leader.before-publish", "pause*1", who="E1")
        e1.start()
        assert publishing.reached.wait(60)
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        pipeline.client().command(f"ALTER TABLE `{db}`.events ADD COLUMN note String DEFAULT 'new'")
        crash = failpoints.arm("leader.before-published-row", "raise*1", who="E1")  # dies mid-way
        failpoints.release("leader.before-publish")
        assert crash.reached.wait(60)
        e1.stop.set()
        e1.ended(60)
        e2.start()  # rolls the publish forward: the moved partitions are gone from the stage table
        wait_until(lambda: (s := pipeline.ledger().txn(k)) is not None and s.state == "PUBLISHED", 60, f"{k} published")
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    assert pipeline.stage_tables() == []


def deep_verify(pipeline: Pipeline) -> dict:
    result = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    return {"exit": result.returncode, **json.loads(result.stdout)} if result.stdout else {"exit": result.returncode}


def test_two_pipelines_into_one_target_each_verify_deep_only_their_own_rows(stack, tmp_path):
    """``chtxn verify --deep`` of a pipeline checks the rows of its own topics in a shared target: B's
    rows are no anomaly of A's, and a duplicate in B's rows fails B's check, not A's."""
    a = make_pipeline(stack, tmp_path, unique_name("vsharea"))
    b = make_pipeline(
        stack, tmp_path, unique_name("vshareb"), settings={"clickhouse.database": a.cfg.clickhouse.database}
    )
    made_a, made_b = a.produce(400), b.produce(300)
    a1, b1 = LeaderThread(a, 1, "A1"), LeaderThread(b, 1, "B1")
    with (
        ScriptedParticipants(a.cfg, a.partitions, sender="pa"),
        ScriptedParticipants(b.cfg, b.partitions, sender="pb"),
        leaders(a1, b1),
    ):
        a1.start()
        b1.start()
        wait_until(lambda: own_rows(a) == made_a and own_rows(b) == made_b, 60, "both pipelines commit their records")
    assert_exactly_once(a, made_a, nothing_lost=True)
    assert_exactly_once(b, made_b, nothing_lost=True)
    for pipeline, made in ((a, made_a), (b, made_b)):
        report = deep_verify(pipeline)
        assert report["exit"] == 0 and report["ok"], report
        assert report["deep"]["rows_in_target"] == made, report
    db, table = b.cfg.clickhouse.database, b.cfg.clickhouse.target_table
    b.client().command(
        f"INSERT INTO `{db}`.`{table}` SELECT * FROM `{db}`.`{table}` WHERE _topic = {{t:String}} LIMIT 1",
        parameters={"t": b.topic},
    )
    assert deep_verify(a)["ok"], "B's duplicate is no anomaly of A's"
    broken = deep_verify(b)
    assert broken["exit"] == 1 and not broken["ok"] and any("1 duplicates" in a for a in broken["anomalies"]), broken
