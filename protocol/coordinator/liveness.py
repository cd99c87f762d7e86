"""Who is alive, per partition, as the leader hears it. Pure; owned by ``CoordinatorState``.

Every participant copy heartbeats the partitions it holds: its position, the log end it sees,
the rows it read for its txn, and whether it understands a START chained to an END. From these
the leader picks the holder START names for each partition (fencing), judges a holder silent
(commit step 4's abort), spots a holder that never read its END, and tells the lag.

A copy whose job was stopped heartbeats ``leaving`` until it has sent what it owes and stops: it
is not live, is never named holder again, and the txns it holds end at once (``leaving``).

A copy is judged only against the other copies of its partition, or against the clock on
``Tick`` (right after the control topic was read), so a leader's own stall never counts as a
participant's silence. Copies silent for ten heartbeat timeouts are forgotten.

The figures each copy (``sender``) reports of itself (rows read, chunks staged, inserts, retries)
are kept per sender, the latest only, and forgotten with it: the leader exports them
(``coordinator.metrics``), one series per copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from protocol.coordinator.events import Txn
from protocol.messages import Heartbeat, ParticipantFigures, TopicPartition

#: An END's holder that still names its txn in heartbeats this long after it gets the END again.
RESEND_END_S = 1.0


@dataclass
class Copy:
    """One participant copy of one partition, as its latest heartbeat told."""

    sender: str
    seen_at: float
    txn: str = ""
    buffered_rows: int = 0
    log_end: int = -1  # the partition's end as the participant last saw it (-1: unknown)
    continues: bool = False  # understands a START chained to an END
    position: int = -1  # next offset the participant reads (-1: unknown)
    leaving: bool = False  # its job was stopped: it finishes what it holds, then stops


class Liveness:
    """The heartbeats of every participant copy, per partition, and the holders of the latest START."""

    def __init__(self, heartbeat_timeout_s: float) -> None:
        self.timeout_s = heartbeat_timeout_s
        self.copies: dict[TopicPartition, dict[str, Copy]] = {}  # per partition, per participant copy
        self.holders: dict[TopicPartition, str] = {}  # who staged each partition in the latest START
        self._figures: dict[str, tuple[float, ParticipantFigures]] = {}  # per sender: (heard at, its figures)

    def heard(self, msg: Heartbeat, now: float) -> None:
        """Record ``msg``'s copy of each partition it names, and its figures; forget copies silent for
        ten timeouts."""
        forget = now - 10 * self.timeout_s
        if msg.figures is not None:  # older participants send none
            self._figures[msg.sender] = (now, msg.figures)
            for sender in [s for s, (at, _) in self._figures.items() if at < forget]:
                del self._figures[sender]
        for pos in msg.partitions:
            copies = self.copies.setdefault(pos.tp, {})
            copies[msg.sender] = Copy(
                msg.sender, now, msg.txn, pos.buffered_rows, pos.log_end, msg.continues, pos.position, msg.leaving
            )
            for sender in [s for s, c in copies.items() if c.seen_at < forget]:
                del copies[sender]

    def copy(self, tp: TopicPartition, sender: str) -> Copy | None:
        return self.copies.get(tp, {}).get(sender)

    def figures(self, now: float) -> dict[str, ParticipantFigures]:
        """The latest figures of each participant copy heard within ten heartbeat timeouts, by sender.
        Safe to call from another thread (the metrics server's) while heartbeats are recorded."""
        latest = self._figures.copy()  # one call: atomic under the GIL, unlike iterating the dict
        forget = now - 10 * self.timeout_s
        return {sender: figures for sender, (at, figures) in latest.items() if at >= forget}

    def live_partitions(self, now: float) -> set[TopicPartition]:
        """Partitions some copy that is not leaving heartbeated within the heartbeat timeout."""
        return {
            tp
            for tp, copies in self.copies.items()
            if any(now - c.seen_at <= self.timeout_s and not c.leaving for c in copies.values())
        }

    def holder(self, tp: TopicPartition) -> str:
        """The copy to stage ``tp``: the previous holder while it heartbeats as recently as the
        freshest copy (within the heartbeat timeout), else the freshest copy. Judged between the
        copies only, never against the clock, so a leader's own stall never leaves a partition
        without a holder. A leaving copy is never chosen ("" when only leaving copies are left)."""
        copies = {s: c for s, c in self.copies.get(tp, {}).items() if not c.leaving}
        if not copies:
            return ""
        freshest = max(copies.values(), key=lambda c: c.seen_at)
        previous = copies.get(self.holders.get(tp, ""))
        if previous is not None and freshest.seen_at - previous.seen_at <= self.timeout_s:
            return previous.sender
        return freshest.sender

    def hold(self, holders: dict[TopicPartition, str]) -> None:
        """A START named these holders: they are preferred for the next one."""
        self.holders.update(holders)

    def silent(self, txn: Txn, now: float) -> list[TopicPartition]:
        """Partitions of ``txn`` still owing a WRITE-STATUS whose holder is silent. Other copies of a
        participant, alive or not, do not count: only the holder named in START stages the partition.
        Judge only on ``Tick``."""
        return sorted(
            tp
            for tp in txn.start
            if tp not in txn.statuses
            and ((c := self.copy(tp, txn.holders.get(tp, ""))) is None or now - c.seen_at > self.timeout_s)
        )

    def leaving(self, txn: Txn) -> list[TopicPartition]:
        """Partitions of ``txn`` still owing a WRITE-STATUS whose holder heartbeats ``leaving``: ``txn``
        should end now (its holder stops once it has sent what it owes)."""
        return sorted(
            tp
            for tp in txn.start
            if tp not in txn.statuses and (c := self.copy(tp, txn.holders.get(tp, ""))) is not None and c.leaving
        )

    def missed_end(self, txn: Txn) -> str:
        """A partition whose holder heartbeated, ``RESEND_END_S`` after the END was last sent, that
        it still reads ``txn``: it never read the END (a holder that read an END carrying the next
        START names the next txn at once). "" when there is none, or the END carried no START."""
        if txn.end_message is None or txn.end_message.next is None:
            return ""
        for tp in txn.missing:
            copy = self.copy(tp, txn.holders.get(tp, ""))
            if (
                copy is not None
                and copy.continues
                and copy.txn == txn.id
                and copy.seen_at - txn.end_sent_at >= RESEND_END_S
            ):
                return f"the holder of {tp.topic}-{tp.partition} ({copy.sender})"
        return ""

    def chained_holders(self, partitions: Iterable[TopicPartition], ending: Txn) -> dict[TopicPartition, str] | None:
        """The holders of a START carried by ``ending``'s END, or None when END must go alone: some
        holder would not see a START inside an END, or a partition changes holder (a new holder
        cannot continue what another one cut)."""
        holders = {tp: self.holder(tp) for tp in partitions}
        for tp, sender in holders.items():
            live = self.copy(tp, sender)
            if live is None or not live.continues:
                return None
            if tp in ending.start and sender != ending.holders.get(tp):
                return None
        return holders

    def behind(self, txn: Txn) -> dict[TopicPartition, int]:
        """Per partition of ``txn``: how far its holder reads behind the log end (where both are known)."""
        return {
            tp: c.log_end - c.position
            for tp, copies in self.copies.items()
            if tp in txn.start
            for c in copies.values()
            if c.sender == txn.holders.get(tp) and c.log_end >= 0 and c.position >= 0
        }

    def waiting(
        self, partitions: Iterable[TopicPartition], base: Callable[[TopicPartition], int]
    ) -> set[TopicPartition]:
        """Those of ``partitions`` that may have records past ``base`` (their committed offset): as its
        freshest copy tells, the holder read past it or sees the log end past it, or the log end is
        not known (no heartbeat yet, or none told it). The position counts as well as the log end: a
        holder's log end is the watermark its consumer cached, which can trail the records it read."""
        found = set()
        for tp in partitions:
            copies = self.copies.get(tp)
            live = max(copies.values(), key=lambda c: c.seen_at) if copies else None
            if live is None or live.log_end < 0 or max(live.log_end, live.position) > base(tp):
                found.add(tp)
        return found

    def lag(
        self, partitions: Iterable[TopicPartition], base: Callable[[TopicPartition], int]
    ) -> dict[TopicPartition, int]:
        """Per partition of ``partitions``: the log end its freshest copy sees minus ``base``."""
        wanted = set(partitions)
        lags = {}
        for tp, copies in self.copies.items():
            live = max(copies.values(), key=lambda c: c.seen_at)
            if live.log_end >= 0 and tp in wanted:
                lags[tp] = max(0, live.log_end - base(tp))
        return lags
