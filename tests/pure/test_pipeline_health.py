"""The verdicts of ``chtxn status`` (``protocol.status.health``): replicas and their roles, the checks,
the commit rate."""

from __future__ import annotations

import pytest

from protocol.messages import TopicPartition
from protocol.status.health import (
    CAUSE_FIXES,
    LEADER,
    LEFT,
    SILENT,
    STALE_LEADER,
    Heard,
    Replica,
    commits_check,
    leader_check,
    participants_check,
    problem_check,
    replicas,
    routes_check,
    rows_per_s,
    stall_limit_s,
)

T0, T1 = TopicPartition(topic="orders", partition=0), TopicPartition(topic="orders", partition=1)


def h(epoch: int, age_s: float, leaving: bool = False) -> Heard:
    return Heard(epoch=epoch, age_s=age_s, leaving=leaving)


def test_the_leader_first_then_stale_and_silent_replicas_and_the_owner_of_the_highest_epoch() -> None:
    heard = {"old": h(3, 30.0), "stale": h(4, 0.5), "lead": h(5, 0.2)}
    found = replicas(heard, lease_s=2.0, highest_epoch=6, highest_owner="claimer")
    assert found == (
        Replica(id="lead", role=LEADER, epoch=5, heard_s=0.2),
        Replica(id="stale", role=STALE_LEADER, epoch=4, heard_s=0.5),
        Replica(id="claimer", role=SILENT, epoch=6, heard_s=None),
        Replica(id="old", role=SILENT, epoch=3, heard_s=30.0),
    )


def test_the_owner_of_the_highest_epoch_is_listed_once() -> None:
    found = replicas({"a": h(2, 0.1)}, lease_s=2.0, highest_epoch=2, highest_owner="a")
    assert found == (Replica(id="a", role=LEADER, epoch=2, heard_s=0.1),)
    assert replicas({}, lease_s=2.0, highest_epoch=0, highest_owner="") == ()


def test_leader_check_passes_on_one_leader_warns_on_a_stale_one_and_fails_on_none() -> None:
    one = replicas({"a": h(2, 0.1)}, lease_s=2.0, highest_epoch=2, highest_owner="a")
    ok = leader_check(one, lease_s=2.0, highest_epoch=2)
    assert (ok.status, ok.found) == ("ok", "a leads epoch 2, heard 0.1 s ago")

    two = replicas({"a": h(2, 0.1), "b": h(3, 0.3)}, lease_s=2.0, highest_epoch=3, highest_owner="b")
    warn = leader_check(two, lease_s=2.0, highest_epoch=3)
    assert warn.status == "warn" and "b leads epoch 3" in warn.found and "a (epoch 2)" in warn.found

    gone = replicas({"a": h(2, 9.0)}, lease_s=2.0, highest_epoch=2, highest_owner="a")
    fail = leader_check(gone, lease_s=2.0, highest_epoch=2)
    assert fail.status == "fail"
    assert fail.found == "no LEADER-HEARTBEAT within coordinator.leader_lease_s (2 s); a led epoch 2 until 9 s ago"
    assert "chtxn coordinator" in fail.fix


def test_a_leader_that_handed_the_lease_over_has_left_and_a_standby_leads() -> None:
    found = replicas({"a": h(2, 0.3, leaving=True), "b": h(3, 0.1)}, lease_s=2.0, highest_epoch=3, highest_owner="b")
    assert [(r.id, r.role) for r in found] == [("b", LEADER), ("a", LEFT)]
    gone = replicas({"a": h(2, 0.3, leaving=True)}, lease_s=2.0, highest_epoch=2, highest_owner="a")
    check = leader_check(gone, lease_s=2.0, highest_epoch=2)
    assert check.status == "fail" and check.found.endswith(
        "a led epoch 2 until 0.3 s ago (stopped, it handed the lease over)"
    )


def test_a_leader_behind_the_highest_claimed_epoch_says_a_take_over_is_under_way() -> None:
    found = replicas({"a": h(2, 0.1)}, lease_s=2.0, highest_epoch=3, highest_owner="b")
    check = leader_check(found, lease_s=2.0, highest_epoch=3)
    assert check.status == "ok" and "epoch 3 is claimed in the ledger" in check.found


def test_participants_check_names_every_partition_without_a_live_holder() -> None:
    assert participants_check({T0: "p", T1: "p"}, [T0, T1], timeout_s=3).found == "2 partitions held by 1 participant"
    failed = participants_check({T0: "p"}, [T0, T1], timeout_s=3)
    assert failed.status == "fail"
    assert failed.found.endswith("for 1 of 2 partitions: orders/1") and "within 3 s" in failed.found


@pytest.mark.parametrize(
    ("age", "head", "status", "found"),
    [
        (None, 0, "fail", "no commit yet"),
        (0.4, 7, "ok", "last commit 0.4 s ago (slot 7)"),
        (65.0, 7, "fail", "last commit 65 s ago (slot 7); limit 64 s"),
    ],
)
def test_commits_check_fails_without_a_recent_commit(age: float | None, head: int, status: str, found: str) -> None:
    check = commits_check(age, head, limit_s=stall_limit_s(2.0, 30.0))
    assert check.status == status and check.found.startswith(found)


def test_an_idle_pipeline_commits_once_per_idle_interval_so_the_stall_limit_follows_it() -> None:
    assert stall_limit_s(2.0, 30.0, 30.0) == 120.0
    assert stall_limit_s(2.0, 30.0, 0.0) == stall_limit_s(2.0, 30.0) == 64.0
    assert commits_check(65.0, 7, limit_s=stall_limit_s(2.0, 30.0, 30.0)).status == "ok"


def test_rows_per_s_counts_the_rows_after_the_oldest_commit_over_the_time_between() -> None:
    assert rows_per_s([(10.0, 500), (12.0, 100), (14.0, 300)]) == (100.0, 4.0)
    assert rows_per_s([(14.0, 300), (10.0, 500)]) == (75.0, 4.0)  # any order
    assert rows_per_s([(10.0, 5)]) == (None, 0.0)
    assert rows_per_s([(10.0, 5), (10.0, 6)]) == (None, 0.0)


def test_routes_check_fails_naming_each_held_topic_its_tables_and_the_fix() -> None:
    assert routes_check({}).status == "ok"
    check = routes_check({"eu-b": ("orders", "eu"), "eu-a": ("clicks", "eu")})
    assert (check.name, check.status) == ("routes", "fail")
    assert (
        check.found
        == "2 topics held, not read: eu-a matches the routes of clicks, eu; eu-b matches the routes of orders, eu"
    )
    assert "narrow the [[route]] patterns" in check.fix and "restart" in check.fix


def test_no_leader_names_the_cause_the_standbys_report_and_its_fix() -> None:
    standbys = [
        Replica(id="c1", role="standby", epoch=3, heard_s=0.4, problem="Code: 999. Keeper down", cause="keeper"),
        Replica(id="c2", role="standby", epoch=3, heard_s=0.2, problem="Code: 999. Keeper down", cause="keeper"),
    ]
    check = leader_check([], lease_s=2.0, highest_epoch=3, every=standbys)
    assert check.status == "fail" and check.name == "leader"
    assert check.found.startswith("the coordinators cannot lead, the cause is Keeper (c1: Code: 999. Keeper down; c2:")
    assert check.fix is not None and check.fix.startswith("start Keeper (or ZooKeeper)")


def test_a_problem_heard_longer_ago_than_the_lease_or_none_at_all_leaves_the_plain_verdict() -> None:
    old = Replica(id="c1", role="silent", epoch=3, heard_s=9.0, problem="Code: 999. Keeper down", cause="keeper")
    quiet = Replica(id="c2", role="standby", epoch=3, heard_s=0.2)
    assert problem_check("leader", [old, quiet], lease_s=2.0) is None
    check = leader_check([], lease_s=2.0, highest_epoch=3, every=[old, quiet])
    assert check.found.startswith("no LEADER-HEARTBEAT") and "start a coordinator" in (check.fix or "")


def test_a_problem_counts_through_a_retry_of_the_replica_that_reported_it() -> None:
    """A troubled replica says nothing while it retries a claim: its report stands for the retry's
    waits and one lease past its own."""
    retrying = Replica(id="c1", role="silent", epoch=3, heard_s=13.9, problem="Code: 999. Keeper down", cause="keeper")
    check = leader_check([], lease_s=2.0, highest_epoch=3, every=[retrying], retry_s=10.0)
    assert "the cause is Keeper" in check.found
    assert problem_check("leader", [retrying], lease_s=2.0, retry_s=9.8) is None  # 13.9 s > 2 * 2 + 9.8


def test_the_most_common_cause_decides_the_fix() -> None:
    replicas = [
        Replica(id="c1", role="standby", epoch=1, heard_s=0.1, problem="refused", cause="clickhouse"),
        Replica(id="c2", role="standby", epoch=1, heard_s=0.1, problem="timed out", cause="clickhouse"),
        Replica(id="c3", role="standby", epoch=1, heard_s=0.1, problem="broker gone", cause="kafka"),
    ]
    check = problem_check("commits", replicas, lease_s=2.0)
    assert check is not None and "the cause is ClickHouse" in check.found
    assert check.fix == CAUSE_FIXES["clickhouse"]
