"""Dead letters are exactly-once: a letter reaches the dead-letter topic once, and only for a committed txn."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

import pytest
from confluent_kafka import Consumer, TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from coordinator.dead_letters.publisher import (
    DeadLetterPublisher,
    NewerLeader,
    PublisherFenced,
    ensure_table,
)
from coordinator.dead_letters.view import read_letters
from coordinator.leader import Leader
from coordinator.ledger import rows as ledger_rows
from coordinator.ledger.store import LedgerStore
from participant.bad_records import Letter
from participant.dead_letters import DeadLetterSink
from protocol import naming
from protocol.chunking import ChunkBuilder
from protocol.coordinator.events import Counted, CountStage
from protocol.messages import TopicPartition
from tests.helpers import unique_name, wait_until
from tests.integration.ledger_writes import commit
from tests.integration.live_pipeline import (
    committed_through,
    coordinator,
    good,
    participants,
    produce_values,
    task,
)
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec

WAIT_S = 90.0


def aborting_first_txn_with_letters(base: type[Leader]) -> type[Leader]:
    """A leader that aborts (at its count check, step 5) the first txn whose participants reported letters."""

    class AbortFirstTxnWithLetters(base):  # type: ignore[valid-type, misc]  # a base from the parameter
        aborted: ClassVar[list[str]] = []

        def _count_stage(self, action: CountStage) -> Counted:
            txn = self.state.txn(action.txn)
            if not self.aborted and txn is not None and sum(ws.dead_letters for ws in txn.statuses.values()):
                self.aborted.append(action.txn)
                return Counted(action.txn, None, error="injected: abort a txn holding dead letters")
            return super()._count_stage(action)

    return AbortFirstTxnWithLetters


def test_a_bad_record_of_an_aborted_txn_reaches_the_topic_once(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("dlqonce"), settings={"participant.chunk_rows": 5})
    ends: dict[TopicPartition, int] = {}
    bad: set[tuple[str, int, int]] = set()
    for tp in pipeline.partitions:
        values = [good(i) if i % 7 != 3 else b'{"id": %d, "user": "broken' % i for i in range(40)]
        offsets = produce_values(pipeline, tp.partition, values)
        ends[tp] = offsets[-1] + 1
        bad |= {(tp.topic, tp.partition, o) for o, v in zip(offsets, values) if b"broken" in v}

    leader = aborting_first_txn_with_letters(Leader)
    with participants(pipeline, tasks=2), coordinator(pipeline, leader_class=leader):
        wait_until(lambda: committed_through(pipeline, ends), WAIT_S, f"every offset committed up to {ends}")

    assert leader.aborted, "a txn holding dead letters was aborted"
    [aborted] = leader.aborted
    staged = pipeline.client().command(
        f"SELECT count() FROM `{pipeline.cfg.name}`.chtxn_dead_letters WHERE txn = {{t:String}}",
        parameters={"t": aborted},
    )
    assert int(staged) > 0, "the aborted txn had stored letters"
    topic = read_letters(pipeline.cfg)
    letters = Counter((x.topic, x.partition, x.offset) for x in topic)
    assert set(letters) == bad, "every bad record is in the dead-letter topic, nothing else"
    twice = {where: n for where, n in letters.items() if n > 1}
    assert twice == {}, f"{len(twice)} of {len(bad)} bad records reached the dead-letter topic more than once"
    assert aborted not in {x.txn for x in topic}, "no letter of the aborted txn was published"
    assert [x.commit_seq for x in topic] == sorted(x.commit_seq for x in topic) and topic[0].commit_seq > 0
    report = pipeline.oracle(pipeline.dead_letter_offsets())
    assert report.ok, report.anomalies


# ---- the publisher on its own ------------------------------------------------------------------


def stage_letters(pipeline: Pipeline, txn: str, offsets: list[int], partition: int = 0) -> None:
    """Participants' part: the letters of ``offsets`` stored under ``txn`` (one chunk)."""
    records = [Rec(pipeline.topic, partition, o, b'{"broken": %d' % o, b"k%d" % o) for o in offsets]
    builder = ChunkBuilder(
        pipeline=pipeline.cfg.name,
        txn=txn,
        topic=pipeline.topic,
        partition=partition,
        start_offset=offsets[0],
        chunk_rows=1000,
        chunk_bytes=1 << 20,
    )
    builder.add(records)
    sink = DeadLetterSink(pipeline.client(), database=pipeline.cfg.clickhouse.database, pipeline=pipeline.cfg.name)
    sink.write(builder.flush(), [Letter(r, f"malformed JSON at {r.offset()}") for r in records])


def publisher(pipeline: Pipeline, epoch: int = 1) -> DeadLetterPublisher:
    return DeadLetterPublisher(pipeline.cfg, pipeline.client(), pipeline.ledger(), epoch=epoch, timeout_s=15)


def published(pipeline: Pipeline) -> list[tuple[str, int, int]]:
    """(txn, commit slot, source offset) of every letter in the topic, in publish order."""
    return [(x.txn, x.commit_seq, x.offset) for x in read_letters(pipeline.cfg)]


@pytest.fixture
def letters_pipeline(stack, tmp_path) -> Pipeline:
    pipeline = make_pipeline(stack, tmp_path, unique_name("publisher"), partitions=1)
    ensure_table(pipeline.client(), pipeline.cfg.clickhouse.database)
    return pipeline


def test_publishing_a_txn_twice_puts_each_letter_in_the_topic_once(letters_pipeline):
    pipeline = letters_pipeline
    stage_letters(pipeline, "e1_t1", [3, 5])
    commit(pipeline, "e1_t1", 1, 0, 10)
    first = publisher(pipeline)
    try:
        assert first.publish("e1_t1", 1) == 2
        assert first.publish("e1_t1", 1) == 0
    finally:
        first.close()
    again = publisher(pipeline)  # a new leader rolling the same txn forward
    try:
        assert again.publish("e1_t1", 1) == 0
    finally:
        again.close()
    assert published(pipeline) == [("e1_t1", 1, 3), ("e1_t1", 1, 5)]
    letter = read_letters(pipeline.cfg)[0]
    assert (letter.key, letter.value, letter.error) == (b"k3", b'{"broken": 3', "malformed JSON at 3")
    assert (letter.pipeline, letter.topic, letter.partition) == (pipeline.cfg.name, pipeline.topic, 0)


def test_a_new_publisher_fences_the_old_one(letters_pipeline):
    pipeline = letters_pipeline
    for seq, offsets in ((1, [1]), (2, [11]), (3, [21])):
        stage_letters(pipeline, f"e1_t{seq}", offsets)
        commit(pipeline, f"e1_t{seq}", seq, 10 * (seq - 1), 10 * seq)
    assert pipeline.ledger().claim_epoch(1, "old")
    old, new = publisher(pipeline, epoch=1), publisher(pipeline, epoch=2)
    try:
        assert old.publish("e1_t1", 1) == 1
        assert pipeline.ledger().claim_epoch(2, "new")
        assert new.publish("e1_t2", 2) == 1  # the new leader starts: the old one is fenced
        with pytest.raises(NewerLeader, match="epoch 2 leads"):
            old.publish("e1_t3", 3)
        with pytest.raises(NewerLeader, match="for good"):
            old.publish("e1_t3", 3)
        assert published(pipeline) == [("e1_t1", 1, 1), ("e1_t2", 2, 11)], "the fenced publisher wrote nothing visible"
        assert new.publish("e1_t3", 3) == 1
    finally:
        old.close()
        new.close()
    assert published(pipeline) == [("e1_t1", 1, 1), ("e1_t2", 2, 11), ("e1_t3", 3, 21)]


class _LedgerReadBefore:
    """A ledger whose first ``max_epoch`` answers ``epoch``, as it did before a newer epoch was
    claimed: a stale leader that read the ledger, then stalled while a newer leader claimed."""

    def __init__(self, ledger: LedgerStore, epoch: int) -> None:
        self._ledger, self._stale = ledger, [epoch]

    def max_epoch(self) -> int:
        return self._stale.pop() if self._stale else self._ledger.max_epoch()

    def __getattr__(self, name: str) -> object:
        return getattr(self._ledger, name)


def test_a_stale_publisher_initialising_last_never_stops_the_leaders_publisher(letters_pipeline):
    """Issue 29, defect 4: fencing follows the ledger's epochs, not the order of two inits. The
    stale publisher (epoch 1) read the ledger before epoch 2 was claimed, and initialises after
    the leader's publisher (epoch 2): the leader's next publish fences it back and goes out."""
    pipeline = letters_pipeline
    for seq, offsets in ((1, [1]), (2, [11]), (3, [21])):
        stage_letters(pipeline, f"e1_t{seq}", offsets)
        commit(pipeline, f"e1_t{seq}", seq, 10 * (seq - 1), 10 * seq)
    assert pipeline.ledger().claim_epoch(1, "stale") and pipeline.ledger().claim_epoch(2, "leader")
    leader = publisher(pipeline, epoch=2)
    stale = DeadLetterPublisher(
        pipeline.cfg,
        pipeline.client(),
        _LedgerReadBefore(pipeline.ledger(), 1),  # type: ignore[arg-type]  # a scripted stale read
        epoch=1,
        timeout_s=15,
    )
    try:
        assert leader.publish("e1_t1", 1) == 1
        assert stale.publish("e1_t1", 1) == 0  # initialises last: the leader's producer is fenced
        assert leader.publish("e1_t2", 2) == 1, "the leader's publisher initialises again and publishes"
        with pytest.raises(PublisherFenced):
            stale.publish("e1_t3", 3)
        assert leader.publish("e1_t3", 3) == 1
    finally:
        leader.close()
        stale.close()
    assert published(pipeline) == [("e1_t1", 1, 1), ("e1_t2", 2, 11), ("e1_t3", 3, 21)]


def test_letters_are_not_published_again_once_the_marker_expired(letters_pipeline):
    """Issue 29, defect 5: Kafka expires the marker's group offsets after a quiet week; the
    ledger's PUBLISHED rows then say which slots' letters went out."""
    pipeline = letters_pipeline
    stage_letters(pipeline, "e1_t1", [3, 5])
    commit(pipeline, "e1_t1", 1, 0, 10)
    first = publisher(pipeline)
    try:
        assert first.publish("e1_t1", 1) == 2
    finally:
        first.close()
    pipeline.ledger().append(ledger_rows.published_from(pipeline.ledger().commit_at(1), epoch=1, coordinator="test"))
    expire_marker(pipeline)
    stage_letters(pipeline, "e2_t1", [12])
    commit(pipeline, "e2_t1", 2, 10, 20)
    later = publisher(pipeline, epoch=2)  # a new leader after the quiet week
    try:
        assert later.publish("e2_t1", 2) == 1
    finally:
        later.close()
    assert published(pipeline) == [("e1_t1", 1, 3), ("e1_t1", 1, 5), ("e2_t1", 2, 12)]


def expire_marker(pipeline: Pipeline) -> None:
    """What ``offsets.retention.minutes`` does to the marker group, which has no members: its
    committed offsets are gone."""
    admin = AdminClient({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
    group = naming.dead_letter_marker_group(pipeline.cfg.name)
    for future in admin.delete_consumer_groups([group], request_timeout=15).values():
        future.result()
    reader = Consumer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "group.id": group})
    try:
        [tp] = reader.committed([KafkaTP(pipeline.cfg.dead_letter_topic, 0)], timeout=15)
    finally:
        reader.close()
    assert tp.offset < 0, f"the marker is still there: {tp.offset}"


def test_letters_of_a_txn_that_never_commits_never_reach_the_topic(letters_pipeline):
    pipeline = letters_pipeline
    stage_letters(pipeline, "e1_t1", [2])
    stage_letters(pipeline, "e1_t2", [12, 14])  # aborted: never committed
    stage_letters(pipeline, "e1_t3", [12, 14, 30])  # read again; 30 lies past what e1_t3 committed
    commit(pipeline, "e1_t1", 1, 0, 10)
    commit(pipeline, "e1_t3", 2, 10, 20)
    pub = publisher(pipeline)
    try:
        assert pub.publish("e1_t3", 2) == 3, "an unpublished earlier slot goes out first"
        assert pub.publish("e1_t1", 1) == 0
    finally:
        pub.close()
    assert published(pipeline) == [("e1_t1", 1, 2), ("e1_t3", 2, 12), ("e1_t3", 2, 14)]


def test_letters_of_a_txn_aborted_by_a_dead_participant_reach_the_topic_once(stack, tmp_path):
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("dlqkill"),
        settings={
            "participant.chunk_rows": 5,
            "transaction.interval_s": 6.0,
            "transaction.write_status_timeout_s": 30.0,
        },
    )
    tp0, tp1 = pipeline.partitions
    values = [good(i) if i % 7 != 3 else b'{"id": %d, "user": "broken' % i for i in range(40)]
    offsets = produce_values(pipeline, tp0.partition, values)
    bad = {(tp0.topic, tp0.partition, o) for o, v in zip(offsets, values) if b"broken" in v}
    end = produce_values(pipeline, tp1.partition, [good(i) for i in range(10)])[-1] + 1
    ends = {tp0: offsets[-1] + 1, tp1: end}

    def stored() -> dict[str, int]:
        return dict(
            pipeline.client()
            .query(f"SELECT txn, count() FROM `{pipeline.cfg.name}`.chtxn_dead_letters GROUP BY txn")
            .result_rows
        )

    ensure_table(pipeline.client(), pipeline.cfg.clickhouse.database)
    with coordinator(pipeline):
        first, second = task(pipeline, [tp0], "task-0"), task(pipeline, [tp1], "task-1")
        try:
            first_txn = next(iter(wait_until(stored, WAIT_S, "letters stored by an open txn")))
            second.stop()  # its heartbeats stop: the open txn, holding letters, aborts
            wait_until(
                lambda: any(t.txn == first_txn for t in pipeline.ledger().history(limit=100, state="ABORTED")),
                WAIT_S,
                f"{first_txn} aborted for a dead participant",
            )
            second = task(pipeline, [tp1], "task-1")
            wait_until(lambda: committed_through(pipeline, ends), WAIT_S, f"every offset committed up to {ends}")
        finally:
            first.stop()
            second.stop()

    topic = read_letters(pipeline.cfg)
    letters = Counter((x.topic, x.partition, x.offset) for x in topic)
    assert set(letters) == bad and max(letters.values()) == 1, letters
    assert first_txn not in {x.txn for x in topic}, "no letter of the aborted txn was published"
    report = pipeline.oracle(pipeline.dead_letter_offsets())
    assert report.ok, report.anomalies
