"""Control-topic messages: one msgspec tagged union behind a versioned envelope.

Wire format: a msgpack map holding the envelope fields (``kind``, ``version``, ``pipeline``,
``epoch``, ``txn``, ``sender``) and the fields of the message kind named by ``kind``. The
record key is the pipeline name.

Evolution rules (checked by the golden-bytes tests in ``tests/pure/test_codec.py``):

1. A tag (``kind``) is never renamed and never reused; a renamed class keeps its tag.
2. Fields are only appended, and every new field has a default, so an old reader ignores it
   and a new reader decodes an old message.
3. Structs are maps, never ``array_like``; wire types never ``forbid_unknown_fields``.
4. ``version`` is raised only for a change an old reader must not half-understand; a reader
   skips (with a warning) messages of a newer version and kinds it does not know.

Offsets everywhere are Kafka's "next offset to read".
"""

from __future__ import annotations

from typing import get_args

import msgspec

from protocol import shards as shard_rules

#: The newest message version this code writes and understands.
PROTOCOL_VERSION = 1

#: A START offset meaning "from where this partition was cut at the END that carries this START"
#: (a chained txn, ``EndCommit.next``): the coordinator learns the value from that END's WRITE-STATUS.
CONTINUE = -1


class TopicPartition(msgspec.Struct, frozen=True, kw_only=True, order=True):
    topic: str
    partition: int


class PartitionOffset(msgspec.Struct, frozen=True, kw_only=True):
    """A (topic, partition) and a next-offset-to-read."""

    topic: str
    partition: int
    offset: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


class PartitionPosition(msgspec.Struct, frozen=True, kw_only=True):
    """What a heartbeat says of one partition a participant holds."""

    topic: str
    partition: int
    position: int  # next offset the participant will read
    log_end: int  # the partition's high watermark as last seen, -1 if unknown
    buffered_rows: int = 0  # rows read for the current txn (staged or in the open chunk)

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


# The kinds below repeat ``frozen=True``: msgspec would inherit it, type checkers do not.
class _Control(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every control message carries."""

    version: int = PROTOCOL_VERSION
    pipeline: str
    epoch: int  # coordinator generation; claimed by compare-and-set in the ledger
    txn: str  # transaction id ("" where none applies, e.g. a heartbeat between txns)
    sender: str  # coordinator id or participant id


class PartitionHolder(msgspec.Struct, frozen=True, kw_only=True):
    """The one participant (``sender`` id) that stages ``topic``/``partition`` in a txn."""

    topic: str
    partition: int
    sender: str


class TopicStage(msgspec.Struct, frozen=True, kw_only=True):
    """Where one topic's records are staged in a txn across several tables (``[[route]]``); "" when
    its table has no stage table in this txn (no records were waiting): its partitions stage nothing
    and report ending where they started."""

    topic: str
    stage_table: str


class StartCommit(_Control, frozen=True, tag="start-commit"):
    """Coordinator -> all: stage records from these offsets into ``stage_table``.

    ``holders`` fences participants: when it names a partition, only that sender stages it in
    this txn; any other live copy of the participant stands down (empty: no fencing, old leaders).

    ``stage_tables`` names each topic's stage table when the pipeline routes its topics to several
    tables (``[[route]]``); ``stage_table`` then lists the txn's stage tables, comma-separated
    (``naming.txn_stages``), which is no table a participant could insert into.

    ``chunk_rows`` caps this txn's chunks below the participant's own ``chunk_rows`` (0: no cap;
    older leaders never set it). It is fixed for the whole txn, so chunks still depend only on
    the records from the START offset.

    ``shards`` (0-based, of ``shard_count``) are the only shards with this txn's stage tables when
    partitions are placed on shards (``clickhouse.placement = "partition"``) and the leader made
    them only where records wait (``protocol.coordinator.flight``); empty: every shard has them.
    A partition placed on another shard (``protocol.shards.shard_of`` over ``shard_count``) is
    held: it stages nothing in this txn.
    """

    stage_table: str
    offsets: tuple[PartitionOffset, ...]
    holders: tuple[PartitionHolder, ...] = ()
    chunk_rows: int = 0
    stage_tables: tuple[TopicStage, ...] = ()
    shards: tuple[int, ...] = ()
    shard_count: int = 0

    def stage_table_for(self, tp: TopicPartition) -> str:
        """Where ``tp``'s records go in this txn (``stage_table_of`` its topic), "" when its shard has
        no stage table in this txn (``shards``)."""
        if self.shards and shard_rules.shard_of(tp.topic, tp.partition, self.shard_count) not in self.shards:
            return ""
        return self.stage_table_of(tp.topic)

    def stage_table_of(self, topic: str) -> str:
        """Where ``topic``'s records go in this txn: its table's stage table when the txn spans several
        tables (``stage_tables``), else ``stage_table`` (the one-table form, and leaders older than
        routes). In a txn across several tables, a topic ``stage_tables`` does not name has no stage
        table (""): its partitions are held, never staged into another table's stage table."""
        if not self.stage_tables:
            return self.stage_table
        return next((s.stage_table for s in self.stage_tables if s.topic == topic), "")


class EndCommit(_Control, frozen=True, tag="end-commit"):
    """Coordinator -> all: cut at the current position, flush, report WRITE-STATUS for this txn.

    ``next`` chains the following txn: each participant goes straight on reading into it from
    where it cut this one (its offsets are ``CONTINUE``, or explicit for partitions new to it).
    Sent only to participants that heartbeat ``continues``; without ``next`` they stop reading
    until the next START.
    """

    next: StartCommit | None = None


class WriteStatus(_Control, frozen=True, tag="write-status"):
    """Participant -> coordinator: what one partition staged for ``txn``."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int
    rows: int  # rows staged into the stage table (dead letters excluded)
    chunks: int
    dead_letters: int = 0
    bytes: int = 0
    errors: tuple[str, ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)


class AckCommit(_Control, frozen=True, tag="ack-commit"):
    """Coordinator -> all: ``txn`` is committed; its end offsets may go to the consumer group."""

    offsets: tuple[PartitionOffset, ...]
    commit_seq: int = 0


class Abort(_Control, frozen=True, tag="abort"):
    """Coordinator -> all: drop ``txn`` at once."""

    reason: str


class ParticipantFigures(msgspec.Struct, frozen=True, kw_only=True):
    """What one participant copy did since it started, cumulative (they only grow, but start again
    from 0 when the copy restarts): the leader exports them as counters (``coordinator.metrics``)."""

    rows_read: int = 0  # records polled from its source partitions (a record read again counts again)
    chunks_staged: int = 0  # chunks inserted into stage tables without an error
    inserts: int = 0  # deduplicated inserts of a chunk, or of a part of one while bad records are isolated
    insert_seconds: float = 0.0  # the time those inserts took, retries and their back-off included
    retries: int = 0  # retries of ClickHouse calls while staging (inserts above all)


class Heartbeat(_Control, frozen=True, tag="heartbeat"):
    """Participant -> coordinator: light and frequent.

    ``figures`` are the copy's own (not per partition: its inserts and retries are the copy's, and
    the leader exports one series per copy); None from participants older than the field.
    """

    partitions: tuple[PartitionPosition, ...]
    continues: bool = False  # understands ``EndCommit.next`` (older participants do not)
    leaving: bool = False  # this copy was told to leave (``Leave``): name it in no START; end its txn at once
    figures: ParticipantFigures | None = None


class LeaderHeartbeat(_Control, frozen=True, tag="leader-heartbeat"):
    """Leader -> standbys: the leader of ``epoch`` is alive (participants ignore it).

    ``leaving``: the leader was stopped and has finished: its lease ends now, a standby claims the
    next epoch at once instead of waiting for ``leader_lease_s`` of silence (older leaders never set it).
    """

    leaving: bool = False


class StandbyHeartbeat(_Control, frozen=True, tag="standby-heartbeat"):
    """Standby -> whoever lists the replicas (``chtxn status``): this replica is alive and stands by.

    Sent every third of ``coordinator.leader_lease_s`` while the replica does not lead, with
    ``epoch`` the highest epoch it has seen (0: none yet), ``txn`` "" and ``sender`` its coordinator
    id; ``leaving`` once, when it is stopped. It is no leader's message: leaders, standbys (their
    lease watch) and participants skip it; older readers skip it as an unknown kind, with a warning.

    ``problem``: why this replica cannot lead or stand by right now (its last error, while it backs
    off and tries again), "" when nothing is wrong; ``cause``: what failed, one of ``PROBLEM_CAUSES``
    ("" when unknown). ``chtxn status`` names them when no leader is heard.
    """

    leaving: bool = False
    problem: str = ""
    cause: str = ""


#: What a coordinator's problem (``StandbyHeartbeat.problem``) is with: the Keeper its ClickHouse
#: server claims slots through, the ClickHouse server, the Kafka broker, or something else.
PROBLEM_CAUSES = ("keeper", "clickhouse", "kafka", "other")


class Leave(_Control, frozen=True, tag="leave"):
    """Participant job's driver -> its tasks: the job was stopped (SIGTERM); the tasks of ``job`` leave.

    Each task finishes its part of the txns it is in (stages what it read, sends WRITE-STATUS) and
    heartbeats ``leaving`` meanwhile, so the leader ends the open txn at once and names it in no
    START. Sent with ``epoch`` 0 and ``txn`` "": it is no coordinator's message. Coordinators and
    older participants skip it.
    """

    job: str


class Pause(_Control, frozen=True, tag="pause"):
    """Operator (``chtxn pause`` / ``resume``) -> leader: stop starting txns (``paused``), or start again.

    Written to the ledger first (PAUSED / RESUMED rows, which a new leader reads at take-over), then
    sent so that the leader acts at once. Sent with ``epoch`` 0 and ``txn`` "". Participants and
    older coordinators skip it.
    """

    paused: bool
    who: str = ""
    reason: str = ""


class Reset(_Control, frozen=True, tag="reset"):
    """Operator (``chtxn reset``) -> leader: offsets were reset by the commit of slot ``commit_seq``.

    The reset is the ledger's (a commit slot of its own); this message only makes the running
    leader act at once: a leader whose head is older steps down and hands its lease over, and the
    next take-over reads the reset offsets. Without it, the leader's next claim loses that slot and
    it steps down then. Sent with ``epoch`` 0 and ``txn`` the reset's. Participants and older
    coordinators skip it.
    """

    commit_seq: int
    who: str = ""
    reason: str = ""


ControlMessage = (
    StartCommit
    | EndCommit
    | WriteStatus
    | AckCommit
    | Abort
    | Heartbeat
    | LeaderHeartbeat
    | Leave
    | Pause
    | StandbyHeartbeat
    | Reset
)

#: Every kind this code knows, by tag.
KINDS: dict[str, type] = {cls.__struct_config__.tag: cls for cls in get_args(ControlMessage)}
