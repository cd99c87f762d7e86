"""Events fed to the participant state machine, and the actions it returns.

The runner (``participant/runner.py``) turns control messages, polled records, insert outcomes
and the passing of time into events, and carries out the actions in the order given.
Offsets are next-to-read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from protocol.chunking import Chunk, RecordLike
from protocol.messages import ControlMessage, PartitionOffset, TopicPartition

# ---- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """A decoded message from the control topic."""

    message: ControlMessage


@dataclass(frozen=True)
class Polled:
    """Records from the data consumer, of any partitions this task holds, in delivery order."""

    records: Sequence[RecordLike]


@dataclass(frozen=True)
class ReadToEnd:
    """The data consumer read ``topic``/``partition`` to its end at ``offset`` (partition EOF): every
    record below it was delivered before this event, and the offsets after the last one hold none a
    ``read_committed`` consumer sees (transaction markers, records of aborted transactions)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class ChunkStaged:
    """The outcome of a ``StageChunk``: rows stored, records sent to the dead-letter topic.

    ``error`` is non-empty when the chunk could not be staged (a permanent ClickHouse error,
    retries exhausted, a dead letter not delivered): the txn cannot commit.
    """

    txn: str
    topic: str
    partition: int
    chunk_no: int
    rows: int = 0
    dead_letters: int = 0
    error: str = ""


@dataclass(frozen=True)
class PartitionFailed:
    """The data consumer cannot read a partition (e.g. its offset is out of range)."""

    topic: str
    partition: int
    error: str


@dataclass(frozen=True)
class Tick:
    """Time passed; ``log_ends`` are the partitions' high watermarks as last seen (for heartbeats)."""

    log_ends: Mapping[TopicPartition, int] = field(default_factory=dict)


Event = Received | Polled | ReadToEnd | ChunkStaged | PartitionFailed | Tick

# ---- actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Seek:
    """Fetch ``topic``/``partition`` from ``offset`` on; afterwards the partition is not paused."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Pause:
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class Resume:
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, eq=False)
class StageChunk:
    """Insert ``chunk`` into ``stage_table`` (deduplicated by ``chunk.token``); report ``ChunkStaged``."""

    stage_table: str
    chunk: Chunk


@dataclass(frozen=True)
class DropTxn:
    """Stop staging ``txn``: skip its queued chunks; outcomes of chunks in flight are ignored."""

    txn: str


@dataclass(frozen=True)
class Send:
    """Produce ``message`` on the control topic."""

    message: ControlMessage


@dataclass(frozen=True)
class CommitOffsets:
    """Commit these offsets to the consumer group (for lag tools; never read back)."""

    offsets: tuple[PartitionOffset, ...]


Action = Seek | Pause | Resume | StageChunk | DropTxn | Send | CommitOffsets
