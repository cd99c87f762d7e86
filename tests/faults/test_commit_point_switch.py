"""A rolling switch of ``ledger.commit_point`` from ``token`` to ``keeper`` on the real stack (chDB
configured for a real ZooKeeper, the embedded broker): coordinators of the other commit point refuse
to start, a stalled old-mode leader loses the switch's slot and never claims by the old commit point
again, and the documented procedure (pause, switch, resume) ends with every record once, the oracle
and ``chtxn verify --deep`` agreeing. Interleavings are scripted with failpoints.

Each test names the failure it showed on main (0e354a1) in its docstring.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from clients import failpoints
from coordinator.ledger import commit_points
from coordinator.ledger.commit_points import CommitPointMismatch
from protocol.config.parse import parse_config
from protocol.ledger import claims as ledger_claims
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

SWITCH = "chtxn commit-point switch --to keeper"


def keeper_twin(pipeline: Pipeline, tmp_path: Path) -> Pipeline:
    """The same pipeline configured with ``ledger.commit_point = "keeper"`` (its own config file)."""
    path = tmp_path / f"{pipeline.cfg.name}-keeper.toml"
    text = pipeline.config_path.read_text() + '\n[ledger]\ncommit_point = "keeper"\n'
    path.write_text(text)
    return Pipeline(parse_config(text, source=str(path)), path, pipeline.partitions)


def keeper_keys(pipeline: Pipeline) -> list[int]:
    """The commit slots of the pipeline that hold a Keeper key, sorted."""
    rows = (
        pipeline.client()
        .query(
            f"SELECT slot FROM {ledger_claims.qualified(pipeline.cfg.clickhouse.database)} "
            "WHERE pipeline = {p:String} AND kind = 'commit'",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    )
    return sorted(int(r[0]) for r in rows)


def verify_deep(pipeline: Pipeline) -> None:
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr


def test_a_coordinator_of_the_other_commit_point_refuses_to_start_naming_the_switch(keeper_stack, tmp_path):
    """A token-mode coordinator commits; a keeper-mode one started beside it stops at once with an
    error naming the ledger's commit point and the switch procedure. On main it started, stood by
    and would have claimed slots by Keeper keys beside the token leader's rows."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("cpmixed"))
    produced = pipeline.produce(200)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        wait_until(lambda: pipeline.target_count() == produced, 60, "the token leader commits")
        keeper = ServiceThread(keeper_twin(pipeline, tmp_path).cfg, "c2")
        with pytest.raises(CommitPointMismatch) as refused, keeper:
            error = keeper.ended(60, "the keeper-mode coordinator stops")
            raise error if error else AssertionError("the keeper-mode coordinator stopped without an error")
        assert 'ledger.commit_point = "token"' in str(refused.value) and SWITCH in str(refused.value), refused.value
        shown = run_chtxn("commit-point", "show", "--config", str(pipeline.config_path), "--json", check=True)
        assert json.loads(shown.stdout)["commit_point"]["mode"] == "token"
    assert keeper_keys(pipeline) == [], "a refused coordinator claimed a Keeper key"
    assert_exactly_once(pipeline, produced, nothing_lost=True)


def test_the_switch_procedure_pause_switch_resume_moves_a_running_pipeline_to_keeper(keeper_stack, tmp_path):
    """chtxn pause; the switch is refused while the token leader holds the lease; the leader is
    stopped; chtxn commit-point switch --to keeper; a token coordinator started now refuses; a
    keeper coordinator takes over; chtxn resume. Slots up to the switch's have no Keeper key, every
    later one has; every record once; the oracle and verify --deep agree. On main there was no
    switch and nothing recorded which commit point a ledger used."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("cpswitch"))
    keeper = keeper_twin(pipeline, tmp_path)
    config = str(pipeline.config_path)
    first = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        with ServiceThread(pipeline.cfg, "c1"):
            wait_until(lambda: pipeline.target_count() == first, 60, "the token leader commits")
            run_chtxn("pause", "--config", config, "--reason", "moving to Keeper", check=True)
            refused = run_chtxn("commit-point", "switch", "--config", config, "--to", "keeper")
            assert refused.returncode == 1 and "c1 (epoch 1) holds the lease" in refused.stderr, refused.stderr
        switched = run_chtxn("commit-point", "switch", "--config", config, "--to", "keeper", "--json", check=True)
        slot = json.loads(switched.stdout)["commit_seq"]
        assert json.loads(switched.stdout)["frm"] == "token"
        again = run_chtxn("commit-point", "switch", "--config", config, "--to", "keeper", "--json", check=True)
        assert json.loads(again.stdout)["already"] is True, "a second switch is not a no-op"

        token = ServiceThread(pipeline.cfg, "c3")
        with pytest.raises(CommitPointMismatch) as stale, token:
            error = token.ended(60, "a token coordinator started after the switch stops")
            raise error if error else AssertionError("the token coordinator stopped without an error")
        assert 'ledger.commit_point = "keeper"' in str(stale.value), stale.value

        with ServiceThread(keeper.cfg, "c2"):
            wait_until(lambda: bool(keeper_keys(pipeline)), 60, "the keeper leader seals by a Keeper key")
            run_chtxn("resume", "--config", str(keeper.config_path), check=True)
            more = pipeline.produce(300, start_id=first)
            wait_until(lambda: pipeline.target_count() == first + more, 90, "every record committed")
    keys = keeper_keys(keeper)
    assert keys and min(keys) > slot, f"keys {keys}: slots after the switch's ({slot}) are claimed by Keeper"
    assert keeper.ledger().commit_at(slot).txn == f"switch_keeper_s{slot}"
    assert_exactly_once(keeper, first + more, nothing_lost=True)
    verify_deep(keeper)


def test_a_stalled_token_leader_loses_the_switchs_slot_and_never_claims_by_token_again(keeper_stack, tmp_path):
    """Token leader E1 holds txn k at its commit point (a frozen leader whose lease ran out, so the
    switch's lease check passes); the pipeline is paused and switched. E1's late claim of k's slot
    loses to the switch's marker and E1 steps down; a token leader E2 then stops at take-over; a
    keeper leader E3 takes over, the pipeline resumes, and every record is committed once, k's
    included. On main there was no switch to lose to."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("cpstall"))
    keeper = keeper_twin(pipeline, tmp_path)
    produced = pipeline.produce(500)
    e1 = LeaderThread(pipeline, 1, "E1")
    e2 = LeaderThread(pipeline, 2, "E2")
    e3 = LeaderThread(keeper, 3, "E3")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1, e2, e3):
        held = failpoints.arm("leader.before-commit", "pause*1", who="E1")
        e1.start()
        assert held.reached.wait(60), "E1 never reached its commit point"
        k = participants.statuses[-1].txn
        run_chtxn("pause", "--config", str(pipeline.config_path), check=True)
        k_slot = pipeline.ledger().head()[0] + 1  # past the pause's marker, which took the slot k was to claim
        done = commit_points.switch(pipeline.cfg, pipeline.client(), to="keeper", who="op", reason="", leaders={})
        assert done.commit_seq == k_slot, "the switch took another slot than the held commit's"

        failpoints.release("leader.before-commit")
        outcome = e1.ended(60)
        assert isinstance(outcome, str) and f"lost commit slot {k_slot} of {k}" in outcome, outcome

        e2.start()
        assert isinstance(e2.ended(60), CommitPointMismatch), e2.outcome
        assert keeper.ledger().head()[0] == k_slot, "a token leader claimed a slot after the switch"

        e3.start()
        wait_until(lambda: keeper.ledger().head()[0] > k_slot, 60, "E3 seals by a Keeper key")
        run_chtxn("resume", "--config", str(keeper.config_path), check=True)
        wait_until(lambda: pipeline.target_count() == produced, 90, "every record committed")
    assert isinstance(e3.outcome, str), e3.outcome
    assert min(keeper_keys(keeper)) > k_slot
    assert_exactly_once(keeper, produced, nothing_lost=True)
    verify_deep(keeper)


@pytest.mark.parametrize("step", ["switch.before-claim", "switch.before-record"])
def test_a_switch_killed_at_each_step_is_finished_by_running_it_again(keeper_stack, tmp_path, step):
    """The switch is SIGKILLed before its marker's claim, or between the marker and the record.
    Before the claim nothing changed; between, the marker is the switch, even under a checkpoint
    that covers its slot: a token coordinator refuses. Running it again records the switch once, at the marker's slot."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("cpkill"))
    config = str(pipeline.config_path)
    produced = pipeline.produce(100)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        wait_until(lambda: pipeline.target_count() == produced, 60, "the token leader commits")
        run_chtxn("pause", "--config", config, check=True)
    head = pipeline.ledger().head()[0]
    killed = run_chtxn(
        "commit-point", "switch", "--config", config, "--to", "keeper", env={"CHTXN_FAILPOINTS": f"{step}=crash"}
    )
    assert killed.returncode != 0, killed.stdout
    if step == "switch.before-record":  # an old leader's checkpoint may cover the marker's slot
        assert pipeline.ledger().checkpoint(epoch=1, coordinator="c1") == head + 1
    fact = commit_points.current(pipeline.ledger())
    assert fact is not None
    if step == "switch.before-claim":
        assert (fact.mode, pipeline.ledger().head()[0]) == ("token", head)
    else:
        assert (fact.mode, fact.since, fact.recorded) == ("keeper", head + 1, False)
        with pytest.raises(CommitPointMismatch):
            commit_points.ensure(pipeline.ledger(), "c9")
    done = json.loads(
        run_chtxn("commit-point", "switch", "--config", config, "--to", "keeper", "--json", check=True).stdout
    )
    assert done["commit_seq"] == head + 1
    fact = commit_points.current(pipeline.ledger())
    assert fact == commit_points.Fact(mode="keeper", since=head + 1, recorded=True, who=fact.who)
    records = (
        pipeline.client()
        .query(
            f"SELECT count() FROM `{pipeline.cfg.clickhouse.database}`.chtxn_ledger "
            "WHERE pipeline = {p:String} AND event = 'COMMIT_POINT' AND commit_seq > 0",
            parameters={"p": pipeline.cfg.name},
        )
        .result_rows
    )
    assert records[0][0] == 1
    assert msgspec.structs.astuple(fact)[0] == "keeper"
