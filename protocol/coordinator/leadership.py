"""Leadership by lease on the control topic, in the spirit of KLIP-12 heartbeats. No I/O.

The leader sends a ``LeaderHeartbeat`` every ``lease_s / 3`` (and every START/END/ACK/ABORT
counts too). A standby that has seen nothing from a leader for ``lease_s`` claims epoch
``max + 1`` in the ledger by compare-and-set; of several standbys racing, exactly one wins and
the others keep watching. A leader stopped cleanly (SIGTERM) sends a last ``LeaderHeartbeat``
with ``leaving`` once its shutdown is done: its lease ends then, and a standby claims at once.
Safety never rests on the lease: a stale leader is fenced by the commit-slot compare-and-set and
by participants ignoring lower epochs.
"""

from __future__ import annotations

from protocol.messages import ControlMessage, LeaderHeartbeat

COORDINATOR_KINDS = frozenset({"start-commit", "end-commit", "ack-commit", "abort", "leader-heartbeat"})


class LeaseWatch:
    """What a standby knows of the current leader. ``own`` is (this replica's id, the epoch it led
    last): its own messages of that epoch or an older one, read after it stepped down, are its past,
    not a leader heard."""

    def __init__(self, *, lease_s: float, now: float, own: tuple[str, int] = ("", 0)) -> None:
        self.lease_s = lease_s
        self.own = own
        self.epoch = 0  # highest epoch seen from any coordinator
        self.leader = ""
        self.last_seen = now  # a fresh replica gives an existing leader one lease to show itself
        self.handed_over = False  # the leader of ``epoch`` said it leaves: its lease is over

    def observe(self, message: ControlMessage, now: float) -> None:
        if type(message).__struct_config__.tag not in COORDINATOR_KINDS:
            return
        if message.sender == self.own[0] and message.epoch <= self.own[1]:
            return
        if message.epoch >= self.epoch:
            if message.epoch > self.epoch:
                self.handed_over = False  # a newer leader: whatever an older one said is moot
            self.epoch = message.epoch
            self.leader = message.sender
            self.last_seen = now
            if isinstance(message, LeaderHeartbeat) and message.leaving:
                self.handed_over = True  # for good: a later message of that epoch does not take it back

    def expired(self, now: float) -> bool:
        return self.handed_over or now - self.last_seen > self.lease_s

    def claim_lost(self, now: float, winner_epoch: int) -> None:
        """Another replica won the epoch: give it a full lease to show itself."""
        self.epoch = max(self.epoch, winner_epoch)
        self.last_seen = now
        self.handed_over = False
