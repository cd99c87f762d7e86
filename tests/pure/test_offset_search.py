"""protocol.offsets.search: the broker's answer to a look-up by time, checked against the records'
own timestamps, and the search that replaces a wrong one (a log fed as a list, no I/O)."""

from __future__ import annotations

import pytest

from protocol.offsets.search import answer_holds, search


def log_of(records: dict[int, int]):
    """``first_at`` over ``records`` (offset -> timestamp); offsets missing hold no record."""
    offsets = sorted(records)

    def first_at(offset: int):
        for o in offsets:
            if o >= offset:
                return o, records[o]
        return None

    return first_at


LOG = {o: 1000 + 10 * o for o in range(50)}  # offset o at 1000 + 10 o


@pytest.mark.parametrize(
    ("when_ms", "expected"),
    [(0, 0), (1000, 0), (1001, 1), (1250, 25), (1255, 26), (1490, 49), (1491, 50), (99_999, 50)],
)
def test_search_finds_the_first_record_at_or_after_the_time(when_ms, expected):
    first_at = log_of(LOG)
    assert search(first_at, 0, 50, when_ms) == expected
    assert answer_holds(first_at, 0, 50, when_ms, expected)


def test_a_wrong_answer_does_not_hold():
    first_at = log_of(LOG)
    assert not answer_holds(first_at, 0, 50, 1250, 0)  # the embedded broker's answer for any time
    assert not answer_holds(first_at, 0, 50, 1250, 30)  # a record later than needed
    assert not answer_holds(first_at, 0, 50, 99_999, 0)
    assert not answer_holds(first_at, 0, 50, 1250, -1)  # "nothing that late", but there is
    assert answer_holds(first_at, 0, 50, 99_999, -1)


def test_offsets_without_a_record_are_stepped_over():
    records = {o: 1000 + 10 * o for o in range(50) if o % 5 != 4}  # every fifth offset a transaction marker
    first_at = log_of(records)
    assert search(first_at, 0, 50, 1040) == 5  # 4 holds no record
    assert answer_holds(first_at, 0, 50, 1040, 5)
    assert not answer_holds(first_at, 0, 50, 1040, 4)


def test_a_log_that_starts_later_and_long_runs_without_records():
    records = {o: 5000 + o for o in range(200, 210)} | {o: 9000 + o for o in range(400, 410)}
    first_at = log_of(records)
    assert search(first_at, 200, 410, 9000) == 400
    assert not answer_holds(first_at, 200, 410, 9000, 400)  # 190 empty offsets before it: not checked, searched
    assert search(first_at, 200, 410, 4000) == 200
    assert answer_holds(first_at, 200, 410, 4000, 200)
