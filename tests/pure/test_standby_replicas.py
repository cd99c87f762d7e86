"""Standbys' heartbeats: ``chtxn status``'s replicas with the standbys (``protocol.status.standbys``),
where a replica's latest heartbeat, leader's or standby's, says what it is; and no leader, standby or
participant acts on a STANDBY-HEARTBEAT."""

from __future__ import annotations

from protocol.coordinator.events import Received, Tick
from protocol.coordinator.leadership import LeaseWatch
from protocol.messages import StandbyHeartbeat
from protocol.participant.events import Received as PReceived
from protocol.participant.state import ParticipantState
from protocol.status.health import Heard, Replica, leader_check, replicas
from protocol.status.standbys import STANDBY, with_standbys
from tests.pure.coordinator_driver import EPOCH, P0, P1, PIPE, T0, Driver, beats

LEASE = 10.0


def roles(found: tuple[Replica, ...]) -> list[tuple[str, str, int, float | None]]:
    return [(r.id, r.role, r.epoch, r.heard_s) for r in found]


def test_a_leader_and_a_standby_that_never_led() -> None:
    found = replicas({"a": Heard(epoch=3, age_s=1.0)}, lease_s=LEASE, highest_epoch=3, highest_owner="a")
    every = with_standbys(found, {"b": Heard(epoch=3, age_s=2.04)}, lease_s=LEASE)
    assert roles(every) == [("a", "leader", 3, 1.0), ("b", STANDBY, 0, 2.0)]


def test_a_former_leader_standing_by_is_a_standby_with_the_epoch_it_led() -> None:
    leaders = {"a": Heard(epoch=2, age_s=30.0), "b": Heard(epoch=3, age_s=0.5)}
    found = replicas(leaders, lease_s=LEASE, highest_epoch=3, highest_owner="b")
    assert roles(found)[1] == ("a", "silent", 2, 30.0)
    every = with_standbys(found, {"a": Heard(epoch=3, age_s=1.5)}, lease_s=LEASE)
    assert roles(every) == [("b", "leader", 3, 0.5), ("a", STANDBY, 2, 1.5)]


def test_a_standby_that_just_took_over_is_the_leader() -> None:
    found = replicas({"b": Heard(epoch=4, age_s=0.2)}, lease_s=LEASE, highest_epoch=4, highest_owner="b")
    every = with_standbys(found, {"b": Heard(epoch=3, age_s=0.9)}, lease_s=LEASE)
    assert roles(every) == [("b", "leader", 4, 0.2)]


def test_stopped_standbys_are_left_or_silent() -> None:
    standbys = {"clean": Heard(epoch=1, age_s=3.0, leaving=True), "killed": Heard(epoch=1, age_s=LEASE + 5)}
    every = with_standbys((), standbys, lease_s=LEASE)
    assert roles(every) == [("clean", "left", 0, 3.0), ("killed", "silent", 0, 15.0)]


def test_the_owner_of_the_highest_epoch_standing_by_is_a_standby() -> None:
    found = replicas({}, lease_s=LEASE, highest_epoch=5, highest_owner="a")
    assert roles(found) == [("a", "silent", 5, None)]
    every = with_standbys(found, {"a": Heard(epoch=5, age_s=1.0)}, lease_s=LEASE)
    assert roles(every) == [("a", STANDBY, 5, 1.0)]
    assert leader_check(found, lease_s=LEASE, highest_epoch=5).status == "fail", "standing by is not leading"


def test_the_order_is_leader_stale_leader_standbys_left_silent() -> None:
    leaders = {"lead": Heard(epoch=4, age_s=0.1), "stale": Heard(epoch=3, age_s=0.3), "gone": Heard(epoch=2, age_s=99)}
    found = replicas(leaders, lease_s=LEASE, highest_epoch=4, highest_owner="lead")
    standbys = {
        "s2": Heard(epoch=4, age_s=1.0),
        "s1": Heard(epoch=4, age_s=2.0),
        "bye": Heard(epoch=4, age_s=1.0, leaving=True),
    }
    every = with_standbys(found, standbys, lease_s=LEASE)
    assert [(r.id, r.role) for r in every] == [
        ("lead", "leader"),
        ("stale", "stale leader"),
        ("s1", STANDBY),
        ("s2", STANDBY),
        ("bye", "left"),
        ("gone", "silent"),
    ]


# ---- no one acts on a standby's heartbeat --------------------------------------------------------


def standby_beat(epoch: int) -> StandbyHeartbeat:
    return StandbyHeartbeat(pipeline=PIPE, epoch=epoch, txn="", sender="coord-b")


def test_a_leader_ignores_a_standby_heartbeat_even_of_a_newer_epoch() -> None:
    d = Driver()
    d.started(T0)
    assert d.at(T0 + 0.5, Received(standby_beat(EPOCH)), Received(standby_beat(EPOCH + 1))) == []
    assert not d.state.stepped_down
    assert d.at(T0 + 0.6, *beats(P0, P1), Tick()) == [], "the txn goes on as if nothing was read"


def test_a_standby_heartbeat_is_no_sign_of_a_leader_to_a_standby() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(standby_beat(7), T0 + LEASE)
    assert (watch.epoch, watch.leader) == (0, "")
    assert watch.expired(T0 + LEASE + 0.1), "only a leader's messages renew the lease"


def test_a_participant_ignores_a_standby_heartbeat() -> None:
    m = ParticipantState(
        pipeline=PIPE, sender="task-0", partitions=[P0], chunk_rows=10, chunk_bytes=10_000, heartbeat_interval_s=1.0
    )
    assert m.handle(PReceived(standby_beat(9)), 0.0) == []
    assert m.epoch == 0, "a standby's epoch is not a leader's"
