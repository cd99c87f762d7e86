"""Commit step 3 for a txn with nothing to read: it stays open past the interval until its first
record arrives, or until ``idle_interval_s`` (``Flight.idle``). Fed events, no I/O."""

from __future__ import annotations

import dataclasses

from protocol.coordinator.events import CountStage, PartitionsChanged, Received, Tick
from protocol.messages import Heartbeat, PartitionPosition, TopicPartition
from tests.pure.coordinator_driver import (
    EPOCH,
    HEAD,
    INITIAL,
    P0,
    P1,
    P2,
    PIPE,
    T0,
    TIMING,
    Driver,
    end,
    participant,
    ws,
)

IDLE = dataclasses.replace(TIMING, idle_interval_s=5.0)
#: Where each partition's txn 1 starts, and so its committed offset: P0 at the head, P1 at its initial.
BASE = {P0: HEAD[P0], P1: INITIAL[P1]}


def beat(tp: TopicPartition, *, position: int | None = None, log_end: int | None = None, buffered: int = 0) -> Received:
    """A heartbeat of ``tp``'s holder in txn 1: read to ``position``, its log end at ``log_end`` (both
    the committed offset unless given: nothing to read)."""
    at = BASE[tp]
    return Received(
        Heartbeat(
            pipeline=PIPE,
            epoch=EPOCH,
            txn="e3_t1",
            sender=participant(tp),
            partitions=(
                PartitionPosition(
                    topic=tp.topic,
                    partition=tp.partition,
                    position=at if position is None else position,
                    log_end=at if log_end is None else log_end,
                    buffered_rows=buffered,
                ),
            ),
        )
    )


def idle_started() -> Driver:
    d = Driver(IDLE)
    d.started(T0)
    assert d.at(T0 + 0.5, beat(P0), beat(P1)) == []
    return d


def test_a_txn_with_nothing_to_read_stays_open_past_the_interval_until_the_idle_interval() -> None:
    d = idle_started()
    assert d.at(T0 + 1.0, Tick()) == []
    assert d.at(T0 + 4.5, beat(P0), beat(P1), Tick()) == []
    assert d.at(T0 + 5.0, Tick()) == [end(1)]


def test_a_record_arriving_in_an_idle_txn_ends_it_at_once() -> None:
    d = idle_started()
    assert d.at(T0 + 2.0, Tick()) == []
    assert d.at(T0 + 2.5, beat(P1, log_end=BASE[P1] + 1)) == [end(1)]


def test_a_record_read_ends_it_even_when_the_log_end_trails_the_position() -> None:
    """The log end a holder reports is its consumer's cached watermark, which can trail what it read."""
    d = idle_started()
    assert d.at(T0 + 2.0, beat(P0, position=BASE[P0] + 3, log_end=BASE[P0])) == [end(1)]


def test_rows_reported_read_in_the_txn_end_it() -> None:
    d = idle_started()
    assert d.at(T0 + 2.0, beat(P0, buffered=1)) == [end(1)]


def test_a_log_end_not_known_counts_as_records() -> None:
    d = idle_started()
    assert d.at(T0 + 1.5, beat(P1, log_end=-1)) == [end(1)]


def test_before_the_interval_a_record_does_not_end_it_early() -> None:
    d = Driver(IDLE)
    d.started(T0)
    assert d.at(T0 + 0.5, beat(P0, log_end=BASE[P0] + 10), beat(P1)) == []
    assert d.at(T0 + 1.0, Tick()) == [end(1)]


def test_with_idle_interval_0_an_idle_txn_ends_at_the_interval() -> None:
    d = Driver(dataclasses.replace(TIMING, idle_interval_s=0.0))
    d.started(T0)
    assert d.at(T0 + 0.5, beat(P0), beat(P1)) == []
    assert d.at(T0 + 1.0, Tick()) == [end(1)]


def test_a_partition_added_ends_it_at_the_interval_so_the_next_start_holds_it() -> None:
    d = idle_started()
    assert d.at(T0 + 0.6, PartitionsChanged((P0, P1, P2), {P2: 7})) == []
    assert d.at(T0 + 1.0, Tick()) == [end(1)]


def test_a_partition_stopped_ends_it_at_the_interval_so_the_next_start_leaves_it_out() -> None:
    """A stopped partition (its topic re-created, its log cut short) is no longer the leader's."""
    d = idle_started()
    assert d.at(T0 + 0.6, PartitionsChanged((P0,), {})) == []
    assert d.at(T0 + 1.0, Tick()) == [end(1)]


def test_the_chunk_sizer_learns_from_what_it_read_since_it_was_last_idle_not_since_its_start() -> None:
    """Kept open 2.5 s past its interval, the txn reads 1,000 rows in its last 0.5 s: 2,000 rows/s,
    not the 333 of its 3 s (chunks of the next START a sixth the size they should be)."""
    d = idle_started()
    assert d.at(T0 + 2.5, Tick()) == []
    assert d.at(T0 + 3.0, beat(P1, position=BASE[P1] + 1_000)) == [end(1)]
    t1 = d.txn(1)
    actions = d.at(T0 + 3.1, ws("e3_t1", P0, BASE[P0], BASE[P0], 0), ws("e3_t1", P1, BASE[P1], BASE[P1] + 1_000, 1_000))
    assert CountStage(t1.id, t1.stage_table) in actions
    assert d.state.flight.sizer.rows_per_s == {P0: 0.0, P1: 2_000.0}
