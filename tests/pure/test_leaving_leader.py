"""A leader stopped with SIGTERM hands its lease over at once (``protocol/coordinator/leadership.py``).

Once its shutdown is done, the leaving leader sends ``LeaderHeartbeat(leaving=True)``: a standby
that reads it may claim the next epoch at once instead of waiting for ``lease_s`` of silence. Only
the leader of the highest epoch seen can hand over; a lost claim gives the winner a full lease.
"""

from __future__ import annotations

from protocol.coordinator.leadership import LeaseWatch
from protocol.messages import Heartbeat, LeaderHeartbeat, PartitionPosition, StartCommit

LEASE = 5.0
T0 = 1000.0


def beat(epoch: int, sender: str = "coord-a", *, leaving: bool = False) -> LeaderHeartbeat:
    return LeaderHeartbeat(pipeline="orders", epoch=epoch, txn="", sender=sender, leaving=leaving)


def test_a_leaving_leader_ends_its_lease_at_once() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4), T0 + 1)
    assert not watch.expired(T0 + 2)
    watch.observe(beat(4, leaving=True), T0 + 2)
    assert (watch.epoch, watch.leader) == (4, "coord-a")
    assert watch.expired(T0 + 2)


def test_a_fresh_standby_that_hears_the_leader_leave_need_not_wait_a_lease() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4, leaving=True), T0 + 0.1)
    assert watch.expired(T0 + 0.1)


def test_a_deposed_leader_leaving_hands_over_nothing() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(5, "coord-b"), T0 + 1)
    watch.observe(beat(4, "coord-a", leaving=True), T0 + 2)
    assert (watch.epoch, watch.leader) == (5, "coord-b")
    assert not watch.expired(T0 + 2)
    assert watch.expired(T0 + 1 + LEASE + 0.001)


def test_a_participant_heartbeat_that_leaves_is_no_hand_over() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4), T0 + 1)
    position = PartitionPosition(topic="events", partition=0, position=5, log_end=9)
    watch.observe(
        Heartbeat(pipeline="orders", epoch=4, txn="", sender="part-0", partitions=(position,), leaving=True), T0 + 2
    )
    assert not watch.expired(T0 + 2)


def test_a_lost_claim_after_a_hand_over_gives_the_winner_a_full_lease() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4, leaving=True), T0 + 1)
    assert watch.expired(T0 + 1)  # this standby claims epoch 5 and another one wins it
    watch.claim_lost(T0 + 1.2, winner_epoch=5)
    assert not watch.expired(T0 + 1.2 + LEASE)
    assert watch.expired(T0 + 1.2 + LEASE + 0.001)


def test_the_next_leader_holds_its_lease_however_the_last_one_left() -> None:
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4, leaving=True), T0 + 1)
    watch.observe(
        StartCommit(pipeline="orders", epoch=5, txn="e5_t1", sender="coord-b", stage_table="t", offsets=()), T0 + 2
    )
    assert (watch.epoch, watch.leader) == (5, "coord-b")
    assert not watch.expired(T0 + 2 + LEASE)


def test_a_message_of_the_leaving_leader_after_its_leave_does_not_take_it_back() -> None:
    """An ABORT of the stopped leader read after its leaving heartbeat (another producer's message):
    its epoch is over all the same."""
    watch = LeaseWatch(lease_s=LEASE, now=T0)
    watch.observe(beat(4, leaving=True), T0 + 1)
    watch.observe(beat(4), T0 + 1.1)
    assert watch.expired(T0 + 1.1)
