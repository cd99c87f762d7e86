"""What a participant task keeps of each partition it holds, and of each txn that partition is in. Pure.

A ``Partition`` has at most one open ``Stint`` (the txn it reads into, STAGING or FAILED) and the
ended ones (ENDING) still waiting for chunks in flight, oldest first. ``Status`` is a stint's place
in participant steps 2 and 3 (``protocol.participant.state``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol import size_trigger
from protocol.chunking import ChunkBuilder
from protocol.messages import TopicPartition
from protocol.participant.events import Action, StageChunk


class Status(enum.Enum):
    STAGING = "staging"  # consuming into the txn
    HELD = (
        "held"  # its table has no stage table in the txn (``[[route]]``): reads nothing into it, ends where it started
    )
    FAILED = "failed"  # a chunk failed: paused, waiting for END to report the error
    ENDING = "ending"  # END seen, waiting for in-flight chunks before WRITE-STATUS


@dataclass
class Stint:
    """One partition's part in one txn."""

    txn: str
    epoch: int
    stage_table: str
    start_offset: int
    builder: ChunkBuilder
    share: int  # rows of ``size_trigger_rows`` this partition stands for (0: no trigger)
    status: Status = Status.STAGING
    pending: set[int] = field(default_factory=set)  # chunk numbers in flight
    rows: int = 0
    dead_letters: int = 0
    errors: list[str] = field(default_factory=list)
    reported_share: int = 0  # how many shares read were already reported at once
    reported_full: bool = False  # reaching ``full_rows`` was reported at once

    @property
    def full(self) -> bool:
        """Read its fill (``size_trigger.full_rows`` of its share): reading waits for END."""
        return bool(self.share) and self.builder.rows_read >= size_trigger.full_rows(self.share)

    def flush(self) -> list[Action]:
        """END: cut the open chunk at the current position and stage it."""
        chunk = self.builder.flush()
        if chunk is None:
            return []
        self.pending.add(chunk.chunk_no)
        return [StageChunk(self.stage_table, chunk)]


@dataclass
class Partition:
    """One partition this task holds; ``position`` is the consumer's next offset (-1: unknown)."""

    tp: TopicPartition
    position: int = -1
    fetching: bool = False  # assigned and not paused
    open: Stint | None = None  # the txn being read (STAGING or FAILED)
    ending: list[Stint] = field(default_factory=list)  # ended txns awaiting chunks, oldest first

    @property
    def buffered_rows(self) -> int:
        return self.open.builder.rows_read if self.open else 0

    def stint(self, txn: str) -> Stint | None:
        if self.open is not None and self.open.txn == txn:
            return self.open
        return next((s for s in self.ending if s.txn == txn), None)
