"""A driver for ``CoordinatorState`` tests: builds events and the exact actions expected back.

The machine has no clock of its own; ``Driver.at(now, *events)`` feeds events at ``now`` in
order and returns every action they produced, so a test reads as a timeline. After each event
the machine's invariants are checked (``protocol.coordinator.invariants.check``, by ``tests/pure/conftest.py``
for every pure test).
"""

from __future__ import annotations

from protocol import naming
from protocol.coordinator.chunk_sizing import MIN_CHUNK_ROWS
from protocol.coordinator.events import (
    AbortKind,
    AbortTxn,
    Action,
    Broadcast,
    CreateStage,
    DropStage,
    Event,
    Offsets,
    Ready,
    Received,
    RecordStarted,
    StageCreated,
    Txn,
)
from protocol.coordinator.flight import Timing
from protocol.coordinator.state import CoordinatorState
from protocol.messages import (
    CONTINUE,
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    PartitionHolder,
    PartitionOffset,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    WriteStatus,
)

PIPE = "orders"
EPOCH = 3
ME = "coord-a"
TARGET = "shop.orders"
P0 = TopicPartition(topic="events", partition=0)
P1 = TopicPartition(topic="events", partition=1)
P2 = TopicPartition(topic="events", partition=2)

#: P0 was last committed at 40 (commit 7); P1 was never committed and starts at its earliest, 0.
HEAD_SEQ = 7
HEAD: Offsets = {P0: 40}
INITIAL: Offsets = {P1: 0}
START_1: Offsets = {P0: 40, P1: 0}

TIMING = Timing(
    interval_s=1.0,
    size_trigger_rows=100,
    write_status_timeout_s=10.0,
    heartbeat_timeout_s=3.0,
    publish_retry_s=2.0,
)
T0 = 100.0
#: The chunk_rows of a START once a txn has completed: the driver's txns carry a few rows.
LEARNT = MIN_CHUNK_ROWS


def txn_id(n: int) -> str:
    return naming.txn_id(EPOCH, n)


def _coordinator(txn: str, epoch: int = EPOCH, sender: str = ME) -> dict:
    return {"pipeline": PIPE, "epoch": epoch, "txn": txn, "sender": sender}


def _offsets(offsets: Offsets) -> tuple[PartitionOffset, ...]:
    return tuple(PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in sorted(offsets.items()))


def participant(tp: TopicPartition) -> str:
    return f"part-{tp.partition}"


# ---- events ---------------------------------------------------------------------------


def hb(
    tp: TopicPartition,
    *,
    sender: str | None = None,
    txn: str = "",
    buffered: int = 0,
    pipeline: str = PIPE,
    continues: bool = False,
) -> Received:
    """A heartbeat of ``tp``'s participant; ``continues`` as sent by participants that understand
    ``EndCommit.next`` (the default, False, is an older participant)."""
    position = PartitionPosition(topic=tp.topic, partition=tp.partition, position=0, log_end=-1, buffered_rows=buffered)
    return Received(
        Heartbeat(
            pipeline=pipeline,
            epoch=EPOCH,
            txn=txn,
            sender=sender or participant(tp),
            partitions=(position,),
            continues=continues,
        )
    )


def beats(*tps: TopicPartition, txn: str = "", continues: bool = False) -> list[Received]:
    return [hb(tp, txn=txn, continues=continues) for tp in tps]


def ws(
    txn: str,
    tp: TopicPartition,
    start: int,
    end: int,
    rows: int,
    *,
    epoch: int = EPOCH,
    errors: tuple[str, ...] = (),
    sender: str | None = None,
) -> Received:
    return Received(
        WriteStatus(
            pipeline=PIPE,
            epoch=epoch,
            txn=txn,
            sender=sender or participant(tp),
            topic=tp.topic,
            partition=tp.partition,
            start_offset=start,
            end_offset=end,
            rows=rows,
            chunks=1 if rows else 0,
            errors=errors,
        )
    )


# ---- expected actions -----------------------------------------------------------------


def create(n: int) -> CreateStage:
    return CreateStage(txn_id(n), naming.stage_table(TARGET, PIPE, txn_id(n)))


def drop(n: int) -> DropStage:
    return DropStage(txn_id(n), naming.stage_table(TARGET, PIPE, txn_id(n)))


def start_message(
    n: int, offsets: Offsets, holders: dict[TopicPartition, str] | None = None, *, chunk_rows: int = 0
) -> StartCommit:
    """START of txn ``n``; each partition held by ``participant(tp)`` unless ``holders`` says otherwise.
    ``chunk_rows``: 0 before any txn completed, then ``LEARNT`` (the driver's txns carry a few rows)."""
    table = naming.stage_table(TARGET, PIPE, txn_id(n))
    named = {tp: participant(tp) for tp in offsets} | (holders or {})
    held = tuple(PartitionHolder(topic=tp.topic, partition=tp.partition, sender=s) for tp, s in sorted(named.items()))
    return StartCommit(
        **_coordinator(txn_id(n)), stage_table=table, offsets=_offsets(offsets), holders=held, chunk_rows=chunk_rows
    )


def start(
    n: int, offsets: Offsets, holders: dict[TopicPartition, str] | None = None, *, chunk_rows: int = 0
) -> Broadcast:
    return Broadcast(start_message(n, offsets, holders, chunk_rows=chunk_rows))


def end(n: int) -> Broadcast:
    return Broadcast(EndCommit(**_coordinator(txn_id(n))))


def chained_end(
    n: int, offsets: Offsets, holders: dict[TopicPartition, str] | None = None, *, chunk_rows: int = 0
) -> Broadcast:
    """END of txn ``n`` carrying the START of txn ``n + 1`` from ``offsets`` (``CONTINUE`` or explicit)."""
    return Broadcast(
        EndCommit(**_coordinator(txn_id(n)), next=start_message(n + 1, offsets, holders, chunk_rows=chunk_rows))
    )


def continuing(*tps: TopicPartition) -> Offsets:
    """Offsets of a chained START: every partition goes on from where the END cut it."""
    return {tp: CONTINUE for tp in tps}


def ack(n: int, offsets: Offsets, commit_seq: int) -> Broadcast:
    return Broadcast(AckCommit(**_coordinator(txn_id(n)), offsets=_offsets(offsets), commit_seq=commit_seq))


def abort(txn: Txn, reason: str, kind: str) -> list[Action]:
    """ABORT of a started txn: the broadcast, then the stage table dropped and ABORTED appended
    (every txn is started: none exists before its stage table). ``kind``: an ``AbortKind`` value."""
    return [Broadcast(Abort(**_coordinator(txn.id), reason=reason)), AbortTxn(txn, reason, AbortKind(kind))]


# ---- the driver -----------------------------------------------------------------------


class Driver:
    """One leader of epoch ``EPOCH`` and the time line of what it was fed."""

    def __init__(self, timing: Timing = TIMING) -> None:
        self.state = CoordinatorState(pipeline=PIPE, epoch=EPOCH, coordinator=ME, target=TARGET, timing=timing)

    def at(self, now: float, *events: Event) -> list[Action]:
        actions: list[Action] = []
        for event in events:
            actions += self.state.handle(event, now)
        return actions

    def txn(self, n: int) -> Txn:
        found = self.state.txn(txn_id(n))
        assert found is not None, f"{txn_id(n)} is not in flight; in flight: {[t.id for t in self.state.txns]}"
        return found

    def started(self, now: float = T0, *, continues: bool = False) -> Txn:
        """Ready, both partitions held, stage table created: txn 1 is collecting from ``START_1``,
        and the spare stage table of txn 2 is being created (not ready yet)."""
        assert self.at(now, Ready(HEAD_SEQ, HEAD, INITIAL), *beats(P0, P1, continues=continues)) == [create(1)]
        assert self.state.txns == []  # no txn before its stage table exists
        actions = self.at(now, StageCreated(txn_id(1)))
        txn = self.txn(1)
        assert actions == [start(1, START_1), RecordStarted(txn), create(2)]
        return txn

    def spare_ready(self, n: int, now: float) -> None:
        """The spare stage table of txn ``n`` is created; nothing is due yet."""
        assert self.at(now, StageCreated(txn_id(n))) == []
        assert self.state.spare is not None and (self.state.spare.txn, self.state.spare.ready) == (txn_id(n), True)

    def ended(self, n: int, now: float) -> None:
        """Heartbeats from both partitions and the END of txn ``n`` at ``now`` (going alone)."""
        assert self.at(now, *beats(P0, P1)) == [end(n)]
