"""Records that are not one row: the pre-check, the scan for joined objects, bisection, and memory."""

from __future__ import annotations

import json

import pytest

import participant.bad_records as bad_records
from participant.bad_records import (
    EMPTY,
    TOMBSTONE,
    Letter,
    Remembered,
    has_joins,
    json_problem,
    precheck,
    split_joined,
)
from participant.bisection import TOO_BIG_FOR_MEMORY, Refused, isolate, isolate_refused
from protocol.errors import ClickHouseError
from protocol.framing import frame
from tests.records import Rec

TWO_OBJECTS = [
    b'{"id":1}{"id":2}',
    b'{"id": 3} {"id": 4}',
    b'{"id":5},{"id":6}',
    b'{"id":7}\n{"id":8}',
    b'{"a":{"b":1}}{"c":2}',
]


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
        assert [(letter.record.offset(), letter.error, letter.code) for letter in letters] == [
            (1, TOMBSTONE, 0),
            (2, EMPTY, 0),
        ]
    assert TOMBSTONE.startswith("tombstone: null value") and EMPTY.startswith("empty record: zero-length value")


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b"{", "not a JSON object"),
        (b"  7", "not a JSON object"),
        (b"null", "not a JSON object"),
        (b'{"id": 1} x', "malformed JSON"),
        (b'{"id": 1};', "malformed JSON"),
        (b'{"id": 1, "user": "cut', "malformed JSON"),
    ],
)
def test_a_json_record_that_does_not_start_and_end_as_an_object_is_set_aside(value: bytes, error: str) -> None:
    kept, letters = precheck([good(0), Rec("src", 0, 1, value)], json_objects=True)
    assert [r.offset() for r in kept] == [0]
    assert letters[0].error.startswith(error)


def test_blanks_around_an_object_are_fine() -> None:
    records = [Rec("src", 0, 0, b' {"id": 1}\n'), Rec("src", 0, 1, b'{"id": 2}  ')]
    kept, letters = precheck(records, json_objects=True)
    assert list(kept) == records and letters == []


def test_objects_back_to_back_are_found_by_one_scan_and_set_aside() -> None:
    records = [good(0)] + [Rec("src", 0, i + 1, v) for i, v in enumerate(TWO_OBJECTS)] + [good(9)]
    clean = [good(0), good(9), Rec("src", 0, 10, b'{"a": {"b": {"c": 1}}}')]
    assert not has_joins(frame(clean, "JSONEachRow"), len(clean)), "nested objects are not joins"
    assert has_joins(frame(records, "JSONEachRow"), len(records))
    for bad in TWO_OBJECTS:  # each alone is enough
        assert has_joins(frame([good(0), Rec("src", 0, 1, bad), good(2)], "JSONEachRow"), 3), bad
    kept, letters = split_joined(records)
    assert [r.offset() for r in kept] == [0, 9]
    assert [letter.record.offset() for letter in letters] == [1, 2, 3, 4, 5]
    assert all(letter.error.startswith("not one JSON object but several") and letter.code == 0 for letter in letters)


def test_a_join_inside_a_string_is_a_false_alarm_never_a_letter() -> None:
    records = [good(0), Rec("src", 0, 1, b'{"note": "}{ is not a join"}')]
    body = frame(records, "JSONEachRow")
    assert has_joins(body, 2)
    assert split_joined(records) == (records, [])


def rows_of(values: dict[int, int | None]):  # a probe
    """A probe of a table that keeps nothing: ``values[offset]`` rows per record; None refuses the record
    alone, but two neighbours refused alone make one row together (a JSON string left open)."""
    probes: list[list[int]] = []

    def probe(part) -> int:
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
            rows += values.get(o, 1)  # type: ignore[operator]  # None handled above
            i += 1
        return rows

    probe.calls = probes  # type: ignore[attr-defined]  # the test reads it back
    return probe


def test_bisection_finds_a_record_of_two_rows() -> None:
    letters = isolate([good(o) for o in range(16)], rows_of({5: 2}))
    assert letters == [Letter(good(5), "not one row: ClickHouse made 2 rows of this record", 0)]


def test_bisection_finds_both_records_of_a_pair_that_made_one_row() -> None:
    letters = isolate([good(o) for o in range(16)], rows_of({7: None, 8: None}))
    assert [(letter.record.offset(), letter.code) for letter in letters] == [(7, 27), (8, 27)]
    assert "offset 7" in letters[0].error


def test_errors_that_cancel_out_in_a_part_are_not_seen_by_counting() -> None:
    """The limit of any row count: a record of two rows beside a pair of one row looks sound."""
    assert isolate([good(o) for o in range(16)], rows_of({5: 2, 11: None, 12: None})) == []


def test_bisection_of_a_sound_part_costs_one_probe() -> None:
    probe = rows_of({})
    assert isolate([good(o) for o in range(8)], probe) == []
    assert probe.calls == [list(range(8))]  # type: ignore[attr-defined]  # set by rows_of


def test_remembered_letters_are_dead_lettered_when_read_again() -> None:
    memory = Remembered()
    bad = Rec("src", 0, 3, b"2,b\n3,c", b"k3")
    memory.remember([Letter(bad, "not one row: ClickHouse made 2 rows of this record")])
    assert memory.recall("src", 0, 0, 3) == {} and memory.recall("src", 1, 0, 10) == {}
    assert memory.recall("src", 0, 3, 4)[3].error.startswith("not one row")

    again = [Rec("src", 0, o, b"%d,x" % o, b"k%d" % o) for o in range(3)] + [Rec("src", 0, 3, b"2,b\n3,c", b"k3")]
    kept, letters = precheck(again, json_objects=False, remembered=memory.recall("src", 0, 0, 4))
    assert [r.offset() for r in kept] == [0, 1, 2]
    assert [(letter.record, letter.error) for letter in letters] == [
        (again[3], "not one row: ClickHouse made 2 rows of this record")
    ]


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


# ---- the pre-check never raises --------------------------------------------------------------

#: Past msgspec's recursion limit (about 1,000 levels) and ClickHouse's input_format_json_max_depth.
DEEP_OBJECTS = b'{"id": 1, "nested": ' + b'{"a": ' * 1500 + b"1" + b"}" * 1500 + b"}"
DEEP_ARRAYS = b'{"id": 1, "nested": ' + b"[" * 1500 + b"]" * 1500 + b"}"


@pytest.mark.parametrize(
    "value",
    [
        DEEP_OBJECTS,
        DEEP_ARRAYS,  # RecursionError in msgspec
        b'{"id": 1, "user": "caf\xe9"}',  # UnicodeDecodeError: not UTF-8, ClickHouse stores the bytes
        b'{"id": 1, "amount": 1e999}',
        b'{"id": 1, "amount": -1e400}',
    ],  # ValidationError: past a float
)
def test_json_the_parser_cannot_judge_gives_no_problem(value: bytes) -> None:
    assert json_problem(value) is None


@pytest.mark.parametrize(
    "raised",
    [
        RecursionError("deep"),
        MemoryError(),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"),
        ValueError("odd"),
        OverflowError("big"),
        TypeError("a bug"),
    ],
)
def test_json_problem_never_raises_whatever_the_parser_does(monkeypatch: pytest.MonkeyPatch, raised: Exception) -> None:
    class Failing:
        def decode(self, value: bytes) -> object:
            raise raised

    monkeypatch.setattr(bad_records, "_JSON", Failing())
    assert json_problem(b'{"id": 1}') is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b'{"id": 1, "amount": NaN}', "malformed JSON"),
        (b'{"id": 1,}', "malformed JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"id": 1}', None),
    ],
)
def test_json_problem_still_names_syntax_errors(value: bytes, problem: str | None) -> None:
    found = json_problem(value)
    assert found is None if problem is None else found.startswith(problem)


def test_a_record_nested_too_deep_for_python_passes_the_precheck_and_the_join_scan() -> None:
    records = [good(0), Rec("src", 0, 1, DEEP_OBJECTS), Rec("src", 0, 2, DEEP_ARRAYS), good(3)]
    kept, letters = precheck(records, json_objects=True)
    assert kept is records and letters == []
    joined = [Rec("src", 0, 4, DEEP_OBJECTS + b"{}")]  # a join msgspec cannot see past: ClickHouse judges it
    assert split_joined(joined) == (joined, [])


def test_a_deep_record_cut_short_is_not_an_object_without_raising() -> None:
    cut = Rec("src", 0, 1, b'{"id": 1, "nested": ' + b"[" * 1500)
    kept, letters = precheck([good(0), cut], json_objects=True)
    assert [r.offset() for r in kept] == [0]
    assert [(letter.record.offset(), letter.code) for letter in letters] == [(1, 0)] and letters[0].error.startswith(
        "not a JSON object"
    )


# ---- records ClickHouse refuses: isolate_refused ---------------------------------------------------


class Server:
    """ClickHouse as the stager meets it: ``refuse[offset]`` is the code a record is refused with;
    a part whose values add up past ``memory`` bytes runs out of memory (241), and so does
    every insert while ``short`` (the server's load). ``flaky`` offsets run out of memory once."""

    def __init__(
        self,
        refuse: dict[int, int] | None = None,
        *,
        memory: int | None = None,
        short: bool = False,
        flaky: set[int] | None = None,
        down_after: int | None = None,
    ) -> None:
        self.refuse, self.memory, self.short, self.flaky = refuse or {}, memory, short, set(flaky or ())
        self.down_after = down_after
        self.inserts: list[tuple[list[int], bool]] = []
        self.staged: list[int] = []
        self.controls = 0

    def insert(self, part, retry_memory: bool) -> int:
        offsets = [r.offset() for r in part]
        self.inserts.append((offsets, retry_memory))
        if self.down_after is not None and len(self.inserts) > self.down_after:
            raise ClickHouseError("insert failed after 8 attempts: ConnectionRefusedError", code=0, retryable=True)
        for o in offsets:
            if o in self.refuse:
                raise ClickHouseError(f"ClickHouse error {self.refuse[o]} at offset {o}", code=self.refuse[o])
        flaky = len(part) == 1 and offsets[0] in self.flaky
        self.flaky -= set(offsets) if flaky else set()
        if flaky or self.short or (self.memory is not None and sum(len(r.value()) for r in part) > self.memory):
            raise ClickHouseError("ClickHouse error 241 (MEMORY_LIMIT_EXCEEDED)", code=241, retryable=True)
        self.staged += offsets
        return len(part)

    def has_memory(self) -> bool:
        self.controls += 1
        return not self.short


def refused_by(code: int) -> ClickHouseError:
    return ClickHouseError(f"ClickHouse error {code}: the chunk", code=code, retryable=code == 241)


def malformed(record) -> bool:
    return json_problem(record.value()) is not None


def test_a_refused_chunk_keeps_what_clickhouse_takes_and_letters_what_it_refuses_alone() -> None:
    records = [good(o) for o in range(16)]
    records[3], records[9] = Rec("src", 0, 3, DEEP_OBJECTS), Rec("src", 0, 9, b'{"id": "x"}')
    server = Server({3: 306, 9: 27})
    rows, letters = isolate_refused(records, refused_by(306), server.insert, server.has_memory, suspect=malformed)
    assert rows == 14 and sorted(server.staged) == [o for o in range(16) if o not in (3, 9)]
    assert [(letter.record.offset(), letter.code) for letter in letters] == [(3, 306), (9, 27)]
    assert server.controls == 0, "a DATA refusal needs no control"


def test_what_the_precheck_flags_is_tried_alone_and_clickhouse_decides() -> None:
    """NaN and raw newlines are refused by msgspec, read by ClickHouse: staged, never letters."""
    records = [
        good(0),
        Rec("src", 0, 1, b'{"id": 1, "amount": NaN}'),
        Rec("src", 0, 2, b'{"id": 2,}'),
        good(3),
        Rec("src", 0, 4, b'{"id": 4, "user": "a\nb"}'),
        good(5),
    ]
    server = Server({2: 26})
    rows, letters = isolate_refused(records, refused_by(26), server.insert, server.has_memory, suspect=malformed)
    assert [(letter.record.offset(), letter.code) for letter in letters] == [(2, 26)]
    assert rows == 5 and sorted(server.staged) == [0, 1, 3, 4, 5]
    assert [offsets for offsets, _ in server.inserts] == [[0, 3, 5], [1], [2], [4]], "no bisection of the rest"


def test_a_record_too_big_for_a_querys_memory_is_a_letter_once_it_fails_alone_again() -> None:
    records = [good(o) for o in range(8)]
    records[5] = Rec("src", 0, 5, b'{"id": 5, "user": "' + b"x" * 1000 + b'"}')
    server = Server(memory=500)
    rows, letters = isolate_refused(records, refused_by(241), server.insert, server.has_memory, suspect=malformed)
    assert rows == 7 and sorted(server.staged) == [0, 1, 2, 3, 4, 6, 7]
    [letter] = letters
    assert (letter.record.offset(), letter.code) == (5, 241) and letter.error.startswith(TOO_BIG_FOR_MEMORY)
    assert ([5], True) in server.inserts, "tried alone again with its retries"
    assert all(not retry for offsets, retry in server.inserts if offsets != [5]), "parts split, not retried"


def test_a_chunk_too_big_for_memory_as_a_whole_is_staged_in_parts_without_letters() -> None:
    records = [good(o) for o in range(8)]
    server = Server(memory=3 * len(good(0).value()))
    rows, letters = isolate_refused(records, refused_by(241), server.insert, server.has_memory)
    assert (rows, letters) == (8, []) and sorted(server.staged) == list(range(8))


def test_a_server_short_of_memory_fails_the_chunk_and_letters_nothing() -> None:
    server = Server(short=True)
    with pytest.raises(ClickHouseError) as failed:
        isolate_refused([good(o) for o in range(8)], refused_by(241), server.insert, server.has_memory)
    assert failed.value.code == 241 and server.inserts == [] and server.controls == 1


def test_a_record_that_fails_alone_once_then_goes_in_is_staged() -> None:
    records = [good(o) for o in range(4)]
    server = Server(memory=len(good(0).value()), flaky={2})  # one record per insert, record 2 fails once
    rows, letters = isolate_refused(records, refused_by(241), server.insert, server.has_memory)
    assert (rows, letters) == (4, []) and ([2], True) in server.inserts


def test_memory_gone_while_a_record_is_tried_again_fails_the_chunk() -> None:
    records = [good(0), Rec("src", 0, 1, b'{"id": 1, "user": "' + b"x" * 1000 + b'"}')]
    server = Server(memory=500)
    answers = iter([True, True, False])  # before the split, before the retry alone, after it

    def has_memory() -> bool:
        return next(answers)

    with pytest.raises(ClickHouseError) as failed:
        isolate_refused(records, refused_by(241), server.insert, has_memory)
    assert failed.value.code == 241


@pytest.mark.parametrize("code", [0, 60, 210])
def test_an_outage_during_isolation_fails_the_chunk_and_letters_nothing(code: int) -> None:
    """ClickHouse gone (no code), a table dropped (UNKNOWN_TABLE), the network (NETWORK_ERROR)."""
    records = [good(o) for o in range(8)]
    server = Server({6: 27}, down_after=1)
    if code:
        server.down_after = None
        server.refuse = {**{o: code for o in range(4)}, 6: 27}
    with pytest.raises(ClickHouseError) as failed:
        isolate_refused(records, refused_by(27), server.insert, server.has_memory)
    assert failed.value.code == code
