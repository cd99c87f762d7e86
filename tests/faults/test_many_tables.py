"""One txn across several tables (``[[route]]``), one commit point: a leader stalled between two
tables' publishes is rolled forward by the next, and a stage table of one table failing step 5
aborts the txn in every table.

Real ``Leader``s in threads against the embedded stack, with test code playing the participants;
failpoints hold a leader at a chosen step. Every test ends with the exactly-once oracle per table.
"""

from __future__ import annotations

from clients import failpoints
from protocol import naming
from tests.helpers import unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.routed import (
    assert_exactly_once_per_table,
    make_routed_pipeline,
    produce_to,
    stage_tables_left,
    table_count,
)

WAIT_S = 60.0


def test_a_leader_stalled_between_two_tables_publishes_is_rolled_forward_by_the_next(stack, tmp_path):
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtpub"), tables=3)
    produced = {f"t{i}": produce_to(pipeline, f"{pipeline.cfg.name}_t{i}", 200 + 100 * i) for i in range(3)}
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        between = failpoints.arm("leader.between-table-publishes", "pause*1", who="E1")
        e1.start()
        assert between.reached.wait(WAIT_S), "E1 never published a first table"
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        assert table_count(pipeline, "t0") > 0 and table_count(pipeline, "t1") == table_count(pipeline, "t2") == 0
        assert pipeline.ledger().txn(k).state == "COMMITTED", "the txn is committed, half published"
        e2.start()  # seals, then rolls k forward: t0's stage table is empty, t1's and t2's are moved
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by E2")
        failpoints.release("leader.between-table-publishes")  # E1 goes on: the rest is gone, published
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), WAIT_S, "every record committed"
        )
        wait_until(lambda: isinstance(e1.outcome, str), WAIT_S, "E1 stepped down")
    assert_exactly_once_per_table(pipeline, produced)
    assert stage_tables_left(pipeline) == []
    commit = next(c for c in pipeline.ledger().commits() if c.txn == k)
    assert commit.target == "t0,t1,t2" and {r.topic for r in commit.ranges if r.rows} == {
        f"{pipeline.cfg.name}_t{i}" for i in range(3)
    }


def test_one_tables_stage_table_failing_step_5_aborts_the_txn_in_every_table(stack, tmp_path):
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtcheck"), tables=3)
    produced = {f"t{i}": produce_to(pipeline, f"{pipeline.cfg.name}_t{i}", 300) for i in range(3)}
    db = pipeline.cfg.clickhouse.database
    with (
        ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants,
        leaders(e1 := LeaderThread(pipeline, 1, "E1")),
    ):
        counting = failpoints.arm("leader.before-count", "pause*1", who="E1")
        e1.start()
        assert counting.reached.wait(WAIT_S)
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        pipeline.client().command(f"DROP TABLE `{db}`.`{naming.stage_table('t1', pipeline.cfg.name, k)}`")
        failpoints.release("leader.before-count")
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), WAIT_S, "every record committed"
        )
    aborted = {t.txn: t.reason for t in pipeline.ledger().history(limit=100, state="ABORTED")}
    assert "does not exist" in aborted.get(k, ""), aborted
    assert_exactly_once_per_table(pipeline, produced)
