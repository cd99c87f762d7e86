"""Replays chosen dead letters to their source topic or another, each once (``protocol.dead_letters.replay``).

``DeadLetterReplay.plan`` only reads: the letters (``read_committed``) and the replay log. ``execute``
replays, in these steps:

1. Check that every destination topic exists (none is created by producing to it); create the replay
   log, a compacted topic of one partition, if it is missing.
2. ``init_transactions`` with the pipeline's replay ``transactional.id``: a replay still running is
   fenced, and its open Kafka transaction aborted (or, if it was committing, completed).
3. Read the replay log to its end (``read_committed``; after step 2 no replay of this pipeline has a
   transaction open). If letters of its latest intent are missing from it, that batch is in doubt:
   read its destination partitions from the intent's ends, and log every record of such a letter
   found there in one Kafka transaction (``coordinator.dead_letters.replay_doubt``). Then plan: letters the
   log holds, and second letters of one source record, are skipped.
4. Per batch of letters: (a) commit an intent to the log (the batch's letters, each destination
   partition's log end) in a Kafka transaction of its own; (b) one Kafka transaction: the records,
   then (their offsets known from the delivery reports) one replay log record per letter, then
   commit. A failure aborts it (or leaves a commit that timed out to the broker) and raises.

Each letter is visible in its destination once, however the replay is killed and run again: Kafka
hides an aborted batch from ``read_committed`` readers (step 3 finds nothing and the letters go
again); the embedded broker shows it (docs/embedded.md), and step 3 finds its records and logs them.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
from confluent_kafka import KafkaError, KafkaException, TopicPartition as KafkaTP
from confluent_kafka.admin import NewTopic

from clients import kafka as kafka_clients
from clients.failpoints import hit
from clients.kafka import KafkaClientFactory
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.dead_letters.replay_doubt import ends_before, visible_replays
from coordinator.dead_letters.view import DeadLetterReader
from protocol.config.parse import PipelineConfig
from protocol.dead_letters import replay as dlq_replay
from protocol.dead_letters.letters import PublishedLetter
from protocol.dead_letters.replay import Planned, ReplayIntent, ReplayRecord, Selection
from protocol.errors import ChtxnError, SetupError

#: Letters per Kafka transaction.
BATCH = 500


class ReplayError(ChtxnError):
    """A batch of letters failed; the batches before it were replayed. The replay log says which went out."""


class DeadLetterReplay:
    """Replays letters of ``cfg``'s dead-letter topic as ``by``. The constructor does no I/O; ``close``."""

    def __init__(
        self, cfg: PipelineConfig, *, by: str, kafka: KafkaClientFactory | None = None, timeout_s: float = 30.0
    ) -> None:
        self.cfg, self.by, self.timeout_s = cfg, by, timeout_s
        self.kafka = kafka or KafkaClientFactory(cfg)
        self.dead_letter_topic = cfg.dead_letter_topic
        self.log_topic = dlq_replay.replay_log_topic(cfg.dead_letter_topic)
        self._producer: Any = None

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
            self._producer = None

    def __enter__(self) -> DeadLetterReplay:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def plan(self, selection: Selection, to_topic: str = "") -> list[Planned]:
        """What ``execute`` would do now, read without fencing anything."""
        done, intent = self._replayed()
        return dlq_replay.plan(
            self._letters(),
            selection,
            {**done, **self._visible(intent, done)},
            dead_letter_topic=self.dead_letter_topic,
            to_topic=to_topic,
        )

    def execute(self, selection: Selection, to_topic: str = "") -> list[Planned]:
        """Replay the letters ``selection`` takes that were not replayed before; returns every selected
        letter, those replayed now with ``action`` ``REPLAYED`` and their log record."""
        letters = [x for x in self._letters() if selection.matches(x)]
        # Replay step 1: the destinations exist; the replay log exists
        self._check_destinations(sorted({to_topic} if to_topic else {x.topic for x in letters}))
        self._ensure_log()
        # Replay step 2: fence any other replay of this pipeline
        self._start()
        # Replay step 3: the log, read to its end, and a batch in doubt's visible records decide what is left
        logged, intent = self._replayed()
        if found := self._visible(intent, logged):
            self._settle(found)
        planned = dlq_replay.plan(
            letters, selection, {**logged, **found}, dead_letter_topic=self.dead_letter_topic, to_topic=to_topic
        )
        pending = dlq_replay.to_replay(planned)
        done: dict[str, Planned] = {}
        for i in range(0, len(pending), BATCH):
            batch = pending[i : i + BATCH]
            self._intend(batch)  # Replay step 4a: the batch's intent, committed first
            # Replay step 4b: a batch of records and their log records, in one Kafka transaction
            for item in self._replay_batch(batch):
                done[item.key] = item
        return [done.get(p.key, p) if p.action == dlq_replay.REPLAY else p for p in planned]

    # ---- steps ----------------------------------------------------------------------------

    def _letters(self) -> list[PublishedLetter]:
        with DeadLetterReader(self.cfg, timeout_s=self.timeout_s, kafka=self.kafka) as reader:
            return reader.letters()

    def _check_destinations(self, topics: list[str]) -> None:
        forbidden = {self.cfg.control_topic, self.dead_letter_topic, self.log_topic}
        for topic in topics:
            if topic in forbidden:
                raise SetupError(f"cannot replay letters to {topic}: it is one of chtxn's own topics")
        existing = kafka_clients.cluster_metadata(
            self.kafka.admin(), self.timeout_s, self.cfg.kafka.bootstrap_servers
        ).topics
        missing = [t for t in topics if t not in existing]
        if missing:
            raise SetupError(
                f"cannot replay letters to {', '.join(missing)}: no such topic; create it first (replay does not)"
            )

    def _ensure_log(self) -> None:
        admin = self.kafka.admin()
        existing = kafka_clients.cluster_metadata(admin, self.timeout_s, self.cfg.kafka.bootstrap_servers).topics
        if self.log_topic in existing:
            return
        wanted = NewTopic(self.log_topic, num_partitions=1, replication_factor=-1, config={"cleanup.policy": "compact"})
        future = admin.create_topics([wanted], operation_timeout=self.timeout_s)[self.log_topic]
        try:
            future.result(self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # another replay made it first
                raise SetupError(f"cannot create the replay log {self.log_topic}: {exc.args[0].str()}") from None
        deadline = time.monotonic() + self.timeout_s
        while self.log_topic not in kafka_clients.cluster_metadata(admin, self.timeout_s).topics:
            if time.monotonic() > deadline:
                raise SetupError(
                    f"created the replay log {self.log_topic}, but it did not show within {self.timeout_s:g} s"
                )
            time.sleep(0.05)

    def _start(self) -> None:
        producer = self.kafka.producer(
            **{
                "transactional.id": dlq_replay.replay_transactional_id(self.cfg.name),
                "client.id": f"chtxn-dlq-replay-{self.cfg.name}",
                "partitioner": "murmur2_random",  # Java's (and Kafka Connect's) choice of partition by key
            }
        )
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            raise ReplayError(f"cannot start the replay producer: {_reason(exc)}") from None
        self._producer = producer

    def _visible(self, intent: ReplayIntent | None, logged: dict[str, ReplayRecord]) -> dict[str, ReplayRecord]:
        """Records of the latest intent's letters the log lacks that are visible where they went."""
        doubt = dlq_replay.in_doubt(intent, logged)
        if intent is None or not doubt:
            return {}
        return visible_replays(self.kafka, self.cfg.name, intent, doubt, self.timeout_s)

    def _settle(self, found: dict[str, ReplayRecord]) -> None:
        """Log the records of a batch in doubt that are visible, in one Kafka transaction."""
        producer = self._producer
        try:
            producer.begin_transaction()
            for key, record in found.items():
                self._produce(self.log_topic, key.encode(), dlq_replay.encode_record(record), None, None, partition=0)
            hit("replay.before-settle", self.by)
            producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            raise ReplayError(
                f"logging the letters an interrupted replay sent failed: {_reason(exc)}; run the same replay again"
            ) from None

    def _intend(self, batch: list[Planned]) -> None:
        """Replay step 4a: commit the batch's intent to the log (its letters, its destinations' ends)."""
        ends = ends_before(self.kafka, self.cfg.name, {(p.to_topic, p.to_partition) for p in batch}, self.timeout_s)
        intent = ReplayIntent(keys=tuple(p.key for p in batch), ends=ends, by=self.by, at_ms=int(time.time() * 1000))
        producer = self._producer
        try:
            producer.begin_transaction()
            self._produce(
                self.log_topic,
                dlq_replay.INTENT_KEY.encode(),
                dlq_replay.encode_intent(intent),
                None,
                None,
                partition=0,
            )
            producer.commit_transaction(self.timeout_s)
        except KafkaException as exc:
            raise ReplayError(
                f"writing the intent of {len(batch)} letters failed: {_reason(exc)}; run the same replay again"
            ) from None
        hit("replay.after-intent", self.by)

    def _replayed(self) -> tuple[dict[str, ReplayRecord], ReplayIntent | None]:
        """The replay log, key -> its latest record, and its latest intent; empty when the log does not exist yet."""
        consumer = self.kafka.consumer(
            **{
                "group.id": f"{dlq_replay.replay_transactional_id(self.cfg.name)}.reader",
                "isolation.level": "read_committed",
                **CONSUMER_PROPERTIES,
            }
        )
        try:
            existing = kafka_clients.cluster_metadata(consumer, self.timeout_s, self.cfg.kafka.bootstrap_servers)
            if self.log_topic not in existing.topics:
                return {}, None
            end = log_ends(consumer, [(self.log_topic, 0)], self.timeout_s)[(self.log_topic, 0)]
            found: dict[str, ReplayRecord] = {}
            intent: ReplayIntent | None = None
            if end == 0:
                return found, intent
            consumer.assign([KafkaTP(self.log_topic, 0, 0)])
            deadline = time.monotonic() + self.timeout_s
            while time.monotonic() < deadline:
                for m in consumer.consume(1000, 0.1):
                    error, offset = m.error(), m.offset() or 0
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF and offset >= end:
                            return found, intent
                        continue
                    if m.key() == dlq_replay.INTENT_KEY.encode():
                        intent = dlq_replay.decode_intent(m.value()) or intent
                    elif (record := dlq_replay.decode_record(m.value())) is not None:
                        found[record.of] = record
                    if offset >= end - 1:
                        return found, intent
                if consumer.position([KafkaTP(self.log_topic, 0)])[0].offset >= end:
                    return found, intent  # past transaction markers, which hold no record
            raise kafka_clients.BrokerUnreachable(
                f"reading the replay log {self.log_topic} did not reach its end ({end}) within {self.timeout_s:g} s"
            )
        finally:
            consumer.close()

    def _replay_batch(self, batch: list[Planned]) -> list[Planned]:
        producer = self._producer
        offsets: dict[str, tuple[int, int]] = {}
        errors: list[str] = []

        def delivered(key: str):
            def report(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(f"{key}: {error.str()}")
                else:
                    offsets[key] = (message.partition(), message.offset())

            return report

        try:
            producer.begin_transaction()
            for p in batch:
                x = p.letter
                where = {} if p.to_partition < 0 else {"partition": p.to_partition}
                headers = dlq_replay.replay_headers(x, self.dead_letter_topic, self.by)
                self._produce(p.to_topic, x.key, x.value, headers, delivered(p.key), **where)
            if producer.flush(self.timeout_s) > 0 or errors:
                raise ReplayError(f"records not delivered: {'; '.join(errors) or 'timed out'}")
            hit("replay.after-flush", self.by)
            at_ms = int(time.time() * 1000)
            done = []
            for p in batch:
                partition, offset = offsets[p.key]
                record = ReplayRecord(
                    of=p.key,
                    source=dlq_replay.source_key(p.letter),
                    to=f"{p.to_topic}/{partition}/{offset}",
                    by=self.by,
                    at_ms=at_ms,
                )
                self._produce(self.log_topic, p.key.encode(), dlq_replay.encode_record(record), None, None, partition=0)
                done.append(msgspec.structs.replace(p, action=dlq_replay.REPLAYED, record=record))
            hit("replay.before-commit", self.by)
            producer.commit_transaction(self.timeout_s)
        except (KafkaException, ReplayError) as exc:
            why = _reason(exc) if isinstance(exc, KafkaException) else str(exc)
            try:
                producer.abort_transaction(self.timeout_s)
            except KafkaException:
                self._producer = None
            raise ReplayError(
                f"replaying {len(batch)} letters from {batch[0].key} failed: {why}; run the same replay again: "
                "the replay log says which letters went out (those of earlier batches did), and only the others go"
            ) from None
        return done

    def _produce(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Any, on_delivery: Any, **kw: Any
    ) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self._producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery, **kw)
                return
            except BufferError:  # the local queue is full: let it drain
                if time.monotonic() > deadline:
                    raise ReplayError(f"the producer queue stayed full for {self.timeout_s:g} s") from None
                self._producer.poll(0.1)


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
