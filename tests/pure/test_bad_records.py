"""Records that are not one row: the pre-check, the scan for joined objects, bisection, and memory."""

from __future__ import annotations

import json

import pytest

from participant.bad_records import (
    EMPTY, TOMBSTONE, Letter, Refused, Remembered, has_joins, isolate, precheck, split_joined,
)
from protocol.chunking import BodyBuilder
from tests.pure.test_chunking import Rec

TWO_OBJECTS = [b'{"id":1}{"id":2}', b'{"id": 3} {"id": 4}', b'{"id":5},{"id":6}', b'{"id":7}\n{"id":8}',
               b'{"a":{"b":1}}{"c":2}']


def good(o: int) -> Rec:
    return Rec("src", 0, o, json.dumps({"id": o, "note": "x"}).encode(), b"k%d" % o)


def test_a_clean_chunk_passes_untouched() -> None:
    records = [good(o) for o in range(5)]
    kept, letters = precheck(records, json_objects=True)
    assert kept is records and letters == []


def test_a_tombstone_and_an_empty_value_get_distinct_errors() -> None:
    records = [good(0), Rec("src", 0, 1, None, b"deleted-key"), Rec("src", 0, 2, b""), good(3)]
    for json_objects in (True, False):
        kept, letters = precheck(records, json_objects=json_objects)
        assert [r.offset() for r in kept] == [0, 3]
        assert [(l.record.offset(), l.error, l.code) for l in letters] == [(1, TOMBSTONE, 0), (2, EMPTY, 0)]
    assert TOMBSTONE.startswith("tombstone: null value") and EMPTY.startswith("empty record: zero-length value")


@pytest.mark.parametrize(
    ("value", "error"),
    [(b"[1, 2]", "not a JSON object"), (b"{", "not a JSON object"), (b"  7", "not a JSON object"),
     (b"null", "not a JSON object"), (b'{"id": 1} x', "malformed JSON"), (b'{"id": 1};', "malformed JSON"),
     (b'{"id": 1, "user": "cut', "malformed JSON")],
)
def test_a_json_record_that_does_not_start_and_end_as_an_object_is_set_aside(value: bytes, error: str) -> None:
    kept, letters = precheck([good(0), Rec("src", 0, 1, value)], json_objects=True)
    assert [r.offset() for r in kept] == [0]
    assert letters[0].error.startswith(error)


def test_blanks_around_an_object_are_fine() -> None:
    records = [Rec("src", 0, 0, b' {"id": 1}\n'), Rec("src", 0, 1, b'{"id": 2}  ')]
    kept, letters = precheck(records, json_objects=True)
    assert list(kept) == records and letters == []


@pytest.mark.parametrize("columns", [(), ("_topic", "_partition", "_offset")])
def test_objects_back_to_back_are_found_by_one_scan_and_set_aside(columns: tuple[str, ...]) -> None:
    records = [good(0)] + [Rec("src", 0, i + 1, v) for i, v in enumerate(TWO_OBJECTS)] + [good(9)]
    bodies = BodyBuilder(topic="src", partition=0, input_format="JSONEachRow", columns=columns)
    clean = [good(0), good(9), Rec("src", 0, 10, b'{"a": {"b": {"c": 1}}}')]
    assert not has_joins(bodies.body(clean), len(clean)), "nested objects are not joins"
    assert has_joins(bodies.body(records), len(records))
    for bad in TWO_OBJECTS:  # each alone is enough
        assert has_joins(bodies.body([good(0), Rec("src", 0, 1, bad), good(2)]), 3), bad
    kept, letters = split_joined(records)
    assert [r.offset() for r in kept] == [0, 9]
    assert [l.record.offset() for l in letters] == [1, 2, 3, 4, 5]
    assert all(l.error.startswith("not one JSON object but several") and l.code == 0 for l in letters)


def test_a_join_inside_a_string_is_a_false_alarm_never_a_letter() -> None:
    records = [good(0), Rec("src", 0, 1, b'{"note": "}{ is not a join"}')]
    body = BodyBuilder(topic="src", partition=0, input_format="JSONEachRow").body(records)
    assert has_joins(body, 2)
    assert split_joined(records) == (records, [])


def rows_of(values: dict[int, int | None]):  # noqa: ANN201 - a probe
    """A probe of a table that keeps nothing: ``values[offset]`` rows per record; None refuses the record
    alone, but two neighbours refused alone make one row together (a JSON string left open)."""
    probes: list[list[int]] = []

    def probe(part) -> int:  # noqa: ANN001
        offsets = [r.offset() for r in part]
        probes.append(offsets)
        rows = 0
        i = 0
        while i < len(offsets):
            o = offsets[i]
            if values.get(o, 1) is None:
                if i + 1 < len(offsets) and values.get(offsets[i + 1], 1) is None:
                    rows += 1
                    i += 2
                    continue
                raise Refused(f"Cannot parse input at offset {o}", code=27)
            rows += values.get(o, 1)  # type: ignore[operator]
            i += 1
        return rows

    probe.calls = probes  # type: ignore[attr-defined]
    return probe


def test_bisection_finds_a_record_of_two_rows() -> None:
    letters = isolate([good(o) for o in range(16)], rows_of({5: 2}))
    assert letters == [Letter(good(5), "not one row: ClickHouse made 2 rows of this record", 0)]


def test_bisection_finds_both_records_of_a_pair_that_made_one_row() -> None:
    letters = isolate([good(o) for o in range(16)], rows_of({7: None, 8: None}))
    assert [(l.record.offset(), l.code) for l in letters] == [(7, 27), (8, 27)]
    assert "offset 7" in letters[0].error


def test_errors_that_cancel_out_in_a_part_are_not_seen_by_counting() -> None:
    """The limit of any row count: a record of two rows beside a pair of one row looks sound."""
    assert isolate([good(o) for o in range(16)], rows_of({5: 2, 11: None, 12: None})) == []


def test_bisection_of_a_sound_part_costs_one_probe() -> None:
    probe = rows_of({})
    assert isolate([good(o) for o in range(8)], probe) == []
    assert probe.calls == [list(range(8))]  # type: ignore[attr-defined]


def test_remembered_letters_are_dead_lettered_when_read_again() -> None:
    memory = Remembered()
    bad = Rec("src", 0, 3, b"2,b\n3,c", b"k3")
    memory.remember([Letter(bad, "not one row: ClickHouse made 2 rows of this record")])
    assert memory.recall("src", 0, 0, 3) == {} and memory.recall("src", 1, 0, 10) == {}
    assert memory.recall("src", 0, 3, 4)[3].error.startswith("not one row")

    again = [Rec("src", 0, o, b"%d,x" % o, b"k%d" % o) for o in range(3)] + [Rec("src", 0, 3, b"2,b\n3,c", b"k3")]
    kept, letters = precheck(again, json_objects=False, remembered=memory.recall("src", 0, 0, 4))
    assert [r.offset() for r in kept] == [0, 1, 2]
    assert [(l.record, l.error) for l in letters] == [(again[3], "not one row: ClickHouse made 2 rows of this record")]


def test_a_remembered_offset_with_other_content_is_not_taken_for_it() -> None:
    memory = Remembered()
    memory.remember([Letter(Rec("src", 0, 3, b"2,b\n3,c"), "not one row")])
    recreated = [Rec("src", 0, 3, b"9,z")]  # the topic was deleted and created again
    kept, letters = precheck(recreated, json_objects=False, remembered=memory.recall("src", 0, 0, 4))
    assert list(kept) == recreated and letters == []


def test_memory_is_bounded_and_forgets_the_oldest_first() -> None:
    memory = Remembered(capacity=3)
    memory.remember(Letter(Rec("src", 0, o, b"x"), "bad") for o in range(5))
    assert len(memory) == 3
    assert sorted(memory.recall("src", 0, 0, 100)) == [2, 3, 4]
    assert memory.recall("src", 0, 0, 2) == {}


def test_values_whose_newlines_line_up_like_record_boundaries_are_still_checked_one_by_one() -> None:
    # Joined, these read "{a}\n{b\n}": starts with "{", ends with "}", one "}\n{" for two records.
    records = [Rec("src", 0, 0, b'{"a":1}\n{"b":2'), Rec("src", 0, 1, b"}"), good(2)]
    kept, letters = precheck(records, json_objects=True)
    assert [r.offset() for r in kept] == [2]
    assert [letter.record.offset() for letter in letters] == [0, 1]
