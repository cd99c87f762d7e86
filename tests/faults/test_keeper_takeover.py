"""Take-over with the Keeper commit point (``ledger.commit_point = "keeper"``), scripted with failpoints.

Two real ``Leader``s (epochs 1 and 2) run in threads against chDB configured for a real ZooKeeper,
with test code playing the participants; failpoints hold each leader at a chosen step, so the
interleaving is the same on every run. Every test ends with the exactly-once oracle.
"""

from __future__ import annotations

import json

import pytest

from clients import failpoints
from protocol import naming
from protocol.messages import AckCommit
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

KEEPER = {"ledger.commit_point": "keeper"}


def assert_verified_deep(pipeline: Pipeline) -> None:
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr


@pytest.mark.parametrize("held_at", ["keeper.after-key-insert", "leader.after-keeper-claim"])
def test_two_leaders_racing_for_one_slot_the_older_holds_its_key_and_the_newer_rolls_it_forward(
    keeper_stack, tmp_path, held_at
):
    """E1 wins txn k's key and stalls before k's row reaches the ledger (held as its key insert
    answered, before it read anything, or after its checkpoint read); E2 takes over meanwhile.
    E2's head ends before k, so E2 seals k's slot: the seal loses to E1's key, E2 copies k's row
    from Keeper, publishes k and seals the next slot. E1 then writes k's row (stored once) and
    publishes k again (idempotent). Every record once; the oracle and verify --deep agree.
    Broken claim run against: a loser that does not copy the winner (E2 never finished its
    take-over: it sealed k's slot again and again)."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("kraceslot"), settings=KEEPER)
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        sealed = failpoints.arm("leader.after-take-over", "pause*1", who="E1")
        e1.start()
        assert sealed.reached.wait(60), "E1 never took over"
        claimed = failpoints.arm(held_at, "pause*1", who="E1")  # its next claim: a txn's
        failpoints.release("leader.after-take-over")
        assert claimed.reached.wait(60), "E1 never won a commit key"
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        assert pipeline.ledger().txn(k).state == "STARTED", "k's key is won, its row not yet written"

        e2.start()
        wait_until(lambda: (s := pipeline.ledger().txn(k)) and s.state == "PUBLISHED", 60, f"E2 rolls {k} forward")
        seal2 = naming.seal_txn(2)
        wait_until(lambda: any(c.txn == seal2 for c in pipeline.ledger().commits()), 60, "E2 seals the next slot")

        failpoints.release(held_at)  # E1 writes k's row: already there, stored once
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
        e1.stop.set()
        e1.ended(60)
    assert isinstance(e2.outcome, str), e2.outcome
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    commits = pipeline.ledger().commits()
    assert [c.txn for c in commits if c.txn in (k, seal2)] == [k, seal2]
    k_rows = pipeline.ledger()._rows_of([k])[k]
    assert [r.event for r in k_rows].count("COMMITTED") == 1, k_rows
    assert_verified_deep(pipeline)


def test_a_commit_key_insert_whose_answer_is_lost_is_read_back_and_the_leader_commits_on(keeper_stack, tmp_path):
    """Keeper takes the key of E1's next txn commit but the insert's answer is lost (failpoint
    ``keeper.after-key-insert`` raises once, as a connection dropped after the insert). E1 reads
    the key back, finds it its own, writes the txn's row and commits on; it never steps down.
    Every record once, each txn's COMMITTED row stored once; the oracle and verify --deep agree.
    Broken claim run against: a failed key insert taken as lost (E1 stepped down, its own key
    standing in Keeper, and the records were never committed)."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("klost"), settings=KEEPER)
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1):
        sealed = failpoints.arm("leader.after-take-over", "pause*1", who="E1")
        e1.start()
        assert sealed.reached.wait(60), "E1 never took over"
        lost = failpoints.arm("keeper.after-key-insert", "raise*1", who="E1")  # its next claim: a txn's
        failpoints.release("leader.after-take-over")
        assert lost.reached.wait(60), "E1 never claimed a commit key"
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
        assert e1.outcome is None, f"E1 stepped down: {e1.outcome}"
        e1.stop.set()
        e1.ended(60)
    assert lost.fired == 1
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    commits = pipeline.ledger().commits()
    assert [c.commit_seq for c in commits] == list(range(1, len(commits) + 1)), commits
    txns = [c.txn for c in commits]
    rows = pipeline.ledger()._rows_of(txns)
    assert all([r.event for r in rows[t]].count("COMMITTED") == 1 for t in txns), rows
    assert_verified_deep(pipeline)


def test_a_stalled_leaders_claim_loses_to_the_new_leaders_seal_key(keeper_stack, tmp_path, caplog):
    """E1 counted txn k and stalls before claiming; E2 takes over, seals k's slot and drops k's
    stage table as an orphan. The seal is followed by a checkpoint, which forgets the seal's key,
    so E1's late claim gets the key again: it must still lose (a checkpoint covers the slot) and
    step down without acknowledging k. Every record once, committed by E2.
    Broken claim run against: ``KeeperCommitPoint._covered`` always False (E1's claim got past the
    key and lost only at the ledger's row of the slot, step 6c, which names the wrong cause).
    E2's heartbeats are hidden from E1, so E1 learns of E2 from its claim alone: E1's loop reads on
    while its claim is held, and stepped down on E2's lease first in 1 run of 2."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("kstall"), settings=KEEPER)
    produced = pipeline.produce(1_000)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2):
        stalled = failpoints.arm("leader.before-commit", "pause", who="E1")
        e1.start()
        assert stalled.reached.wait(60), "E1 never reached its commit point"
        k = participants.statuses[-1].txn
        k_slot = pipeline.ledger().head()[0] + 1

        failpoints.arm("control.hide-record", "raise", who="E1/leader-heartbeat")
        held = failpoints.arm("leader.after-take-over", "pause", who="E2")
        e2.start()
        assert held.reached.wait(60), "E2 never finished its take-over"

        failpoints.release("leader.before-commit")  # E1's late claim of k's slot
        outcome = e1.ended(60)
        assert isinstance(outcome, str) and f"lost commit slot {k_slot} of {k}" in outcome, outcome
        assert "a claim of a slot a checkpoint covers got its key; it owns nothing" in caplog.messages
        states = {t.txn: t.state for t in pipeline.ledger().history(limit=100)}
        assert states.get(k) not in ("COMMITTED", "PUBLISHED"), f"E1 committed {k} after E2's take-over"

        failpoints.release("leader.after-take-over")
        wait_until(lambda: pipeline.target_count() == produced, 60, "E2 commits every record")
    assert isinstance(e2.outcome, str), e2.outcome
    acked = {m.txn for _, m in pipeline.control_records() if isinstance(m, AckCommit)}
    assert k not in acked, f"E1 acknowledged {k} after losing its slot"
    assert_exactly_once(pipeline, produced, nothing_lost=True)
