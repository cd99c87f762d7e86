"""The participant state machine: events in, exact action lists out."""

from __future__ import annotations

import pytest

from protocol.messages import (
    Abort,
    AckCommit,
    EndCommit,
    Heartbeat,
    LeaderHeartbeat,
    PartitionHolder,
    PartitionOffset,
    PartitionPosition,
    StartCommit,
    TopicPartition,
    WriteStatus,
)
from protocol.participant.events import (
    ChunkStaged,
    CommitOffsets,
    DropTxn,
    PartitionFailed,
    Pause,
    Polled,
    Received,
    Resume,
    Seek,
    Send,
    Tick,
)
from protocol.participant.state import ParticipantState
from tests.records import Rec

P = "pl"
TP0, TP1 = TopicPartition(topic="src", partition=0), TopicPartition(topic="src", partition=1)
TP9 = TopicPartition(topic="src", partition=9)  # held by another task


def machine(chunk_rows: int = 2) -> ParticipantState:
    """A task of TP0 and TP1; its invariants are checked after every event (``tests/pure/conftest.py``)."""
    return ParticipantState(
        pipeline=P,
        sender="task-0",
        partitions=[TP1, TP0],
        chunk_rows=chunk_rows,
        chunk_bytes=10_000,
        heartbeat_interval_s=1.0,
    )


def start(txn: str, offsets: dict[TopicPartition, int], epoch: int = 1) -> Received:
    return Received(
        StartCommit(
            pipeline=P,
            epoch=epoch,
            txn=txn,
            sender="coord",
            stage_table=f"t__chtxn_{txn}",
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in offsets.items()
            ),
        )
    )


def end(txn: str, epoch: int = 1) -> Received:
    return Received(EndCommit(pipeline=P, epoch=epoch, txn=txn, sender="coord"))


def ack(txn: str, offsets: dict[TopicPartition, int], epoch: int = 1) -> Received:
    return Received(
        AckCommit(
            pipeline=P,
            epoch=epoch,
            txn=txn,
            sender="coord",
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=o) for tp, o in offsets.items()
            ),
        )
    )


def abort(txn: str, epoch: int = 1) -> Received:
    return Received(Abort(pipeline=P, epoch=epoch, txn=txn, sender="coord", reason="test"))


def polled(tp: TopicPartition, *offsets: int) -> Polled:
    return Polled([Rec(tp.topic, tp.partition, o, b'{"o":%03d}' % o) for o in offsets])


def staged(
    txn: str, tp: TopicPartition, chunk_no: int, rows: int, dead_letters: int = 0, error: str = ""
) -> ChunkStaged:
    return ChunkStaged(
        txn=txn,
        topic=tp.topic,
        partition=tp.partition,
        chunk_no=chunk_no,
        rows=rows,
        dead_letters=dead_letters,
        error=error,
    )


def stages(actions) -> list[tuple]:
    """StageChunk actions as (table, token, offsets) for exact comparison."""
    return [(a.stage_table, a.chunk.token, [r.offset() for r in a.chunk.records]) for a in actions]


def status(txn, tp, start_offset, end_offset, rows, chunks, dead_letters=0, errors=(), epoch=1, nbytes=None) -> Send:
    return Send(
        WriteStatus(
            pipeline=P,
            epoch=epoch,
            txn=txn,
            sender="task-0",
            topic=tp.topic,
            partition=tp.partition,
            start_offset=start_offset,
            end_offset=end_offset,
            rows=rows,
            chunks=chunks,
            dead_letters=dead_letters,
            bytes=nbytes if nbytes is not None else 9 * (end_offset - start_offset),
            errors=tuple(errors),
        )
    )


def test_a_whole_txn_start_records_end_write_status_ack():
    m = machine()
    assert m.handle(start("e1_t1", {TP0: 10, TP1: 20, TP9: 5}), 0) == [Seek("src", 0, 10), Seek("src", 1, 20)]
    assert m.consuming
    acts = m.handle(polled(TP0, 10, 11, 12), 0)
    assert stages(acts) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-12", [10, 11])]
    assert m.handle(staged("e1_t1", TP0, 0, 2), 0) == []
    acts = m.handle(end("e1_t1"), 0)
    assert stages(acts[:1]) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/1/12-13", [12])]
    assert acts[1:] == [status("e1_t1", TP1, 20, 20, 0, 0)]  # no pause at END: reading just stops
    assert not m.consuming
    assert m.handle(staged("e1_t1", TP0, 1, 1), 0) == [status("e1_t1", TP0, 10, 13, 3, 2)]
    assert m.handle(ack("e1_t1", {TP0: 13, TP1: 20, TP9: 5}), 0) == [
        CommitOffsets(
            (PartitionOffset(topic="src", partition=0, offset=13), PartitionOffset(topic="src", partition=1, offset=20))
        )
    ]
    assert m.handle(ack("e1_t1", {TP0: 13}), 0) == []  # once only


def test_write_status_waits_for_chunks_in_flight_and_counts_dead_letters():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(polled(TP0, 0, 1, 2, 3), 0)
    assert m.handle(end("e1_t1"), 0) == []  # both chunks were cut already; no pause at END
    assert m.handle(staged("e1_t1", TP0, 1, 2), 0) == []
    assert m.handle(staged("e1_t1", TP0, 0, 1, dead_letters=1), 0) == [status("e1_t1", TP0, 0, 4, 3, 2, dead_letters=1)]


def test_pipelined_start_continues_without_seeking():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)
    m.handle(end("e1_t1"), 0)
    m.handle(staged("e1_t1", TP0, 0, 1), 0)
    assert m.handle(start("e1_t2", {TP0: 11}), 0) == []  # at its position and never paused: nothing to do
    assert m.consuming
    assert stages(m.handle(polled(TP0, 11, 12), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/11-13", [11, 12])]
    # the ACK of the previous txn still commits its offsets
    assert m.handle(ack("e1_t1", {TP0: 11}), 0) == [
        CommitOffsets((PartitionOffset(topic="src", partition=0, offset=11),))
    ]


def test_a_start_elsewhere_than_the_position_seeks():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10, 11, 12), 0)
    m.handle(abort("e1_t1"), 0)
    assert m.handle(start("e1_t2", {TP0: 10}), 0) == [Seek("src", 0, 10)]
    assert stages(m.handle(polled(TP0, 10, 11), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/10-12", [10, 11])]


def test_a_start_at_the_position_of_a_paused_partition_resumes_it():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10, 11, 12), 0)
    assert m.handle(abort("e1_t1"), 0) == [DropTxn("e1_t1"), Pause((TP0,))]
    assert m.handle(start("e1_t2", {TP0: 13}), 0) == [Resume((TP0,))]  # no seek: it is there already
    assert stages(m.handle(polled(TP0, 13, 14), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/13-15", [13, 14])]


def test_a_partition_left_out_of_a_start_is_paused():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    m.handle(end("e1_t1"), 0)
    assert m.handle(start("e1_t2", {TP0: 10}), 0) == [Pause((TP1,))]  # TP0 is at 10 and fetching


def test_records_delivered_outside_a_txn_force_a_seek_at_the_next_start():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(end("e1_t1"), 0)
    assert m.handle(polled(TP0, 0, 1), 0) == []  # not staged
    assert m.handle(start("e1_t2", {TP0: 0}), 0) == [Seek("src", 0, 0)]


def test_abort_of_the_current_txn_drops_it_and_waits_for_the_next_start():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0, TP1: 0}), 0)
    m.handle(polled(TP0, 0, 1, 2), 0)
    assert m.handle(abort("e1_t1"), 0) == [DropTxn("e1_t1"), Pause((TP0, TP1))]
    assert not m.consuming
    assert m.handle(staged("e1_t1", TP0, 0, 2), 0) == []  # outcome of a dropped chunk
    assert m.handle(end("e1_t1"), 0) == []
    assert m.handle(polled(TP0, 3), 0) == []
    assert m.handle(abort("e1_t1"), 0) == []  # twice


def test_abort_of_the_previous_txn_dooms_the_pipelined_one():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(end("e1_t1"), 0)
    m.handle(start("e1_t2", {TP0: 0}), 0)
    m.handle(polled(TP0, 0), 0)
    assert m.handle(abort("e1_t1"), 0) == [DropTxn("e1_t1"), DropTxn("e1_t2"), Pause((TP0,))]
    assert m.handle(end("e1_t2"), 0) == []
    assert m.handle(ack("e1_t1", {TP0: 0}), 0) == []


def test_a_new_leaders_start_is_not_doomed_by_an_abort_of_an_old_leaders_txn():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(end("e1_t1"), 0)
    m.handle(start("e2_t1", {TP0: 0}, epoch=2), 0)
    assert m.handle(abort("e1_t1", epoch=2), 0) == [DropTxn("e1_t1")]
    assert m.consuming


def test_stale_epochs_other_txns_and_others_messages_are_ignored():
    m = machine()
    m.handle(start("e2_t1", {TP0: 0}, epoch=2), 0)
    assert m.handle(end("e1_t9", epoch=1), 0) == []
    assert m.handle(start("e1_t9", {TP0: 50}, epoch=1), 0) == []
    assert m.handle(abort("e2_t1", epoch=1), 0) == []
    assert m.handle(end("e2_t7", epoch=2), 0) == []  # not the current txn
    assert m.handle(abort("e2_t7", epoch=2), 0) == []
    assert m.handle(ack("e2_t7", {TP0: 1}, epoch=2), 0) == []
    assert m.handle(start("e2_t1", {TP0: 0}, epoch=2), 0) == []  # a START seen before
    others = [
        WriteStatus(
            pipeline=P,
            epoch=2,
            txn="e2_t1",
            sender="x",
            topic="src",
            partition=9,
            start_offset=0,
            end_offset=0,
            rows=0,
            chunks=0,
        ),
        Heartbeat(pipeline=P, epoch=2, txn="e2_t1", sender="x", partitions=()),
        LeaderHeartbeat(pipeline=P, epoch=3, txn="", sender="coord"),
        EndCommit(pipeline="other", epoch=2, txn="e2_t1", sender="coord"),
    ]
    assert [m.handle(Received(msg), 0) for msg in others] == [[], [], [], []]
    assert m.epoch == 2 and m.consuming


def test_a_restarted_participant_takes_no_part_in_a_txn_under_way():
    m = machine()  # started after the START of e1_t1 went out
    assert m.handle(polled(TP0, 0), 0) == []
    assert m.handle(end("e1_t1"), 0) == []
    assert m.handle(ack("e1_t1", {TP0: 5}), 0) == []
    assert m.handle(start("e1_t2", {TP0: 5, TP1: 0}), 0) == [Seek("src", 0, 5), Seek("src", 1, 0)]


def test_a_start_that_replaces_an_unended_txn_drops_it():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(polled(TP0, 0, 1), 0)
    assert m.handle(start("e1_t2", {TP0: 0}), 0) == [DropTxn("e1_t1"), Pause((TP0,)), Seek("src", 0, 0)]


def test_a_failed_chunk_pauses_the_partition_and_is_reported_at_end():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    m.handle(polled(TP0, 0, 1, 2, 3), 0)
    assert m.handle(staged("e1_t1", TP0, 0, 0, error="Code: 60. table gone"), 0) == [Pause((TP0,))]
    assert m.handle(polled(TP0, 4), 0) == []
    assert m.handle(end("e1_t1"), 0) == []  # chunk 1 still in flight
    assert m.handle(staged("e1_t1", TP0, 1, 2), 0) == [
        status("e1_t1", TP0, 0, 4, 2, 2, errors=["chunk 0: Code: 60. table gone"])
    ]


def test_an_unreadable_partition_is_reported_at_end():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0}), 0)
    assert m.handle(PartitionFailed("src", 0, "offset 0 out of range"), 0) == [Pause((TP0,))]
    assert m.handle(end("e1_t1"), 0) == [status("e1_t1", TP0, 0, 0, 0, 0, errors=["offset 0 out of range"])]


def test_heartbeats_every_interval_with_positions_and_buffered_rows():
    m = machine(chunk_rows=100)
    beat = m.handle(Tick(), 0.0)
    assert beat == [
        Send(
            Heartbeat(
                pipeline=P,
                epoch=0,
                txn="",
                sender="task-0",
                partitions=(
                    PartitionPosition(topic="src", partition=0, position=-1, log_end=-1),
                    PartitionPosition(topic="src", partition=1, position=-1, log_end=-1),
                ),
                continues=True,
            )
        )
    ]
    m.handle(start("e1_t1", {TP0: 10, TP1: 0}), 0.1)
    m.handle(polled(TP0, 10, 11, 12), 0.2)
    assert m.handle(Tick({TP0: 40}), 0.9) == []
    assert m.heartbeat_due(1.0)
    assert m.handle(Tick({TP0: 40}), 1.0) == [
        Send(
            Heartbeat(
                pipeline=P,
                epoch=1,
                txn="e1_t1",
                sender="task-0",
                partitions=(
                    PartitionPosition(topic="src", partition=0, position=13, log_end=40, buffered_rows=3),
                    PartitionPosition(topic="src", partition=1, position=0, log_end=-1, buffered_rows=0),
                ),
                continues=True,
            )
        )
    ]
    m.handle(end("e1_t1"), 1.5)
    assert m.handle(Tick(), 2.0) == [
        Send(
            Heartbeat(
                pipeline=P,
                epoch=1,
                txn="",
                sender="task-0",
                partitions=(
                    PartitionPosition(
                        topic="src", partition=0, position=13, log_end=40, buffered_rows=0
                    ),  # the last log end seen
                    PartitionPosition(topic="src", partition=1, position=0, log_end=-1, buffered_rows=0),
                ),
                continues=True,
            )
        )
    ]


def test_mixed_batches_are_split_by_partition():
    m = machine()
    m.handle(start("e1_t1", {TP0: 0, TP1: 0}), 0)
    batch = Polled(polled(TP0, 0).records + polled(TP1, 0, 1).records + polled(TP0, 1).records)
    assert stages(m.handle(batch, 0)) == [
        ("t__chtxn_e1_t1", "pl/e1_t1/src/1/0/0-2", [0, 1]),
        ("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/0-2", [0, 1]),
    ]


def test_runs_of_one_partition_number_in_two_topics_are_split_by_topic():
    other = TopicPartition(topic="other", partition=0)
    m = ParticipantState(
        pipeline=P, sender="task-0", partitions=[TP0, other], chunk_rows=2, chunk_bytes=10_000, heartbeat_interval_s=1.0
    )
    m.handle(start("e1_t1", {TP0: 0, other: 0}), 0)
    batch = Polled(polled(TP0, 0).records + polled(other, 0, 1).records + polled(TP0, 1).records)
    assert stages(m.handle(batch, 0)) == [
        ("t__chtxn_e1_t1", "pl/e1_t1/other/0/0/0-2", [0, 1]),
        ("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/0-2", [0, 1]),
    ]


def test_unknown_events_are_a_bug():
    with pytest.raises(TypeError):
        machine().handle(object(), 0)  # type: ignore[arg-type]  # not an Event, on purpose


def test_a_copy_not_named_as_holder_stands_down_for_that_partition():
    """Two live copies of one task: START names the holder of each partition; the other copy
    stages nothing of it and sends no WRITE-STATUS for it."""
    m = machine()
    held = Received(
        StartCommit(
            pipeline=P,
            epoch=1,
            txn="e1_t1",
            sender="coord",
            stage_table="t__chtxn_e1_t1",
            offsets=(
                PartitionOffset(topic="src", partition=0, offset=10),
                PartitionOffset(topic="src", partition=1, offset=20),
            ),
            holders=(
                PartitionHolder(topic="src", partition=0, sender="task-0"),
                PartitionHolder(topic="src", partition=1, sender="task-0-other-copy"),
            ),
        )
    )
    assert m.handle(held, 0) == [Seek("src", 0, 10)]
    assert stages(m.handle(polled(TP1, 20, 21), 0)) == []  # delivered anyway: not staged
    assert stages(m.handle(polled(TP0, 10, 11), 0)) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-12", [10, 11])]
    acts = m.handle(end("e1_t1"), 0)
    assert [a for a in acts if isinstance(a, Send)] == []  # chunk 0 still in flight
    acts = m.handle(staged("e1_t1", TP0, 0, 2), 0)
    assert acts == [status("e1_t1", TP0, 10, 12, 2, 1, nbytes=18)]


def test_the_insert_backlog_is_one_chunk_per_partition_read_at_the_txns_chunk_size():
    m = machine(chunk_rows=100)
    assert m.insert_backlog_rows == 0, "nothing is read before a START"
    m.handle(start("e1_t1", {TP0: 0, TP1: 0}), 0)
    assert m.insert_backlog_rows == 200
    small = StartCommit(
        pipeline=P,
        epoch=1,
        txn="e1_t2",
        sender="coord",
        stage_table="t__chtxn_e1_t2",
        chunk_rows=30,
        offsets=(PartitionOffset(topic="src", partition=0, offset=0),),
    )
    m.handle(abort("e1_t1"), 0)
    m.handle(Received(small), 0)
    assert m.insert_backlog_rows == 30, "the START's smaller chunks, for the one partition it names"
    m.handle(end("e1_t2"), 0)
    assert m.insert_backlog_rows == 0
