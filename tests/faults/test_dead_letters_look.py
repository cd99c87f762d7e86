"""The dead-letter publisher looks for a committed slot's letters only when it may hold some.

A txn whose COMMITTED row counts no letters, published by a publisher that has published every
earlier slot, needs no look in the ledger and ``chtxn_dead_letters`` (dead-letter step 3). Every
other call looks: a slot whose publish failed must still go out, in slot order, exactly once.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from clients import failpoints
from clients.failpoints import FailpointError
from coordinator.dead_letters.view import read_letters
from protocol.messages import TopicPartition
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.ledger_writes import commit
from tests.integration.live_pipeline import committed_through, coordinator, good, participants, produce_values
from tests.integration.test_dead_letters_once import letters_pipeline, published, publisher, stage_letters
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

__all__ = ["letters_pipeline"]  # a fixture, used by name

WAIT_S = 90.0


def looks(pipeline: Pipeline) -> int:
    """Dead-letter step 3's looks at this pipeline's ledger, from ClickHouse's query log."""
    client = pipeline.client()
    client.command("SYSTEM FLUSH LOGS")
    return int(
        client.command(
            "SELECT count() FROM system.query_log WHERE type = 'QueryFinish' "
            "AND query LIKE 'SELECT DISTINCT commit_seq, txn FROM %' AND query LIKE {ledger:String}",
            parameters={"ledger": f"%{pipeline.cfg.clickhouse.database}.chtxn_ledger %"},
        )
    )


def test_a_slot_counting_no_letters_is_not_looked_up_once_every_earlier_slot_is_out(letters_pipeline):
    """Slot 1 holds two letters and its first publish fails after the look; slots 2 and 3 count
    none. Slot 2's call still looks (slot 1 is owed) and publishes slot 1's letters; slot 1's retry
    writes nothing; slot 3's call does not look. A skip on the count alone would have let slot 2
    pass over slot 1, whose retry then finds itself at or below the slot published: lost."""
    pipeline = letters_pipeline
    stage_letters(pipeline, "e1_t1", [3, 5])
    commit(pipeline, "e1_t1", 1, 0, 10)
    commit(pipeline, "e1_t2", 2, 10, 20)
    commit(pipeline, "e1_t3", 3, 20, 30)
    pub = publisher(pipeline)
    try:
        failpoints.arm("dead-letters.before-produce", "raise*1")
        with pytest.raises(FailpointError):
            pub.publish("e1_t1", 1, letters=2)
        assert pub.publish("e1_t2", 2, letters=0) == 2, "slot 1 is owed: slot 2's call looks and publishes it"
        assert pub.publish("e1_t1", 1, letters=2) == 0, "slot 1's retry: already out"
        before = looks(pipeline)
        assert pub.publish("e1_t3", 3, letters=0) == 0
        assert looks(pipeline) == before, "through slot 2, slot 3 counting no letters was looked up"
        assert pub.publish("e1_t3", 3) == 0, "a count not known: at or below the slot published, done"
    finally:
        pub.close()
    assert published(pipeline) == [("e1_t1", 1, 3), ("e1_t1", 1, 5)]


def test_bad_records_reach_the_topic_once_when_their_first_publish_fails_and_clean_txns_follow(stack, tmp_path):
    """The real pipeline: the first txn holding letters fails its dead-letter publish once, after the
    look; txns of good records follow (their calls skip the look). Every bad record reaches the
    topic once, the oracle holds, and ``chtxn verify --deep`` agrees."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("dlqlook"), settings={"participant.chunk_rows": 5})
    ends: dict[TopicPartition, int] = {}
    bad: dict[TopicPartition, set[int]] = {}
    for tp in pipeline.partitions:
        values = [good(i) if i % 7 != 3 else b'{"id": %d, "user": "broken' % i for i in range(30)]
        offsets = produce_values(pipeline, tp.partition, values)
        ends[tp] = offsets[-1] + 1
        bad[tp] = {o for o, v in zip(offsets, values) if b"broken" in v}
    failing = failpoints.arm("dead-letters.before-produce", "raise*1")
    with participants(pipeline, tasks=2), coordinator(pipeline):
        wait_until(lambda: committed_through(pipeline, ends), WAIT_S, f"every offset committed up to {ends}")
        wait_until(lambda: pipeline.dead_letter_offsets() == bad, WAIT_S, "every bad record in the dead-letter topic")
        for tp in pipeline.partitions:  # clean txns after the letters
            ends[tp] = produce_values(pipeline, tp.partition, [good(i) for i in range(100, 120)])[-1] + 1
        wait_until(lambda: committed_through(pipeline, ends), WAIT_S, f"every offset committed up to {ends}")
    assert failing.fired == 1, "the first dead-letter publish failed once"
    letters = Counter((x.topic, x.partition, x.offset) for x in read_letters(pipeline.cfg))
    assert set(letters) == {(tp.topic, tp.partition, o) for tp, offsets in bad.items() for o in offsets}
    assert max(letters.values()) == 1, "a bad record reached the dead-letter topic more than once"
    good_rows = sum(30 - len(offsets) + 20 for offsets in bad.values())
    assert_exactly_once(pipeline, good_rows, bad, nothing_lost=True)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout + verified.stderr
