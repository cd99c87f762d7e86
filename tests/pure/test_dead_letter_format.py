"""The dead-letter table's DDL and a letter's headers on the dead-letter topic (read back the same)."""

from __future__ import annotations

from protocol.dead_letters import letters as dead_letters
from protocol.dead_letters.letters import DeadLetter, kafka_headers, published


def letter(**changes: object) -> DeadLetter:
    fields = dict(
        pipeline="orders",
        txn="e2_t7",
        topic="src",
        partition=3,
        offset=41,
        key=b"k",
        value=None,
        headers=(("trace", b"\x00\x01"),),
        timestamp_ms=1_700_000_000_123,
        error="tombstone: null value",
        error_code=0,
    )
    return DeadLetter(**{**fields, **changes})  # type: ignore[arg-type]  # fields of mixed types


def test_the_table_is_ordered_by_txn_and_coordinates_deduplicates_and_expires() -> None:
    ddl = dead_letters.create_table_sql("db")
    assert ddl.startswith("CREATE TABLE IF NOT EXISTS `db`.`chtxn_dead_letters`")
    assert "ORDER BY (pipeline, txn, topic, partition, offset)" in ddl
    assert "non_replicated_deduplication_window = " in ddl and "TTL inserted_at + INTERVAL 30 DAY" in ddl
    assert "ReplicatedMergeTree" in dead_letters.create_table_sql("db", replicated=True)
    assert dead_letters.letters_token("p/e1_t1/src/0/4") == "p/e1_t1/src/0/4/dead-letters"


def test_headers_carry_where_why_and_which_commit_and_read_back_the_same() -> None:
    headers = kafka_headers(letter(), commit_seq=12)
    assert headers[0] == ("trace", b"\x00\x01"), "the record's own headers come first"
    assert dict(headers[1:]) == {
        "chtxn.error": b"tombstone: null value",
        "chtxn.error_code": b"0",
        "chtxn.pipeline": b"orders",
        "chtxn.txn": b"e2_t7",
        "chtxn.commit_seq": b"12",
        "chtxn.topic": b"src",
        "chtxn.partition": b"3",
        "chtxn.offset": b"41",
        "chtxn.timestamp": b"1700000000123",
    }
    back = published(0, 99, b"k", None, headers)
    assert back is not None
    assert (back.dlq_offset, back.txn, back.commit_seq, back.topic, back.partition, back.offset) == (
        99,
        "e2_t7",
        12,
        "src",
        3,
        41,
    )
    assert (back.key, back.value, back.headers, back.error) == (
        b"k",
        None,
        (("trace", b"\x00\x01"),),
        "tombstone: null value",
    )


def test_a_long_error_is_cut_in_its_header_and_foreign_messages_are_not_letters() -> None:
    assert len(dict(kafka_headers(letter(error="x" * 10_000), 1))["chtxn.error"]) == 4096
    assert published(0, 0, b"k", b"v", [("other", b"1")]) is None
    assert published(0, 0, b"k", b"v", None) is None
