"""Take-over under a stalled leader, scripted with failpoints: the seal fences the old epoch.

Two real ``Leader``s (epochs 1 and 2) run in threads against the embedded stack, with test code
playing the participants. Failpoints hold each leader at a chosen step, so the interleaving is
the same on every run. Every test ends with the exactly-once oracle (docs/architecture.md §11).
"""

from __future__ import annotations

from clients import failpoints
from protocol import naming
from tests.helpers import unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import assert_exactly_once, make_pipeline


def test_a_stalled_leaders_late_commit_loses_to_the_new_leaders_seal(stack, tmp_path):
    """Defect 1: E1 has counted txn k and stalls before its commit claim; E2 takes over and drops
    k's stage table as an orphan; E1's claim then lands. It must lose (the seal holds the slot),
    so nothing E1 could acknowledge is missing from the target."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("seal"))
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        stalled = failpoints.arm("leader.before-commit", "pause", who="E1")
        e1.start()
        assert stalled.reached.wait(60), "E1 never reached its commit point"
        k = participants.statuses[-1].txn
        stage_k = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, k)
        assert stage_k in pipeline.stage_tables()

        held = failpoints.arm("leader.after-take-over", "pause", who="E2")
        e2.start()
        assert held.reached.wait(60), "E2 never finished its take-over"
        assert stage_k not in pipeline.stage_tables(), "E2's take-over drops the uncommitted stage table of k"

        failpoints.release("leader.before-commit")  # E1's late claim of k's slot
        outcome = e1.ended(60)
        assert isinstance(outcome, str) and outcome.startswith("stepped down"), outcome
        states = {t.txn: t.state for t in pipeline.ledger().history(limit=100)}
        assert states.get(k) != "COMMITTED" and states.get(k) != "PUBLISHED", f"E1 committed {k} after E2's take-over"

        failpoints.release("leader.after-take-over")
        wait_until(lambda: pipeline.target_count() == produced, 60, "E2 commits every record")
    assert isinstance(e2.outcome, str), e2.outcome
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    # Both leaders' aborts are in their metrics, as many as the ledger's ABORTED rows of each kind.
    aborted = (
        pipeline.client()
        .query(
            f"SELECT coordinator, reason FROM `{pipeline.cfg.clickhouse.database}`.chtxn_ledger "
            "WHERE pipeline = {p:String} AND event = 'ABORTED'",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    )
    orphans = [r for r in aborted if r == ("E2", "orphan stage table dropped at take-over")]
    stepped = [r for r in aborted if r == ("E1", "leader stepped down")]
    assert orphans, "E2's take-over dropped k's stage table as an orphan"
    assert e2.aborts("take-over") == len(orphans)
    assert e1.aborts("step-down") == len(stepped)
    seals = pipeline.ledger().commits()[:2]
    assert [(s.txn, s.epoch, s.ranges) for s in seals] == [(naming.seal_txn(1), 1, ()), (naming.seal_txn(2), 2, ())]


def test_a_seal_lost_to_a_late_commit_rolls_that_commit_forward(stack, tmp_path):
    """The other order: E1's commit of k lands after E2 read the head but before E2's seal. E2's
    seal loses, E2 rolls k forward (publishing k's stage table, which it has not touched), and
    seals the next slot."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("sealrace"))
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        stalled = failpoints.arm("leader.before-commit", "pause*1", who="E1")
        acked = failpoints.arm("leader.before-publish", "pause", who="E1")
        e1.start()
        assert stalled.reached.wait(60), "E1 never reached its commit point"
        k = participants.statuses[-1].txn

        sealing = failpoints.arm("leader.before-seal", "pause*1", who="E2")
        e2.start()
        assert sealing.reached.wait(60), "E2 never read the head"
        failpoints.release("leader.before-commit")  # E1 commits k into the slot E2 is about to seal
        assert acked.reached.wait(60), "E1 never committed k"
        assert pipeline.ledger().txn(k).state == "COMMITTED"

        failpoints.release("leader.before-seal")  # E2's seal loses; it rolls k forward
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", 60, f"E2 publishes {k}")
        failpoints.release("leader.before-publish")  # E1 publishes k too: idempotent
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
        e1.stop.set()
        e1.ended(60)
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    commits = pipeline.ledger().commits()
    assert [c.txn for c in commits[:3]] == [naming.seal_txn(1), k, naming.seal_txn(2)]


def test_a_committed_txn_whose_stage_table_is_gone_is_an_alarm_not_published(stack, tmp_path):
    """Publishing a committed txn whose stage table is missing records LOST (verify fails), never PUBLISHED."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("lost"))
    produced = pipeline.produce(300)
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1):
        before = failpoints.arm("leader.before-publish", "pause*1", who="E1")
        e1.start()
        assert before.reached.wait(60)
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        stage_k = naming.stage_table(pipeline.cfg.clickhouse.target_table, pipeline.cfg.name, k)
        pipeline.client().command(
            f"DROP TABLE `{pipeline.cfg.clickhouse.database}`.`{stage_k}`"
        )  # an operator's mistake
        failpoints.release("leader.before-publish")
        summary = wait_until(
            lambda: (s := pipeline.ledger().txn(k)) and s.state != "COMMITTED" and s, 60, f"{k} resolved"
        )
    assert summary.state == "LOST", summary
    audit = pipeline.ledger().audit()
    assert any(k in line and "never published" in line for line in audit), audit
    assert not pipeline.oracle().ok
    assert pipeline.target_count() < produced


def test_an_older_epoch_never_seals_on_top_of_a_newer_leaders_seal(stack, tmp_path):
    """E1 (epoch 1) stalls before its take-over while E2 (epoch 2) takes over and seals. When E1
    goes on, it reads a head that holds E2's seal, and must step down without claiming a slot: a seal of the older epoch on top of the newer
    one would take the slot E2 commits into next, and both leaders would step down (no one left
    leading). E2 goes on committing every record."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("sealorder"))
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1, e2):
        sealing = failpoints.arm("leader.before-take-over", "pause*1", who="E1")
        e1.start()
        assert sealing.reached.wait(60), "E1 never reached its take-over"
        held = failpoints.arm("leader.after-take-over", "pause*1", who="E2")
        e2.start()
        assert held.reached.wait(60), "E2 never finished its take-over"

        failpoints.release("leader.before-take-over")  # E1 reads a head that holds E2's seal
        outcome = e1.ended(60)
        assert isinstance(outcome, str) and outcome.startswith("stepped down"), outcome
        failpoints.release("leader.after-take-over")
        wait_until(lambda: pipeline.target_count() == produced, 60, "E2 commits every record")
    assert isinstance(e2.outcome, str) and not e2.outcome.startswith("stepped down"), e2.outcome
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    assert [(c.txn, c.epoch) for c in pipeline.ledger().commits()][:1] == [(naming.seal_txn(2), 2)]
    assert all(c.epoch == 2 for c in pipeline.ledger().commits()), "epoch 1 claimed a slot after epoch 2's seal"
