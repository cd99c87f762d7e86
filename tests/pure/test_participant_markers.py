"""The participant at a partition's end (issue 36, item 6b): transaction markers take offsets no
``read_committed`` consumer is given, so the consumer's end of partition (``ReadToEnd``) is where a
txn reading to it ends, never a record it did not stage."""

from __future__ import annotations

from protocol.chunking import ChunkBuilder
from protocol.messages import CONTINUE
from protocol.participant.events import ReadToEnd, Seek
from tests.pure.test_participant_chaining import end_next
from tests.pure.test_participant_state import TP0, TP1, abort, end, machine, polled, staged, stages, start, status
from tests.records import Rec


def at_end(offset: int) -> ReadToEnd:
    return ReadToEnd(TP0.topic, TP0.partition, offset)


def test_a_txn_read_to_the_partitions_end_ends_past_its_trailing_marker():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10), 0)  # offset 11: the marker of the producer's transaction
    assert m.handle(at_end(12), 0) == []
    acts = m.handle(end("e1_t1"), 0)
    assert stages(acts) == [("t__chtxn_e1_t1", "pl/e1_t1/src/0/0/10-11", [10])]  # the chunk ends at its record
    assert m.handle(staged("e1_t1", TP0, 0, 1), 0) == [status("e1_t1", TP0, 10, 12, 1, 1, nbytes=9)]


def test_the_next_txn_continues_from_past_the_marker_and_an_earlier_end_never_moves_back():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10}), 0)
    m.handle(polled(TP0, 10, 11), 0)
    m.handle(at_end(13), 0)
    m.handle(at_end(12), 0)  # an end below the position (none comes after a later one): nothing moves
    acts = m.handle(end_next("e1_t1", "e1_t2", {TP0: CONTINUE}), 0)
    assert not [a for a in acts if isinstance(a, Seek)]
    assert stages(m.handle(polled(TP0, 13, 14), 0)) == [("t__chtxn_e1_t2", "pl/e1_t2/src/0/0/13-15", [13, 14])]


def test_an_end_read_outside_a_txn_makes_the_next_start_seek_back_and_read_to_it_again():
    m = machine()
    m.handle(start("e1_t1", {TP0: 10, TP1: 20}), 0)
    m.handle(polled(TP0, 10), 0)
    m.handle(abort("e1_t1"), 0)
    m.handle(at_end(12), 0)  # delivered while in no txn: nothing staged, nothing ended past it
    assert m.handle(start("e1_t2", {TP0: 10}), 0)[:1] == [Seek("src", 0, 10)]
    m.handle(polled(TP0, 10), 0)
    m.handle(end("e1_t2"), 0)
    assert m.handle(staged("e1_t2", TP0, 0, 1), 0) == [status("e1_t2", TP0, 10, 11, 1, 1, nbytes=9)]


def test_a_builder_passed_to_an_offset_cuts_chunks_at_their_records():
    builder = ChunkBuilder(
        pipeline="pl", txn="e1_t1", topic="src", partition=0, start_offset=0, chunk_rows=2, chunk_bytes=100
    )
    builder.add([Rec("src", 0, 0, b"a")])
    builder.passed(2)
    builder.passed(1)  # never back
    assert builder.next_offset == 2
    assert builder.add([Rec("src", 0, 1, b"stale")]) == []  # below the end: a stale delivery, skipped
    chunk = builder.flush()
    assert chunk is not None and (chunk.first_offset, chunk.next_offset, chunk.token) == (0, 1, "pl/e1_t1/src/0/0/0-1")
