"""Events fed to the coordinator state machine, and the actions it returns.

The leader (``coordinator.leader.Leader``) turns Kafka messages, timers and the outcomes of its
own I/O into events, and carries out actions in the order given. Offsets are next-to-read.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from protocol.messages import ControlMessage, EndCommit, TopicPartition, WriteStatus

Offsets = dict[TopicPartition, int]


class Phase(enum.Enum):
    """Where a txn is in the commit steps (``protocol.coordinator.state``), in the order it goes through them."""

    COLLECTING = "collecting"  # commit step 3: START sent, participants staging
    ENDING = "ending"  # commit step 4: END sent, collecting WRITE-STATUS
    COMPLETE = "complete"  # WRITE-STATUS set complete, waiting for the previous txn to commit
    VERIFYING = "verifying"  # commit step 5
    COMMITTING = "committing"  # commit step 6
    PUBLISHING = "publishing"  # commit step 7 (committed)


@dataclass
class Txn:
    """One transaction as the leader sees it."""

    id: str
    stage_table: str
    start: Offsets
    created_at: float
    phase: Phase = Phase.COLLECTING
    started_at: float = 0.0
    ended_at: float = 0.0
    complete_at: float = 0.0
    statuses: dict[TopicPartition, WriteStatus] = field(default_factory=dict)
    after: str | None = None  # the txn this one was pipelined after (it aborts if that one does)
    chained: bool = False  # started by the END of ``after``: starts are CONTINUE until its WRITE-STATUS
    holders: dict[TopicPartition, str] = field(default_factory=dict)  # participant ids at START
    commit_seq: int = 0
    publish_not_before: float = 0.0
    publish_in_flight: bool = False
    buffered: dict[TopicPartition, int] = field(default_factory=dict)  # rows read, as each holder last said
    buffered_rows: int = 0  # their sum: the size trigger's figure
    end_message: EndCommit | None = None  # the END broadcast, as sent again to a holder that missed it
    end_sent_at: float = 0.0  # when it was last broadcast
    idle_at: float = 0.0  # when the leader last kept it open past its interval with nothing to read
    #: The shards with its stage tables (``Spare.shards``); None: every shard (or one server).
    shards: tuple[int, ...] | None = None

    @property
    def complete(self) -> bool:
        """Every partition of START has reported (``statuses`` holds partitions of ``start`` only)."""
        return len(self.statuses) == len(self.start)

    @property
    def end(self) -> Offsets:
        return {tp: ws.end_offset for tp, ws in self.statuses.items()}

    @property
    def rows(self) -> int:
        return sum(ws.rows for ws in self.statuses.values())

    @property
    def missing(self) -> list[TopicPartition]:
        return sorted(tp for tp in self.start if tp not in self.statuses)


# ---- events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """Commit step 1 done: this replica leads ``epoch``; the ledger head and the source partitions are read.

    ``initial`` gives, for partitions never committed, where to start (earliest or latest).
    """

    head_seq: int
    head: Offsets
    initial: Offsets
    paused: bool = False  # the latest PAUSED / RESUMED row of the ledger says paused


@dataclass(frozen=True)
class PartitionsChanged:
    """The source topics now have these partitions; ``initial`` as in ``Ready`` for new ones."""

    partitions: tuple[TopicPartition, ...]
    initial: Offsets


@dataclass(frozen=True)
class Tick:
    """Time passed; the machine checks its timers. Fed only right after the control topic was read:
    participant silence is judged on ``Tick`` alone, so a leader's own stall is never counted as it."""


@dataclass(frozen=True)
class Received:
    message: ControlMessage


@dataclass(frozen=True)
class StageCreated:
    txn: str
    ok: bool = True
    error: str = ""


@dataclass(frozen=True)
class PartitionStats:
    """What the stage table holds of one source partition (from the metadata columns)."""

    rows: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class Counted:
    """Commit step 5 result: ``count()`` of the stage table, or None when it could not be read.

    ``partitions`` is the per-partition view when the target has the metadata columns (else
    None); ``altered`` describes how the target's structure now differs from the stage table's
    ("" when they match); ``log_changed`` why a log the txn read is no longer the ledger's ("" when
    none changed, ``coordinator.offsets.partition_logs``).
    """

    txn: str
    count: int | None
    error: str = ""
    partitions: dict[TopicPartition, PartitionStats] | None = None
    altered: str = ""
    log_changed: str = ""


@dataclass(frozen=True)
class GapFound:
    """Offsets below ``offset`` of ``tp`` are gone (retention) and ``on_gap = skip``: go on from ``offset``."""

    tp: TopicPartition
    offset: int


@dataclass(frozen=True)
class CommitResult:
    """Commit step 6 result: True won the slot, False lost it, None unknown (ClickHouse failed).
    ``commit_seq``: the slot won or lost, past the one asked for when pauses or resumes took that
    one (``protocol.ledger.pauses.moves_nothing``); 0 means the one asked for."""

    txn: str
    won: bool | None
    error: str = ""
    commit_seq: int = 0


@dataclass(frozen=True)
class PublishResult:
    """Commit step 7 result. ``ok`` with ``lost``: the stage table was gone (an alarm, recorded as LOST)."""

    txn: str
    ok: bool
    error: str = ""
    lost: bool = False


@dataclass(frozen=True)
class Shutdown:
    """SIGTERM: finish what is committed, abort what is not, then stop."""


Event = (
    Ready
    | PartitionsChanged
    | Tick
    | Received
    | StageCreated
    | Counted
    | CommitResult
    | PublishResult
    | Shutdown
    | GapFound
)


# ---- actions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateStage:
    """Create the stage table of the next txn ahead of time (answered by ``StageCreated``)."""

    txn: str
    stage_table: str
    shards: tuple[int, ...] | None = None  # on these shards only (``Spare.shards``); None: every shard


@dataclass(frozen=True)
class DropStage:
    """Drop a stage table no txn ever used (a spare that is no longer wanted); no ledger row."""

    txn: str
    stage_table: str
    shards: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Broadcast:
    message: ControlMessage


@dataclass(frozen=True)
class RecordStarted:
    """Append the STARTED ledger row (history only; not part of the commit path)."""

    txn: Txn


@dataclass(frozen=True)
class CountStage:
    txn: str
    stage_table: str
    shards: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Commit:
    """Commit step 6, the commit point: append COMMITTED claiming ``commit_seq`` by compare-and-set."""

    txn: Txn
    commit_seq: int


@dataclass(frozen=True)
class Publish:
    """Commit step 7: move the stage table into the target, drop it, append PUBLISHED. Idempotent."""

    txn: Txn


class AbortKind(str, enum.Enum):
    """Why a txn aborted, in one word for metrics and logs (``AbortTxn.reason`` is for people).

    A ``str`` enum: each kind equals, formats and prints as its value, the label chtxn has always used.
    """

    WRITE_STATUS_TIMEOUT = "write-status-timeout"
    PARTICIPANT_DEAD = "participant-dead"
    PARTICIPANT_ERROR = "participant-error"
    OFFSET_MISMATCH = "offset-mismatch"
    COUNT_FAILED = "count-failed"
    ROW_COUNT_MISMATCH = "row-count-mismatch"
    CASCADE = "cascade"
    SHUTDOWN = "shutdown"
    TARGET_ALTERED = "target-altered"
    STEP_DOWN = "step-down"  # counted by the runner: the machine stops at ``StepDown``
    TAKE_OVER = "take-over"  # an orphan stage table a new leader dropped (``coordinator.takeover``)
    LOG_CHANGED = "log-changed"  # a topic the txn read was re-created (``protocol.offsets.partition_logs``)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


#: Every abort kind's value, in declaration order (metrics create one series per kind up front).
ABORT_KINDS: tuple[str, ...] = tuple(kind.value for kind in AbortKind)


@dataclass(frozen=True)
class AbortTxn:
    """Drop the stage table and append ABORTED (the ABORT broadcast is a separate action).

    ``kind`` says why in one word, for metrics; ``reason`` is for people.
    """

    txn: Txn
    reason: str
    kind: AbortKind


@dataclass(frozen=True)
class StepDown:
    """Another leader exists or the commit outcome is unknown: stop leading, re-elect.

    ``hand_over``: this leader knows of no other and only needs a take-over to read the ledger
    again (an offset reset): it ends its lease at once, as a stopped leader does."""

    reason: str
    hand_over: bool = False


@dataclass(frozen=True)
class Stopped:
    """Nothing is in flight after a Shutdown: the runner may exit."""


Action = (
    CreateStage | DropStage | Broadcast | RecordStarted | CountStage | Commit | Publish | AbortTxn | StepDown | Stopped
)
