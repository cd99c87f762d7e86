"""What a dead-letter replay takes and does (``protocol.dead_letters.replay``): the selection, each letter once,
the replay headers, the replay log's records."""

from __future__ import annotations

import pytest

from protocol.dead_letters import replay as dlq_replay
from protocol.dead_letters.letters import PublishedLetter
from protocol.dead_letters.replay import (
    DONE_BEFORE,
    REPLAY,
    SAME_RECORD,
    ReplayRecord,
    Selection,
    decode_record,
    encode_record,
    parse_offsets,
    plan,
    replay_headers,
    to_replay,
)

DLQ = "orders.chtxn-dlq"


def letter(
    dlq_offset: int, offset: int, *, txn: str = "e1_t1", partition: int = 0, topic: str = "orders"
) -> PublishedLetter:
    return PublishedLetter(
        dlq_partition=0,
        dlq_offset=dlq_offset,
        pipeline="p",
        txn=txn,
        commit_seq=1,
        topic=topic,
        partition=partition,
        offset=offset,
        error_code=0,
        error="bad",
        timestamp_ms=0,
        key=b"k%d" % offset,
        value=b"v",
        headers=(("trace", b"t"), ("chtxn.replay.by", b"someone-earlier")),
    )


LETTERS = [letter(0, 4), letter(1, 7, txn="e1_t2"), letter(2, 9, partition=1), letter(3, 12, topic="other")]


@pytest.mark.parametrize(
    ("selection", "offsets"),
    [
        (Selection(everything=True), [4, 7, 9, 12]),
        (Selection(txns=("e1_t2",)), [7]),
        (Selection(txns=("e1_t1", "e1_t2"), topic="orders", partition=0), [4, 7]),
        (Selection(partition=0, first=5, last=None), [7, 12]),
        (Selection(topic="orders", partition=0, first=None, last=6), [4]),
        (Selection(partition=1, first=9, last=9), [9]),
    ],
)
def test_every_condition_given_must_hold(selection: Selection, offsets: list[int]) -> None:
    assert [p.letter.offset for p in plan(LETTERS, selection, {}, dead_letter_topic=DLQ)] == offsets


@pytest.mark.parametrize(("text", "expected"), [("7", (7, 7)), ("5-9", (5, 9)), ("5-", (5, None)), ("-9", (None, 9))])
def test_offsets_are_ranges_with_both_ends_included(text: str, expected: tuple) -> None:
    assert parse_offsets(text) == expected


@pytest.mark.parametrize("text", ["", "-", "9-5", "a-b", "5-x"])
def test_a_bad_offset_range_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--offsets"):
        parse_offsets(text)


def test_without_a_destination_a_letter_goes_back_to_its_source_partition_with_one_the_key_picks() -> None:
    back = plan(LETTERS[2:3], Selection(everything=True), {}, dead_letter_topic=DLQ)
    assert [(p.to_topic, p.to_partition, p.action, p.key) for p in back] == [("orders", 1, REPLAY, f"{DLQ}/0/2")]
    moved = plan(LETTERS[2:3], Selection(everything=True), {}, dead_letter_topic=DLQ, to_topic="retry")
    assert [(p.to_topic, p.to_partition) for p in moved] == [("retry", -1)]


def test_each_letter_and_each_source_record_goes_once() -> None:
    earlier = ReplayRecord(of=f"{DLQ}/0/1", source="orders/0/7", to="orders/0/100", by="a@h", at_ms=1)
    by_source = ReplayRecord(of=f"{DLQ}/0/9", source="orders/1/9", to="retry/2/5", by="b@h", at_ms=2)
    twice = [*LETTERS, letter(4, 4)]  # a second letter of record orders/0/4 (a publish cut short on Tansu)
    done = {earlier.of: earlier, by_source.of: by_source}
    planned = plan(twice, Selection(everything=True), done, dead_letter_topic=DLQ)
    assert [(p.letter.dlq_offset, p.action) for p in planned] == [
        (0, REPLAY),
        (1, DONE_BEFORE),
        (2, DONE_BEFORE),  # its record was replayed from another letter
        (3, REPLAY),
        (4, SAME_RECORD),
    ]
    assert planned[1].record == earlier and planned[2].record == by_source
    assert [p.letter.dlq_offset for p in to_replay(planned)] == [0, 3]


def test_a_replayed_record_keeps_its_headers_and_gets_the_replay_marks() -> None:
    assert replay_headers(LETTERS[0], DLQ, "ops@host") == [
        ("trace", b"t"),  # an earlier replay's marks are replaced, the record's own headers kept
        ("chtxn.replay.of", f"{DLQ}/0/0".encode()),
        ("chtxn.replay.source", b"orders/0/4"),
        ("chtxn.replay.by", b"ops@host"),
    ]


def test_replay_log_records_round_trip_and_garbage_is_skipped() -> None:
    record = ReplayRecord(of=f"{DLQ}/0/1", source="orders/0/7", to="orders/0/100", by="a@h", at_ms=1)
    assert decode_record(encode_record(record)) == record
    assert encode_record(record) == (
        b'{"of":"orders.chtxn-dlq/0/1","source":"orders/0/7","to":"orders/0/100","by":"a@h","at_ms":1}'
    )
    assert decode_record(None) is None and decode_record(b"not json") is None


def test_an_intent_round_trips_and_is_no_replay_record() -> None:
    intent = dlq_replay.ReplayIntent(keys=("d/0/1", "d/0/2"), ends={"orders/0": 40}, by="op", at_ms=5)
    data = dlq_replay.encode_intent(intent)
    assert dlq_replay.decode_intent(data) == intent
    assert dlq_replay.decode_record(data) is None, "a reader of letter records skips an intent"
    assert dlq_replay.decode_intent(None) is None


def test_the_letters_of_an_intent_the_log_lacks_are_in_doubt() -> None:
    intent = dlq_replay.ReplayIntent(keys=("d/0/1", "d/0/2"), ends={}, by="op", at_ms=5)
    logged = {"d/0/1": dlq_replay.ReplayRecord(of="d/0/1", source="o/0/4", to="o/0/50", by="op", at_ms=6)}
    assert dlq_replay.in_doubt(intent, logged) == {"d/0/2"}
    assert dlq_replay.in_doubt(None, logged) == set()


def test_a_record_found_is_settled_only_when_it_replays_a_letter_in_doubt() -> None:
    headers = [
        ("trace", b"t"),
        ("chtxn.replay.of", b"d/0/2"),
        ("chtxn.replay.source", b"o/0/7"),
        ("chtxn.replay.by", b"op"),
    ]
    record = dlq_replay.settled(headers, {"d/0/2"}, topic="o", partition=0, offset=51, at_ms=9)
    assert record == dlq_replay.ReplayRecord(of="d/0/2", source="o/0/7", to="o/0/51", by="op", at_ms=9)
    assert dlq_replay.settled(headers, {"d/0/1"}, topic="o", partition=0, offset=51, at_ms=9) is None
    assert dlq_replay.settled(None, {"d/0/2"}, topic="o", partition=0, offset=51, at_ms=9) is None
