"""The dead-letter topic as its consumers see it: read ``read_committed``, chtxn's headers parsed.

Letters come back in publish order (commit slot, then source topic, partition, offset) and only
those of the pipeline in ``cfg``. The broker decides what ``read_committed`` hides: a broker that
does not filter aborted transactional records (Tansu, the embedded broker) shows the letters of a
publish that failed half-way too, before they are published again.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition as KafkaTP

from clients import kafka as kafka_clients
from clients.kafka import KafkaClientFactory
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from protocol import naming
from protocol.config.parse import PipelineConfig
from protocol.dead_letters.letters import PublishedLetter, published
from protocol.errors import SetupError
from protocol.messages import TopicPartition


def _order(letter: PublishedLetter) -> tuple:
    return (letter.commit_seq, letter.topic, letter.partition, letter.offset, letter.dlq_partition, letter.dlq_offset)


class DeadLetterReader:
    """Reads the dead-letter topic of ``cfg``; ``close`` when done."""

    def __init__(
        self, cfg: PipelineConfig, *, timeout_s: float = 30.0, kafka: KafkaClientFactory | None = None
    ) -> None:
        self.cfg, self.topic, self.timeout_s = cfg, cfg.dead_letter_topic, timeout_s
        self.consumer: Any = (kafka or KafkaClientFactory(cfg)).consumer(
            **{
                "group.id": naming.dead_letter_reader_group(cfg.name),
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                **CONSUMER_PROPERTIES,  # partition EOF, no offset commits, short fetch waits (log_ends)
            }
        )

    def __enter__(self) -> DeadLetterReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.consumer.close()

    def partitions(self) -> list[int]:
        """The topic's partitions; ``SetupError`` when it does not exist."""
        metadata = kafka_clients.cluster_metadata(self.consumer, self.timeout_s, self.cfg.kafka.bootstrap_servers)
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise SetupError(f"dead-letter topic {self.topic} does not exist: run chtxn init --config <pipeline.toml>")
        return sorted(found.partitions)

    def letters(self, *, limit: int | None = None, from_end: bool = False) -> list[PublishedLetter]:
        """The first ``limit`` letters (all when None), or the last ``limit`` with ``from_end``."""
        found: list[PublishedLetter] = []
        for partition in self.partitions():
            low, high = self._watermarks(partition)
            if from_end and limit is not None:
                found += self._tail(partition, low, high, limit)
            else:
                found += self._read(partition, low, high, limit)
        found.sort(key=_order)
        if limit is None:
            return found
        return found[-limit:] if from_end else found[:limit]

    def at(self, partition: int, offset: int) -> PublishedLetter | None:
        """The letter at ``offset`` of the dead-letter topic's ``partition``, if there is one."""
        low, high = self._watermarks(partition)
        if not low <= offset < high:
            return None
        letters = self._read(partition, offset, high, 1)
        return letters[0] if letters and letters[0].dlq_offset == offset else None

    def find(self, topic: str, partition: int, offset: int) -> list[PublishedLetter]:
        """Every letter of source record ``topic``/``partition``/``offset`` (normally one)."""
        return [x for x in self.letters() if (x.topic, x.partition, x.offset) == (topic, partition, offset)]

    # ---- plumbing -------------------------------------------------------------------------

    def _watermarks(self, partition: int) -> tuple[int, int]:
        """(first offset, log end): the end as ``log_ends`` reads it, right on the embedded broker too."""
        try:
            low, _ = self.consumer.get_watermark_offsets(KafkaTP(self.topic, partition), timeout=self.timeout_s)
        except KafkaException as exc:
            raise kafka_clients.BrokerUnreachable(
                f"cannot read the offsets of {self.topic}-{partition}: {exc}"
            ) from None
        return low, log_ends(self.consumer, [(self.topic, partition)], self.timeout_s)[(self.topic, partition)]

    def _tail(self, partition: int, low: int, high: int, limit: int) -> list[PublishedLetter]:
        """The last ``limit`` letters: read back from the end, further each time (markers take offsets)."""
        step = max(2 * limit, 64)
        while True:
            start = max(low, high - step)
            letters = self._read(partition, start, high, None)
            if len(letters) >= limit or start == low:
                return letters[-limit:]
            step *= 4

    def _read(self, partition: int, start: int, high: int, limit: int | None) -> list[PublishedLetter]:
        """Letters from ``start`` to the end (``read_committed``), at most ``limit``."""
        if start >= high:
            return []
        self.consumer.assign([KafkaTP(self.topic, partition, start)])
        letters: list[PublishedLetter] = []
        deadline = time.monotonic() + self.timeout_s
        try:
            while time.monotonic() < deadline:
                for m in self.consumer.consume(1000, 0.2):
                    error = m.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return letters
                        raise SetupError(f"cannot read {self.topic}-{partition}: {error.str()}")
                    letter = published(m.partition(), m.offset(), m.key(), m.value(), m.headers())
                    if letter is not None and letter.pipeline == self.cfg.name:
                        letters.append(letter)
                        if limit is not None and len(letters) >= limit:
                            return letters
            raise kafka_clients.BrokerUnreachable(
                f"reading {self.topic}-{partition} from offset {start} did not reach its end within {self.timeout_s:g} s"
            )
        finally:
            self.consumer.unassign()


def read_letters(
    cfg: PipelineConfig, *, limit: int | None = None, from_end: bool = False, timeout_s: float = 30.0
) -> list[PublishedLetter]:
    """Letters in the dead-letter topic of ``cfg`` (see ``DeadLetterReader.letters``)."""
    with DeadLetterReader(cfg, timeout_s=timeout_s) as reader:
        return reader.letters(limit=limit, from_end=from_end)


def offsets_of(letters: list[PublishedLetter]) -> dict[TopicPartition, set[int]]:
    found: dict[TopicPartition, set[int]] = {}
    for letter in letters:
        found.setdefault(TopicPartition(topic=letter.topic, partition=letter.partition), set()).add(letter.offset)
    return found
