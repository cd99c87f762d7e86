"""ZooKeeper stopped under a running pipeline with the keeper commit point and two coordinator
replicas: no slot can be claimed, the replicas back off, and ``chtxn status`` names Keeper as the
cause (from what the replicas' STANDBY-HEARTBEATs say), with its fix, instead of "start a
coordinator". Keeper back, the pipeline goes on and every record is committed exactly once."""

from __future__ import annotations

import json

from clients import failpoints
from protocol.messages import LeaderHeartbeat
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import control_messages, make_pipeline

#: ``chtxn status`` runs in a second or two: this many span a replica's retry cycle (about 16 s).
STATUS_POLLS = 12


def status_checks(pipeline) -> dict[str, dict]:
    shown = run_chtxn("status", "--config", str(pipeline.config_path), "--json")
    return {c["name"]: c for c in json.loads(shown.stdout)["checks"]}


def test_zookeeper_stopped_under_a_running_pipeline_is_named_by_status(keeper_stack, tmp_path):
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("zkout"), settings={"ledger.commit_point": "keeper"})
    first = pipeline.produce(100)
    replicas = ServiceThread(pipeline.cfg, "c1"), ServiceThread(pipeline.cfg, "c2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), replicas[0], replicas[1]:
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        keeper_stack.keeper.stop()
        try:
            more = pipeline.produce(50, start_id=first)

            # The leader steps down once a commit claim has failed for good; from the first status
            # that no longer hears it, and over a whole retry cycle of the replicas after (a claim
            # retried for up to clickhouse_retries, then a back-off), every status names Keeper.
            checks = wait_until(lambda: no_leader(pipeline), 90, "the leader to step down")
            said = [checks["leader"]] + [status_checks(pipeline)["leader"] for _ in range(STATUS_POLLS)]
            assert not unnamed(said), unnamed(said)
            assert all(s["fix"].startswith("start Keeper (or ZooKeeper)") for s in said), said
        finally:
            keeper_stack.restart_keeper()
        wait_until(lambda: pipeline.target_count() == first + more, 120, "the records committed once Keeper is back")
        wait_until(lambda: status_checks(pipeline)["leader"]["status"] == "ok", 60, "a leader again")
    report = pipeline.oracle()
    assert report.ok and report.rows_in_target == first + more, report.anomalies
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout


def test_a_standby_names_keeper_from_the_first_retry_of_its_epoch_claim(keeper_stack, tmp_path):
    """A standby whose epoch claim is retried against a stopped Keeper says why in its beats from its
    first retry, not only once the claim has failed for good. Each try is stalled 2 s by a failpoint,
    so one claim's tries and waits (over 28 s) outlast what ``chtxn status`` counts a report for
    (two leases and the retry waits, 16 s): under load, a claim's tries get as slow as that."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("zkretry"), settings={"ledger.commit_point": "keeper"})
    first = pipeline.produce(20)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        with ServiceThread(pipeline.cfg, "c1"):  # the tables, the commit point and one epoch exist
            wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        keeper_stack.keeper.stop()
        failpoints.arm("keeper.after-key-insert", "stall(2)", who="c2")
        try:
            with ServiceThread(pipeline.cfg, "c2"):
                leader = wait_until(lambda: keeper_named(pipeline), 15, "status to name Keeper")
                said = [leader] + [status_checks(pipeline)["leader"] for _ in range(STATUS_POLLS)]
                assert not unnamed(said), unnamed(said)
                assert any("retrying" in s["found"] for s in said), said
                failpoints.disarm()
                keeper_stack.restart_keeper()
                more = pipeline.produce(20, start_id=first)
                wait_until(lambda: pipeline.target_count() == first + more, 120, "the records committed by c2")
        finally:
            failpoints.disarm()
            keeper_stack.restart_keeper()
    report = pipeline.oracle()
    assert report.ok and report.rows_in_target == first + more, report.anomalies
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout


def test_a_leader_that_stepped_down_names_keeper_over_its_own_unread_heartbeats(keeper_stack, tmp_path):
    """The leader steps down once a commit claim has failed for good. Held at that step (a failpoint), it
    reads nothing while its lease still beats; its standby loop reads those heartbeats afterwards. They
    are its own past, not a leader heard: its beats go on naming Keeper from the first status that
    hears no leader, and through its own epoch claim (each try held 3 s), which says more."""
    pipeline = make_pipeline(keeper_stack, tmp_path, unique_name("zkown"), settings={"ledger.commit_point": "keeper"})
    first = pipeline.produce(20)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        held = failpoints.arm("leader.stepping-down", "pause", who="c1")
        keeper_stack.keeper.stop()
        try:
            more = pipeline.produce(20, start_id=first)
            assert held.reached.wait(120), "the leader never stepped down"
            beats = leader_heartbeats(pipeline, "c1")
            wait_until(lambda: leader_heartbeats(pipeline, "c1") > beats, 15, "a heartbeat the held leader never read")
            failpoints.arm("keeper.after-key-insert", "stall(3)", who="c1")
            failpoints.release("leader.stepping-down")
            checks = wait_until(lambda: no_leader(pipeline), 30, "status to hear no leader")
            said = [checks["leader"]] + [status_checks(pipeline)["leader"] for _ in range(STATUS_POLLS // 2)]
            assert not unnamed(said), unnamed(said)
        finally:
            failpoints.disarm()
            keeper_stack.restart_keeper()
        wait_until(lambda: pipeline.target_count() == first + more, 120, "the records committed once Keeper is back")
    report = pipeline.oracle()
    assert report.ok and report.rows_in_target == first + more, report.anomalies
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout


def leader_heartbeats(pipeline, sender: str) -> int:
    """How many LEADER-HEARTBEATs ``sender`` has sent so far."""
    return sum(1 for m in control_messages(pipeline) if isinstance(m, LeaderHeartbeat) and m.sender == sender)


def no_leader(pipeline) -> dict | None:
    """The checks of ``chtxn status`` when its leader check is not ok, else None."""
    checks = status_checks(pipeline)
    return checks if checks["leader"]["status"] != "ok" else None


def unnamed(said: list[dict]) -> list[tuple[int, str, str]]:
    """The leader checks of ``said`` that do not fail naming Keeper, as (index among ``said``, status, found):
    what a failure shows whole, where the list of every check would be cut short."""
    return [
        (i, s["status"], s["found"])
        for i, s in enumerate(said)
        if s["status"] != "fail" or "the cause is Keeper" not in s["found"]
    ]


def keeper_named(pipeline) -> dict | None:
    """The leader check when it names Keeper as the cause, else None."""
    leader = status_checks(pipeline)["leader"]
    return leader if "the cause is Keeper" in leader["found"] else None
