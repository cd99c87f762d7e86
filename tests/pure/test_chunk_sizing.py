"""The START's chunk cap: from the rate partitions were read at, and how far behind they are."""

from __future__ import annotations

from dataclasses import replace

import msgspec

from protocol.coordinator import events as coordinator_events
from protocol.coordinator.chunk_sizing import CHUNKS_PER_TXN, MIN_CHUNK_ROWS, ChunkSizer
from protocol.coordinator.events import Broadcast, Tick
from protocol.messages import Heartbeat, PartitionPosition, StartCommit
from protocol.participant.events import Received
from tests.pure.coordinator_driver import P0, P1, PIPE, T0, TIMING, Driver, participant, ws
from tests.pure.test_participant_state import TP0, machine, polled, stages, start

A, B = P0, P1


def sizer(interval_s: float = 1.0, trigger: int = 1_000_000) -> ChunkSizer:
    return ChunkSizer(interval_s=interval_s, size_trigger_rows=trigger)


def test_no_cap_until_a_txn_has_been_learnt_from() -> None:
    assert sizer().chunk_rows({A: 50_000}) == 0


def test_a_caught_up_partition_gets_a_quarter_of_what_it_reads_in_an_interval() -> None:
    s = sizer(interval_s=2.0)
    s.learn({A: 15_000, B: 3_000}, span_s=1.0)  # the busiest partition sets the size
    assert s.chunk_rows({A: 0, B: 0}) == 15_000 * 2 // CHUNKS_PER_TXN


def test_a_partition_behind_its_log_end_gets_big_chunks() -> None:
    s = sizer()
    s.learn({A: 0, B: 0}, span_s=1.0)  # idle, then a burst arrives
    assert s.chunk_rows({A: 0, B: 0}) == MIN_CHUNK_ROWS
    assert s.chunk_rows({A: 400_000, B: 0}) == 100_000


def test_the_size_trigger_bounds_what_a_partition_can_read_in_a_txn() -> None:
    s = sizer(trigger=40_000)
    s.learn({A: 100_000, B: 100_000}, span_s=1.0)
    assert s.chunk_rows({}) == 40_000 // 2 // CHUNKS_PER_TXN


def test_slow_partitions_still_get_chunks_of_the_minimum() -> None:
    s = sizer()
    s.learn({A: 12, B: 3}, span_s=1.0)
    assert s.chunk_rows({}) == MIN_CHUNK_ROWS


def test_placed_by_a_sharding_key_the_cap_is_the_shard_count_times_larger() -> None:
    """Each of the 4 shards gets a part of every chunk: each part keeps the size a chunk placed by partition has."""
    by_key = ChunkSizer(interval_s=1.0, size_trigger_rows=1_000_000, scale=4)
    by_partition = sizer()
    for s in (by_key, by_partition):
        s.learn({A: 0, B: 0}, span_s=1.0)
    assert by_key.chunk_rows({}) == 4 * by_partition.chunk_rows({}) == 4 * MIN_CHUNK_ROWS
    assert by_key.chunk_rows({A: 400_000}) == 4 * by_partition.chunk_rows({A: 400_000}) == 4 * 100_000


def test_a_participant_cuts_at_the_starts_cap_when_it_is_below_its_own() -> None:
    m = machine(chunk_rows=3)
    capped = msgspec.structs.replace(start("e1_t1", {TP0: 10}).message, chunk_rows=2)
    m.handle(Received(capped), 0)
    assert [offs for _, _, offs in stages(m.handle(polled(TP0, 10, 11, 12, 13, 14), 0))] == [[10, 11], [12, 13]]
    m2 = machine(chunk_rows=3)
    loose = msgspec.structs.replace(start("e1_t1", {TP0: 10}).message, chunk_rows=50)  # never above its own
    m2.handle(Received(loose), 0)
    assert [offs for _, _, offs in stages(m2.handle(polled(TP0, 10, 11, 12, 13, 14), 0))] == [[10, 11, 12]]


def test_the_coordinator_sizes_the_next_start_from_the_last_complete_txn() -> None:
    d = Driver(replace(TIMING, size_trigger_rows=1_000_000))
    t1 = d.started(T0)
    d.spare_ready(2, T0 + 0.5)
    at = PartitionPosition(topic=P0.topic, partition=P0.partition, position=8_040, log_end=10_040)
    beat = Heartbeat(pipeline=PIPE, epoch=3, txn=t1.id, sender=participant(P0), partitions=(at,))
    d.at(T0 + 0.9, coordinator_events.Received(beat))
    d.at(T0 + 1.0, Tick())  # END of txn 1: its 1 s interval is up
    d.at(T0 + 1.1, ws(t1.id, P0, 40, 8_040, 8_000))
    actions = d.at(T0 + 1.2, ws(t1.id, P1, 0, 400, 400))
    starts = [a.message for a in actions if isinstance(a, Broadcast) and isinstance(a.message, StartCommit)]
    # P0 read 8,000 rows in txn 1's second and is 2,000 behind: a quarter of that
    assert [s.chunk_rows for s in starts] == [(8_000 + 2_000) // CHUNKS_PER_TXN]
