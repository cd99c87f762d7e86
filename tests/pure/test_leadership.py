"""``LeaseWatch``: when a standby may claim the next epoch (``protocol/coordinator/leadership.py``).

A lease expires after ``lease_s`` of silence from every coordinator; only coordinator messages of
the highest epoch seen keep it alive; losing an epoch claim gives the winner a fresh lease.
"""

from __future__ import annotations

import pytest

from protocol.coordinator.leadership import COORDINATOR_KINDS, LeaseWatch
from protocol.messages import (
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    LeaderHeartbeat,
    PartitionPosition,
    StartCommit,
    WriteStatus,
)

LEASE = 5.0
T0 = 1000.0


def env(epoch: int, sender: str = "coord-a") -> dict:
    return {"pipeline": "orders", "epoch": epoch, "txn": f"e{epoch}_t1", "sender": sender}


def coordinator_messages(epoch: int, sender: str = "coord-a") -> list:
    e = env(epoch, sender)
    return [
        StartCommit(**e, stage_table="t", offsets=()),
        EndCommit(**e),
        AckCommit(**e, offsets=()),
        Abort(**e, reason="x"),
        LeaderHeartbeat(**e),
    ]


def participant_messages(epoch: int) -> list:
    e = env(epoch, "part-0")
    position = PartitionPosition(topic="events", partition=0, position=5, log_end=9)
    return [
        Heartbeat(**e, partitions=(position,)),
        WriteStatus(**e, topic="events", partition=0, start_offset=0, end_offset=5, rows=5, chunks=1),
    ]


def test_the_coordinator_kinds_are_exactly_the_messages_a_coordinator_sends() -> None:
    assert {type(m).__struct_config__.tag for m in coordinator_messages(1)} == COORDINATOR_KINDS


def test_a_fresh_watch_gives_an_existing_leader_one_lease_to_show_itself() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    assert (watch.epoch, watch.leader) == (0, "")
    assert not watch.expired(T0 + LEASE)
    assert watch.expired(T0 + LEASE + 0.001)


@pytest.mark.parametrize("message", coordinator_messages(4), ids=lambda m: type(m).__name__)
def test_every_coordinator_message_renews_the_lease(message) -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(message, T0 + 4)
    assert (watch.epoch, watch.leader) == (4, "coord-a")
    assert not watch.expired(T0 + 4 + LEASE)
    assert watch.expired(T0 + 4 + LEASE + 0.001)


@pytest.mark.parametrize("message", participant_messages(9), ids=lambda m: type(m).__name__)
def test_participant_messages_do_not_renew_the_lease(message) -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(message, T0 + 4)
    assert (watch.epoch, watch.leader) == (0, "")
    assert watch.expired(T0 + LEASE + 1)


def test_a_deposed_leader_of_a_lower_epoch_does_not_keep_the_lease_alive() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(LeaderHeartbeat(**env(5, "coord-b")), T0 + 1)
    for now in (T0 + 2, T0 + 4, T0 + 6):
        watch.observe(LeaderHeartbeat(**env(4, "coord-a")), now)
    assert (watch.epoch, watch.leader) == (5, "coord-b")
    assert watch.expired(T0 + 1 + LEASE + 0.001)


def test_a_newer_leader_takes_over_the_lease() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(LeaderHeartbeat(**env(4, "coord-a")), T0 + 1)
    watch.observe(StartCommit(**env(5, "coord-b"), stage_table="t", offsets=()), T0 + 3)
    assert (watch.epoch, watch.leader) == (5, "coord-b")
    watch.observe(LeaderHeartbeat(**env(5, "coord-b")), T0 + 7)
    assert not watch.expired(T0 + 7 + LEASE)


def test_a_lost_claim_gives_the_winner_a_fresh_lease_and_raises_the_epoch() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(LeaderHeartbeat(**env(4)), T0)
    assert watch.expired(T0 + 6)  # silence: this standby claims epoch 5 and loses it
    watch.claim_lost(T0 + 6, winner_epoch=5)
    assert watch.epoch == 5
    assert not watch.expired(T0 + 6 + LEASE)
    assert watch.expired(T0 + 6 + LEASE + 0.001)
    watch.observe(LeaderHeartbeat(**env(4)), T0 + 8)  # the old leader is not the winner
    assert watch.expired(T0 + 6 + LEASE + 0.001)


def test_a_lost_claim_never_lowers_the_epoch_seen() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(LeaderHeartbeat(**env(7)), T0)
    watch.claim_lost(T0 + 6, winner_epoch=6)
    assert watch.epoch == 7


@pytest.mark.parametrize("message", coordinator_messages(3, "c1"), ids=lambda m: type(m).__struct_config__.tag)
def test_a_replica_that_led_an_epoch_does_not_hear_its_own_messages_of_it_as_a_leader(message) -> None:
    """A leader that steps down stops reading the control topic for a while; what it sent meanwhile
    (its lease's heartbeats, an ABORT) reaches its standby loop afterwards. That is no leader heard:
    the replica stays free to claim after one lease, and keeps saying why it stepped down."""
    watch = LeaseWatch(lease_s=LEASE, now=T0, own=("c1", 3))
    watch.observe(message, T0 + 1)
    assert (watch.epoch, watch.leader) == (0, "")
    assert watch.expired(T0 + LEASE + 0.001)


def test_a_second_copy_of_a_replica_that_leads_a_newer_epoch_is_heard() -> None:
    """Only the epoch this replica led, and older ones, are its own past: a process with the same id
    that leads a newer epoch (a second copy alive) is a leader like any other."""
    watch = LeaseWatch(lease_s=LEASE, now=T0, own=("c1", 3))
    watch.observe(LeaderHeartbeat(**env(4, "c1")), T0 + 1)
    watch.observe(LeaderHeartbeat(**env(2, "c2")), T0 + 1)
    assert (watch.epoch, watch.leader) == (4, "c1")
    assert not watch.expired(T0 + LEASE + 0.5)
