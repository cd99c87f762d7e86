"""The soak's fault schedule is a function of its seed (pure: nothing is started)."""

from __future__ import annotations

from clients.failpoints import POINTS
from tests.soak.schedule import CHANGE_KINDS, KEEPER_KINDS, KEEPER_POINTS, KINDS, RESET_RACES, draw_schedule


def test_the_same_seed_draws_the_same_schedule():
    assert draw_schedule(11, 600) == draw_schedule(11, 600)
    assert draw_schedule(11, 600) != draw_schedule(12, 600)


def test_a_longer_soak_starts_with_the_shorter_ones_faults():
    short, long = draw_schedule(5, 60), draw_schedule(5, 600)
    assert long[: len(short)] == short


def test_every_round_of_faults_covers_every_kind_once():
    plans = draw_schedule(3, 600)
    for first in range(0, len(plans) - len(KINDS) + 1, len(KINDS)):
        assert sorted(p.kind for p in plans[first : first + len(KINDS)]) == sorted(KINDS)


def test_parameters_stay_in_their_ranges():
    for plan in draw_schedule(8, 3000):
        assert 1.0 <= plan.quiet_s <= 4.0
        if plan.kind == "leader-stall":
            assert plan.hold_s > 2.0  # longer than the 2 s leader lease
        if plan.kind == "clickhouse-slow":
            assert 0.3 <= plan.params["delay_s"] <= 1.5
        if plan.kind == "failpoint":
            assert plan.params["point"] in POINTS and plan.params["point"].startswith("leader.")
            assert plan.params["action"] == "crash*1" or plan.params["action"].startswith("stall(")


def test_the_keeper_faults_come_only_with_the_keeper_commit_point() -> None:
    token = draw_schedule(6, 600)
    keeper = draw_schedule(6, 600, keeper=True)
    assert not {p.kind for p in token} & set(KEEPER_KINDS)
    assert not {p.params.get("point") for p in token} & set(KEEPER_POINTS)
    assert set(KEEPER_KINDS) <= {p.kind for p in keeper[: len(KINDS) + len(KEEPER_KINDS)]}, "one round has each kind"
    assert set(KEEPER_POINTS) <= {p.params.get("point") for p in keeper}
    assert all(2.0 <= p.hold_s <= 10.0 for p in keeper if p.kind == "keeper-restart")


def test_the_change_faults_come_only_with_changes_and_each_in_every_round() -> None:
    plain = draw_schedule(9, 600)
    changes = draw_schedule(9, 600, changes=True)
    assert not {p.kind for p in plain} & set(CHANGE_KINDS)
    kinds = len(KINDS) + len(CHANGE_KINDS)
    assert sorted(p.kind for p in changes[:kinds]) == sorted(KINDS + CHANGE_KINDS), "one round has each kind"
    for plan in changes:
        if plan.kind == "reset-race":
            assert plan.params["race"] in RESET_RACES and 20 <= plan.params["rewind"] <= 600
        if plan.kind == "route-remove":
            assert 3.0 <= plan.hold_s <= 15.0
