"""The control reader's decision (``clients.control_reader.Holes``), fed batches of offsets:
records go out in unbroken offset order; at a hole it reads again from the first offset
missing, and gives up on a hole only after ``wait_s``."""

from __future__ import annotations

from clients.control_reader import Holes


def test_records_in_unbroken_order_all_go_out() -> None:
    holes = Holes(expected=10)
    assert holes.take([10, 11, 12], now=0.0) == ([0, 1, 2], None)
    assert holes.take([13], now=0.1) == ([0], None)
    assert holes.expected == 14


def test_without_a_start_the_first_record_read_sets_it() -> None:
    holes = Holes()
    assert holes.take([57, 58], now=0.0) == ([0, 1], None)
    assert holes.expected == 59


def test_at_a_hole_the_records_before_it_go_out_and_reading_starts_again_at_the_hole() -> None:
    """The interleaving seen on the embedded broker: the batch at 7 is served after the one at 9."""
    holes = Holes(expected=5, wait_s=1.0)
    assert holes.take([5, 6, 9, 10], now=0.0) == ([0, 1], 7)
    # read again from 7: the earlier batch is there now, the later records come again
    assert holes.take([7, 8, 9, 10], now=0.05) == ([0, 1, 2, 3], None)
    assert holes.skipped == []
    assert holes.found == 1


def test_records_read_again_after_a_hole_are_not_delivered_twice() -> None:
    holes = Holes(expected=5)
    assert holes.take([5, 6], now=0.0) == ([0, 1], None)
    assert holes.take([5, 6, 7], now=0.1) == ([2], None)


def test_a_hole_that_stays_past_the_wait_is_given_up_on_and_recorded() -> None:
    holes = Holes(expected=3, wait_s=1.0)
    assert holes.take([5], now=0.0) == ([], 3)
    assert holes.take([5, 6], now=0.6) == ([], 3)  # still there: read again
    assert holes.take([5, 6], now=1.0) == ([0, 1], None)
    assert holes.skipped == [(3, 5)]
    assert holes.expected == 7


def test_the_wait_starts_again_for_each_hole() -> None:
    holes = Holes(expected=0, wait_s=1.0)
    assert holes.take([1], now=0.0) == ([], 0)
    assert holes.take([0, 1, 3], now=0.5) == ([0, 1], 2)  # 0 came; a new hole at 2
    assert holes.take([3], now=1.2) == ([], 2)  # 0.7 s into the hole at 2
    assert holes.take([2, 3], now=1.3) == ([0, 1], None)
    assert holes.skipped == []
    assert holes.found == 2
