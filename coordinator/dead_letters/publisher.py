"""Publishes the dead letters of committed txns to the dead-letter topic, exactly once.

``DeadLetterPublisher.publish(txn, commit_seq)`` is called by the leader of epoch ``epoch`` once
txn ``txn`` owns commit slot ``commit_seq`` (after its data is in the target, before its PUBLISHED
row; and by a new leader rolling a committed txn forward). Dead-letter steps:

1. On first use, unless the ledger names a newer epoch (then ``NewerLeader``), ``init_transactions``
   with ``transactional.id = <pipeline>.chtxn-dlq``: any other publisher is fenced and its open
   Kafka transaction aborted. Then read the marker, the committed offset of group
   ``<pipeline>.chtxn-dlq`` on partition 0 of the dead-letter topic: every slot up to it is
   published. (The marker may be gone: Kafka expires the offsets of a group without members
   after ``offsets.retention.minutes``; it then reads as 0, and dead-letter step 3's ledger check decides.)
2. At or below the marker: done. Also done when this instance has published every slot before
   ``commit_seq`` and the txn's COMMITTED row counts no letters (``letters=0``): nothing is owed, so
   the slot passes without step 3's look (the marker moves with the next letters, as in step 4).
   The count is the sum of the txn's WRITE-STATUS ``dead_letters``, and a participant stores a
   chunk's letters before its chunk counts as staged, so every letter inside the ranges the txn
   committed is counted. A slot owed from an earlier failed publish keeps the next calls looking.
3. Find the committed txns of slots (marker, ``commit_seq``] that hold letters and have no
   PUBLISHED ledger row (a PUBLISHED row is written only after the txn's letters went out), so
   that the letters of an earlier slot whose publish failed go out now, in slot order; read their
   letters from ``chtxn_dead_letters``, keeping those inside the offset ranges the txn committed.
4. No letters: done (the marker moves with the next letters; this instance remembers the slot).
5. One Kafka transaction: produce the letters, ``send_offsets_to_transaction`` the marker =
   ``commit_seq``, commit. Letters and marker become visible together or not at all.

Fencing follows the ledger's epochs, never the order of two ``init_transactions``: a publisher
fenced by another one's init looks at the ledger on its next call; while no newer epoch is
claimed it initialises again (fencing the other, whose open transaction is aborted) and
re-reads the marker; once a newer epoch is claimed it raises ``NewerLeader`` for good.

Letters of a txn that never commits are never read, so never published. Failures raise
``DeadLetterPublishError`` (the Kafka transaction is aborted; call again later: publishing is
idempotent), ``PublisherFenced`` (another publisher initialised since; the next call decides by
the ledger) or ``NewerLeader`` (this publisher's leader is stale: it must step down).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition as KafkaTP

from clients import failpoints
from clients.clickhouse import retrying
from clients.kafka import KafkaClientFactory
from coordinator.ledger.store import LedgerStore
from protocol import naming
from protocol.chcodes import UNKNOWN_TABLE
from protocol.config.parse import PipelineConfig
from protocol.dead_letters import letters as dead_letters
from protocol.dead_letters.letters import DeadLetter
from protocol.errors import ChtxnError, ClickHouseError
from protocol.ledger.rows import LedgerRow

log = logging.getLogger(__name__)

_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


class DeadLetterPublishError(ChtxnError):
    """Letters were not published; nothing of this attempt is visible (read_committed). Retry later."""


class PublisherFenced(DeadLetterPublishError):
    """Another publisher with the same ``transactional.id`` initialised since this one did."""


class NewerLeader(PublisherFenced):
    """The ledger names a newer epoch than this publisher's leader: it must not publish again."""


def ensure_table(client: Any, database: str, *, replicated: bool = False, cluster: str = "", attempts: int = 8) -> None:
    """Create ``<database>.chtxn_dead_letters`` if it is missing (idempotent), on every server of
    ``cluster`` when given (``clickhouse.cluster``)."""
    retrying(attempts, f"create {dead_letters.qualified(database)}")(
        client.command, dead_letters.create_table_sql(database, replicated=replicated, cluster=cluster)
    )


class DeadLetterPublisher:
    """Publishes letters for one leader. The constructor does no I/O; ``close`` when done."""

    def __init__(
        self,
        cfg: PipelineConfig,
        client: Any,
        ledger: LedgerStore,
        *,
        epoch: int,
        timeout_s: float = 30.0,
        retries: int = 8,
        kafka: KafkaClientFactory | None = None,
    ) -> None:
        self.cfg, self.client, self.ledger, self.epoch = cfg, client, ledger, epoch
        self.kafka = kafka or KafkaClientFactory(cfg)
        self.topic = cfg.dead_letter_topic
        self.timeout_s, self.retries = timeout_s, retries
        self._producer: Any = None
        self._marker_reader: Any = None
        self._through: int | None = None  # every slot up to this one is published (None: read the marker)
        self._newer: int | None = None  # a newer epoch the ledger named: fenced for good

    def publish(self, txn: str, commit_seq: int, *, letters: int | None = None) -> int:
        """Publish the letters of ``txn`` (slot ``commit_seq``) and of earlier unpublished slots;
        returns how many letters went out now (0 when already done or none). ``letters``: how many
        the txn's COMMITTED row counts (None: not known). Fenced by another publisher while the
        ledger names no newer epoch, it initialises again and retries once."""
        try:
            return self._publish(txn, commit_seq, letters)
        except NewerLeader:
            raise
        except PublisherFenced as exc:
            log.warning("dead-letter publisher fenced; asking the ledger who leads", extra={"error": str(exc)})
            return self._publish(txn, commit_seq, letters)

    def _publish(self, txn: str, commit_seq: int, letters_counted: int | None) -> int:
        if self._newer is not None:
            raise NewerLeader(
                f"the dead-letter publisher of {self.cfg.name} (epoch {self.epoch}) stopped for good: "
                f"epoch {self._newer} leads"
            )
        # Dead-letter step 1: start (fencing any other publisher), read the marker
        self._start()
        if self._through is None:
            self._through = self._read_marker()
        # Dead-letter step 2: at or below the marker, done
        if commit_seq <= self._through:
            return 0
        if letters_counted == 0 and commit_seq == self._through + 1:  # Dead-letter step 2: nothing owed
            self._through = commit_seq
            return 0
        # Dead-letter step 3: the letters of the unpublished committed slots up to this one
        slots = self._committed_with_letters(self._through, commit_seq, txn)
        letters = [(seq, letter) for seq, row in slots for letter in self._letters_of(row)]
        if not letters:  # Dead-letter step 4: no letters, done
            self._through = commit_seq
            return 0
        failpoints.hit("dead-letters.before-produce", self.cfg.coordinator_id)
        self._produce(letters, commit_seq)  # Dead-letter step 5: letters and marker in one Kafka transaction
        self._through = commit_seq
        log.info("published %d dead letters", len(letters), extra={"txn": txn, "commit_seq": commit_seq})
        return len(letters)

    def close(self) -> None:
        for client in (self._marker_reader,):
            if client is not None:
                client.close()
        if self._producer is not None:
            self._producer.flush(self.timeout_s)
        self._producer = self._marker_reader = None

    # ---- steps ----------------------------------------------------------------------------

    def _start(self) -> None:
        if self._producer is not None:
            return
        cfg = self.cfg
        newest = self.ledger.max_epoch()
        if newest > self.epoch:  # never fence a newer leader's publisher
            self._newer = newest
            raise NewerLeader(
                f"the dead-letter publisher of {cfg.name} (epoch {self.epoch}) does not start: epoch {newest} leads"
            )
        producer = self.kafka.producer(
            **{
                "transactional.id": naming.dead_letter_transactional_id(cfg.name),
                "client.id": f"chtxn-dlq-{cfg.coordinator_id}",
            }
        )
        try:
            producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            raise DeadLetterPublishError(
                f"cannot start the dead-letter publisher of {cfg.name}: {_reason(exc)}"
            ) from None
        self._producer = producer
        if self._marker_reader is None:
            self._marker_reader = self.kafka.consumer(
                **{
                    "group.id": naming.dead_letter_marker_group(cfg.name),
                    "isolation.level": "read_committed",
                }
            )
        self._through = None

    def _read_marker(self) -> int:
        try:
            [tp] = self._marker_reader.committed([KafkaTP(self.topic, 0)], timeout=self.timeout_s)
        except KafkaException as exc:
            raise DeadLetterPublishError(
                f"cannot read the dead-letter marker of {self.cfg.name}: {_reason(exc)}"
            ) from None
        if tp.error is not None:
            raise DeadLetterPublishError(f"cannot read the dead-letter marker of {self.cfg.name}: {tp.error}")
        return max(0, tp.offset)  # no commit yet: OFFSET_INVALID (-1001)

    def _committed_with_letters(self, after: int, upto: int, txn: str) -> list[tuple[int, LedgerRow]]:
        """(slot, resolved COMMITTED row) of the slots in (after, upto] whose txn holds letters."""
        try:
            rows = self._query(
                "find unpublished committed txns holding dead letters",
                dead_letters.committed_with_letters_sql(self.cfg.clickhouse.database),
                after=after,
                upto=upto,
            )
        except ClickHouseError as exc:
            if exc.code == UNKNOWN_TABLE:  # no letter was ever stored
                return []
            raise DeadLetterPublishError(f"cannot read the ledger and dead letters: {exc}") from None
        listed: dict[int, set[str]] = {}
        for seq, listed_txn in rows:
            listed.setdefault(int(seq), set()).add(listed_txn)
        found: list[tuple[int, LedgerRow]] = []
        for seq in sorted(listed):
            winner = self.ledger.commit_at(seq)
            if winner is None or winner.txn not in listed[seq]:
                continue  # the slot went to another txn (possible only past the dedup window)
            if seq == upto and winner.txn != txn:
                raise DeadLetterPublishError(f"commit slot {upto} belongs to {winner.txn}, not to {txn}")
            found.append((seq, winner))
        return found

    def _letters_of(self, row: LedgerRow) -> list[DeadLetter]:
        ranges = {(r.topic, r.partition): (r.start, r.end) for r in row.ranges}
        rows = self._query(
            f"read the dead letters of {row.txn}",
            dead_letters.letters_sql(self.cfg.clickhouse.database),
            binary=True,
            txns=[row.txn],
        )
        letters = [dead_letters.from_result_row(r) for r in rows]
        return [
            letter
            for letter in letters
            if (span := ranges.get((letter.topic, letter.partition))) and span[0] <= letter.offset < span[1]
        ]

    def _produce(self, letters: list[tuple[int, DeadLetter]], commit_seq: int) -> None:
        producer = self._producer
        try:
            producer.begin_transaction()
            deadline = time.monotonic() + self.timeout_s
            for seq, letter in letters:
                headers = dead_letters.kafka_headers(letter, seq)
                while True:
                    try:
                        producer.produce(self.topic, key=letter.key, value=letter.value, headers=headers)
                        break
                    except BufferError:  # the local queue is full: let it drain
                        if time.monotonic() > deadline:
                            raise DeadLetterPublishError(
                                f"the producer queue stayed full for {self.timeout_s:g} s"
                            ) from None
                        producer.poll(0.1)
            marker = [KafkaTP(self.topic, 0, commit_seq)]
            producer.send_offsets_to_transaction(marker, self._marker_reader.consumer_group_metadata(), self.timeout_s)
            producer.commit_transaction(self.timeout_s)
        except (KafkaException, DeadLetterPublishError) as exc:
            self._through = None  # the outcome may be unknown: read the marker again
            raise self._failed(exc, commit_seq, len(letters)) from None

    def _failed(self, exc: Exception, commit_seq: int, count: int) -> DeadLetterPublishError:
        error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        if isinstance(error, KafkaError) and (error.fatal() or error.code() in _FENCED):
            self._producer = None  # unusable: the next call makes a new one (dead-letter step 1 asks the ledger first)
            if error.code() in _FENCED:
                return PublisherFenced(
                    f"dead-letter publisher of {self.cfg.name} (epoch {self.epoch}) fenced by "
                    f"another publisher: {error.str()}; the next publish asks the ledger who leads"
                )
            return DeadLetterPublishError(
                f"dead-letter producer failed for good ({error.str()}); a new one is made next time"
            )
        try:
            self._producer.abort_transaction(self.timeout_s)
        except KafkaException as abort:
            log.warning("could not abort the dead-letter transaction", extra={"error": _reason(abort)})
            self._producer = None
        why = _reason(exc) if isinstance(exc, KafkaException) else str(exc)
        return DeadLetterPublishError(
            f"cannot publish {count} dead letters up to commit slot {commit_seq} to {self.topic}: {why}; "
            "nothing of this attempt is visible, the next publish sends them"
        )

    def _query(self, what: str, sql: str, *, binary: bool = False, **params: Any) -> list[tuple]:
        """Rows of ``sql``; with ``binary``, String columns come back as bytes (keys, values, headers)."""
        parameters = {"pipeline": self.cfg.name, **params}
        result = retrying(self.retries, what)(
            self.client.query, sql, parameters=parameters, query_formats={"String": "bytes"} if binary else None
        )
        return list(result.result_rows)


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
