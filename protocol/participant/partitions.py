"""The partitions of one participant task and what is read into them. Pure; owned by ``ParticipantState``.

Each partition this task holds has at most one txn it reads into (its open ``Stint``) and the
ended txns still waiting for chunks in flight, oldest first. Records are cut into chunks
(``protocol.chunking``) and each chunk is staged as it closes (participant step 2); once nothing
of an ended txn is in flight, its WRITE-STATUS goes out (participant step 3), in txn order. Rows
read are weighed against the partition's share of the size trigger (``protocol.size_trigger``):
crossing a multiple of it, or reaching ``full_rows``, asks for a heartbeat at once
(``report_now``), and a full partition reads no more until END. A chunk that fails fails its
partition for the txn: it is paused and its WRITE-STATUS carries the error. What is kept per
partition and per txn is ``protocol.participant.stint``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from protocol import size_trigger
from protocol.chunking import ChunkBuilder, RecordLike
from protocol.messages import CONTINUE, PartitionPosition, StartCommit, TopicPartition, WriteStatus
from protocol.participant.events import (
    Action,
    ChunkStaged,
    PartitionFailed,
    Pause,
    ReadToEnd,
    Resume,
    Seek,
    Send,
    StageChunk,
)
from protocol.participant.stint import Partition, Status, Stint

log = logging.getLogger(__name__)


class Partitions:
    """The task's partitions, by (topic, partition), with the chunk settings of its txns."""

    def __init__(
        self,
        tps: Iterable[TopicPartition],
        *,
        pipeline: str,
        sender: str,
        chunk_rows: int,
        chunk_bytes: int,
        size_trigger_rows: int,
        shard_count: int = 0,
    ) -> None:
        self.pipeline, self.sender = pipeline, sender
        self.shard_count = shard_count  # ``protocol.shards.placed_count`` of this participant's config
        self._mismatch_told = ""  # the txn whose START placed partitions over another count, once logged
        self.chunk_rows, self.chunk_bytes = chunk_rows, chunk_bytes
        self.size_trigger_rows = size_trigger_rows
        self.parts: dict[tuple[str, int], Partition] = {
            (tp.topic, tp.partition): Partition(tp=tp) for tp in sorted(set(tps))
        }
        self.report_now = False  # a share of the size trigger was crossed: heartbeat at once

    @property
    def consuming(self) -> bool:
        """Some partition is read into a txn and has room left in it, or is held (read and its records
        dropped, so that its log end stays fresh: ``_join``)."""
        return any(
            p.open is not None
            and (p.open.status is Status.HELD or (p.open.status is Status.STAGING and not p.open.full))
            for p in self.parts.values()
        )

    @property
    def owed(self) -> set[str]:
        """The txns some partition still reads into or owes a WRITE-STATUS for (chunks in flight)."""
        return {s.txn for p in self.parts.values() for s in ([p.open] if p.open else []) + p.ending}

    @property
    def insert_backlog_rows(self) -> int:
        """One chunk per partition being read, at its txn's chunk size."""
        return sum(p.open.builder.chunk_rows for p in self.parts.values() if p.open is not None)

    def start(self, m: StartCommit, cuts: dict[TopicPartition, int] | None) -> list[Action]:
        """Participant step 1 for the partitions START lists: each this copy holds reads into its txn
        (seeking only where the position differs); every other partition is paused. ``cuts``: where
        the END carrying this START cut each partition this copy read to it without an error."""
        actions: list[Action] = []
        holders = {(h.topic, h.partition): h.sender for h in m.holders}
        resume: list[TopicPartition] = []
        joined: set[TopicPartition] = set()
        for po in m.offsets:
            p = self.parts.get((po.topic, po.partition))
            if p is None:
                continue
            holder = holders.get((po.topic, po.partition), self.sender)
            if holder != self.sender:  # another copy of this participant holds it: stand down
                log.warning(
                    "START of %s names %s as holder of %s/%d, not this copy (%s): standing down",
                    m.txn,
                    holder,
                    po.topic,
                    po.partition,
                    self.sender,
                )
                continue
            if p.open is not None:  # still reading an older txn: it will never report
                log.warning("START of %s: abandoning %s of %s/%d", m.txn, p.open.txn, po.topic, po.partition)
                p.open = None
            offset = po.offset
            if offset == CONTINUE:
                if cuts is None or p.tp not in cuts:
                    log.warning(
                        "START of %s continues %s/%d from a txn this copy did not read to its END: taking no part",
                        m.txn,
                        po.topic,
                        po.partition,
                    )
                    continue
                offset = cuts[p.tp]
            self._join(p, m, offset)
            joined.add(p.tp)
            if p.position != offset:
                actions.append(Seek(po.topic, po.partition, offset))
                p.position, p.fetching = offset, True
            elif not p.fetching:
                resume.append(p.tp)
                p.fetching = True
        if resume:
            actions.append(Resume(tuple(resume)))
        return actions + self.pause([p for p in self.parts.values() if p.tp not in joined])

    def _join(self, p: Partition, m: StartCommit, offset: int) -> None:
        builder = ChunkBuilder(
            pipeline=self.pipeline,
            txn=m.txn,
            topic=p.tp.topic,
            partition=p.tp.partition,
            start_offset=offset,
            chunk_rows=min(self.chunk_rows, m.chunk_rows or self.chunk_rows),
            chunk_bytes=self.chunk_bytes,
        )
        share = size_trigger.share(self.size_trigger_rows, len(m.offsets))
        stage_table = m.stage_table_for(p.tp)
        if m.shards and m.shard_count != self.shard_count:
            stage_table = ""  # its shard may have no stage table in this txn: its insert would fail
            if self._mismatch_told != m.txn:
                self._mismatch_told = m.txn
                log.error(
                    "START of %s places partitions by partition over %d shards and this participant over %d: "
                    "holding its partitions, nothing staged; run the coordinator and the participant job with the "
                    "same clickhouse.shards and clickhouse.placement",
                    m.txn,
                    m.shard_count,
                    self.shard_count,
                )
        if m.stage_tables and all(s.topic != p.tp.topic for s in m.stage_tables):
            log.warning(
                "START of %s names no stage table for topic %s (its route is gone?): holding %s/%d, nothing staged",
                m.txn,
                p.tp.topic,
                p.tp.topic,
                p.tp.partition,
            )
        p.open = Stint(
            txn=m.txn,
            epoch=m.epoch,
            stage_table=stage_table,
            start_offset=offset,
            builder=builder,
            share=share,
            # No stage table for its table (or on its shard) in this txn: the coordinator saw no
            # records waiting when it made them. It goes on fetching (so its log end stays fresh in heartbeats: the next txn
            # gets a stage table once records arrive), stages nothing, and its WRITE-STATUS ends where
            # it started; records read meanwhile are read again from there by the next START.
            status=Status.STAGING if stage_table else Status.HELD,
        )

    def end(self, txn: str) -> tuple[list[Action], dict[TopicPartition, int]]:
        """Participant step 3 for the partitions reading into ``txn``: cut the open chunk and stage it,
        and report those with nothing in flight. Also where each partition read without an error was
        cut (a chained START goes on from there)."""
        actions: list[Action] = []
        cuts: dict[TopicPartition, int] = {}
        for p in self.parts.values():
            stint = p.open
            if stint is None or stint.txn != txn:
                continue
            if not stint.errors:
                cuts[p.tp] = stint.builder.next_offset
            if stint.status is Status.STAGING:
                actions += stint.flush()
            stint.status = Status.ENDING
            p.open = None
            p.ending.append(stint)
            actions += self.report_ready(p)
        return actions, cuts

    def drop(self, txns: list[str]) -> list[Action]:
        """Forget ``txns`` on every partition (chunks in flight report to nothing); pause those left idle."""
        idle: list[Partition] = []
        for p in self.parts.values():
            p.ending = [s for s in p.ending if s.txn not in txns]
            if p.open is not None and p.open.txn in txns:
                p.open = None
            if p.open is None:
                idle.append(p)
        return self.pause(idle)

    def read(self, records: Sequence[RecordLike]) -> list[Action]:
        """Participant step 2: cut ``records`` into chunks of the txns they are read into."""
        actions: list[Action] = []
        n, i = len(records), 0
        only = next(iter(self.parts)) if len(self.parts) == 1 else None
        while i < n:  # runs of consecutive records of one partition
            topic, partition = records[i].topic(), records[i].partition()
            j = i + 1
            if (topic, partition) == only and (records[-1].topic(), records[-1].partition()) == only:
                j = n  # a task of one partition reads only that partition
            while j < n and records[j].partition() == partition and records[j].topic() == topic:
                j += 1
            p = self.parts.get((topic, partition))
            stint = p.open if p is not None else None
            if p is not None and stint is not None and stint.status is Status.STAGING:
                for chunk in stint.builder.add(records, i, j):
                    stint.pending.add(chunk.chunk_no)
                    actions.append(StageChunk(stint.stage_table, chunk))
                p.position = stint.builder.next_offset
                if stint.share and stint.builder.rows_read // stint.share > stint.reported_share:
                    stint.reported_share = stint.builder.rows_read // stint.share
                    self.report_now = True
                if stint.share and not stint.reported_full and stint.full:
                    stint.reported_full = True  # full: the coordinator ends the txn at once
                    self.report_now = True
            elif p is not None:  # delivered outside a txn: not staged; a later START seeks back
                p.position = max(p.position, records[j - 1].offset() + 1)
            i = j
        return actions

    def read_to_end(self, e: ReadToEnd) -> None:
        """Participant step 2, at the partition's end: a txn reading it goes on to ``e.offset``, past
        trailing markers, so its END does not stop before them (and the committed offset, the lag and
        the leader's "records waiting" see no record where there is none)."""
        p = self.parts.get((e.topic, e.partition))
        if p is None:
            return
        stint = p.open
        if stint is not None and stint.status is Status.STAGING:
            stint.builder.passed(e.offset)
            p.position = stint.builder.next_offset
        else:  # read outside a txn, like records delivered then: a later START seeks back
            p.position = max(p.position, e.offset)

    def staged(self, e: ChunkStaged) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        stint = p.stint(e.txn) if p is not None else None
        if p is None or stint is None or e.chunk_no not in stint.pending:
            return []  # a chunk of a dropped txn: ``DropTxn`` leaves chunks in flight, and they report
        stint.pending.discard(e.chunk_no)
        stint.rows += e.rows
        stint.dead_letters += e.dead_letters
        if e.error:
            return self.fail(p, stint, f"chunk {e.chunk_no}: {e.error}")
        return self.report_ready(p)

    def failed(self, e: PartitionFailed) -> list[Action]:
        p = self.parts.get((e.topic, e.partition))
        if p is None or p.open is None:
            log.warning("cannot read %s/%d outside a txn: %s", e.topic, e.partition, e.error)
            return []
        return self.fail(p, p.open, e.error)

    def fail(self, p: Partition, stint: Stint, error: str) -> list[Action]:
        """``stint`` cannot commit: pause ``p`` if it still reads into it; its WRITE-STATUS carries ``error``."""
        stint.errors.append(error)
        if stint.status is Status.STAGING:
            stint.status = Status.FAILED
            return self.pause([p])
        return self.report_ready(p)

    def report_ready(self, p: Partition) -> list[Action]:
        """Participant step 3: one WRITE-STATUS per ended txn once nothing of it is in flight, oldest first."""
        actions: list[Action] = []
        while p.ending and not p.ending[0].pending:
            stint = p.ending.pop(0)
            b = stint.builder
            actions.append(
                Send(
                    WriteStatus(
                        pipeline=self.pipeline,
                        epoch=stint.epoch,
                        txn=stint.txn,
                        sender=self.sender,
                        topic=p.tp.topic,
                        partition=p.tp.partition,
                        start_offset=stint.start_offset,
                        end_offset=b.next_offset,
                        rows=stint.rows,
                        chunks=b.chunks_cut,
                        dead_letters=stint.dead_letters,
                        bytes=b.bytes_read,
                        errors=tuple(stint.errors),
                    )
                )
            )
        return actions

    def pause(self, parts: list[Partition]) -> list[Action]:
        fetching = [p for p in parts if p.fetching]
        for p in fetching:
            p.fetching = False
        return [Pause(tuple(p.tp for p in fetching))] if fetching else []

    def positions(self, in_txn: str, log_ends: dict[TopicPartition, int]) -> tuple[PartitionPosition, ...]:
        """What a heartbeat tells of each partition; rows read count only for ``in_txn`` ("" for none)."""
        return tuple(
            PartitionPosition(
                topic=p.tp.topic,
                partition=p.tp.partition,
                position=p.position,
                log_end=log_ends.get(p.tp, -1),
                buffered_rows=p.buffered_rows if in_txn and p.open is not None and p.open.txn == in_txn else 0,
            )
            for p in self.parts.values()
        )
