"""The leader's check that each source partition's log is still the one the ledger's offsets count in
(``protocol.offsets.partition_logs`` says when it is not): it records each topic's identity the first time
the pipeline sees it and again after an offset reset, stops a partition whose log no longer matches
(a ``STOPPED`` row), and tells which partitions are stopped. ``chtxn status`` and ``chtxn doctor``
read the stops through ``stops``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from clients.kafka import BrokerUnreachable, KafkaClientFactory
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.ledger.store import LedgerStore
from protocol.config.parse import PipelineConfig
from protocol.ledger import rows as ledger
from protocol.messages import TopicPartition
from protocol.offsets import partition_logs
from protocol.offsets.partition_logs import Accepted, Seen, Stop

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 10.0


def records(store: LedgerStore) -> list[ledger.LedgerRow]:
    """Every ``TOPIC`` and ``STOPPED`` row of the pipeline."""
    sql = partition_logs.rows_sql(store._database)
    return [ledger.from_result_row(r) for r in store._query("read the partition logs' records", sql)]


def stops(store: LedgerStore) -> dict[TopicPartition, Stop]:
    """The partitions stopped now (not read until ``chtxn reset``)."""
    return partition_logs.stops_of(records(store))


class PartitionLogs:
    """Checks the logs of the partitions of ``cfg`` for the leader of ``epoch``; ``admin`` is an admin
    client, ``kafka`` makes the consumer that reads log ends. The constructor does no I/O."""

    def __init__(
        self,
        cfg: PipelineConfig,
        admin: Any,
        store: LedgerStore,
        *,
        epoch: int,
        coordinator: str,
        kafka: KafkaClientFactory | None = None,
    ) -> None:
        self.cfg, self.store, self.epoch, self.coordinator = cfg, store, epoch, coordinator
        self._admin = admin
        self._kafka = kafka or KafkaClientFactory(cfg)
        #: Topic -> the topic IDs the ledger holds for its partitions read now (as of the last check).
        self._ids: dict[str, set[str]] = {}

    def check(self, offsets: Mapping[TopicPartition, int], head_seq: int) -> dict[TopicPartition, Stop]:
        """The partitions of ``offsets`` (each with the offset its next txn starts from) that are
        stopped: stopped before, or whose log no longer matches now (recorded as stopped here, once).
        Records the identity of topics seen for the first time, and of partitions reset since their
        identity was recorded. A topic the broker does not show now is judged at the next check."""
        rows = records(self.store)
        accepted = partition_logs.accepted_of(rows)
        stopped = {tp: s for tp, s in partition_logs.stops_of(rows).items() if tp in offsets}
        seen = self.seen(offsets)
        fresh = self._record(self._new_or_reset(offsets, seen, accepted, head_seq), seen)
        accepted.update(fresh)
        ids: dict[str, set[str]] = {}
        for tp in offsets:
            if tp in accepted and accepted[tp].topic_id and tp not in stopped:
                ids.setdefault(tp.topic, set()).add(accepted[tp].topic_id)
        for tp, offset in sorted(offsets.items()):
            if tp in stopped or tp not in seen:
                continue
            why = partition_logs.mismatches(offset, seen[tp], accepted.get(tp))
            if why:
                stop = Stop(tp=tp, offset=offset, slot=head_seq, reason="; ".join(why))
                row = partition_logs.stop_row(
                    pipeline=self.cfg.name, stop=stop, seen=seen[tp], epoch=self.epoch, coordinator=self.coordinator
                )
                self.store.append(row)
                log.error("partition stopped: %s", stop.message(), extra={"topic": tp.topic, "partition": tp.partition})
                stopped[tp] = stop
                ids.pop(tp.topic, None)
        self._ids = ids
        return stopped

    def changed(self) -> str:
        """Why the records of a txn may not all come from the logs the ledger holds (a topic read now
        was deleted and created again since the last check); "" when they do. Commit step 5 asks,
        so no record of a re-created topic is committed before its partitions are stopped. A topic
        the broker does not show now (deleted) is not judged: what was read came from its old log."""
        ids = self._ids
        try:
            now = self.topic_ids(sorted(ids))
        except BrokerUnreachable as exc:  # judged at the next check; the last one stands meanwhile
            log.warning("could not check the source topics' identity", extra={"error": str(exc)})
            return ""
        for topic, held in sorted(ids.items()):
            if now.get(topic) and {now[topic]} != held:
                return (
                    f"topic {topic} was deleted and created again while the txn read it (topic ID "
                    f"{', '.join(sorted(held))} in the ledger, {now[topic]} now): its partitions are stopped"
                )
        return ""

    def _new_or_reset(
        self,
        offsets: Mapping[TopicPartition, int],
        seen: Mapping[TopicPartition, Seen],
        accepted: Mapping[TopicPartition, Accepted],
        head_seq: int,
    ) -> dict[TopicPartition, tuple[int, str]]:
        """Partitions whose log identity is to be recorded now: (slot, why) of each."""
        todo = {tp: (head_seq, "first seen") for tp in offsets if tp in seen and tp not in accepted}
        known = [a.slot for tp, a in accepted.items() if tp in offsets]
        if not known:
            return todo
        sql = partition_logs.resets_sql(self.store._database)
        for r in self.store._query("read the offset resets", sql, after=min(known)):
            row = ledger.from_result_row(r)
            for g in row.ranges:
                if g.tp in seen and g.tp in accepted and accepted[g.tp].slot < row.commit_seq:
                    todo[g.tp] = (row.commit_seq, f"offset reset in slot {row.commit_seq} by {row.coordinator}")
        return todo

    def _record(
        self, todo: Mapping[TopicPartition, tuple[int, str]], seen: Mapping[TopicPartition, Seen]
    ) -> dict[TopicPartition, Accepted]:
        groups: dict[tuple[str, int, str], dict[int, Seen]] = {}
        for tp, (slot, why) in todo.items():
            groups.setdefault((tp.topic, slot, why), {})[tp.partition] = seen[tp]
        fresh: dict[TopicPartition, Accepted] = {}
        for (topic, slot, why), logs in sorted(groups.items()):
            row = partition_logs.identity_row(
                pipeline=self.cfg.name,
                topic=topic,
                seen=logs,
                slot=slot,
                epoch=self.epoch,
                coordinator=self.coordinator,
                reason=why,
            )
            self.store._insert(row, partition_logs.token(self.cfg.name, row), f"record the identity of topic {topic}")
            for p, s in logs.items():
                fresh[TopicPartition(topic=topic, partition=p)] = Accepted(s.topic_id, s.low, s.high, slot)
        return fresh

    def seen(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, Seen]:
        """The log of each partition of ``offsets`` as the broker shows it now; a partition of a topic
        it does not know is left out. The log end is confirmed by a fetch wherever the listed end is
        below the offset (the embedded broker lists the end of a batch's first record,
        ``clients.log_ends``); a partition whose fetch does not answer in time is left out too."""
        ids = self.topic_ids(sorted({tp.topic for tp in offsets}))
        tps = [tp for tp in offsets if tp.topic in ids]
        if not tps:
            return {}
        low = self._list(tps, OffsetSpec.earliest())
        high = self._list(tps, OffsetSpec.latest())
        behind = [tp for tp in tps if offsets[tp] > high[tp]]
        late: set[tuple[str, int]] = set()
        if behind:  # a consumer per call: one that fetched a topic later re-created can crash (librdkafka)
            consumer = self._kafka.consumer(**CONSUMER_PROPERTIES, **{"group.id": f"chtxn-logs-{self.cfg.name}"})
            try:
                ends = log_ends(
                    consumer, [(tp.topic, tp.partition) for tp in behind], LOOKUP_TIMEOUT_S, unconfirmed=late
                )
            finally:
                consumer.close()
            high.update({tp: ends[(tp.topic, tp.partition)] for tp in behind})
        if late:  # a slow broker is no evidence of a lost log: judged at the next check
            log.warning(
                "could not confirm the log end of %s in time: judged at the next check",
                ", ".join(f"{t}/{p}" for t, p in sorted(late)),
            )
        return {
            tp: Seen(topic_id=ids[tp.topic], low=low[tp], high=high[tp])
            for tp in tps
            if (tp.topic, tp.partition) not in late
        }

    def topic_ids(self, topics: list[str]) -> dict[str, str]:
        """Each of ``topics`` the broker knows, with its topic ID ("" where the broker has none)."""
        if not topics:
            return {}
        found: dict[str, str] = {}
        try:
            futures = self._admin.describe_topics(TopicCollection(topics), request_timeout=LOOKUP_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerUnreachable(f"cannot describe topics {', '.join(topics)}: {exc}") from None
        for topic, future in futures.items():
            try:
                found[topic] = partition_logs.topic_id(str(future.result().topic_id or ""))
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # deleted (maybe being created again): judged at the next check
                raise BrokerUnreachable(f"cannot describe topic {topic}: {exc}") from None
        return found

    def _list(self, tps: list[TopicPartition], spec: OffsetSpec) -> dict[TopicPartition, int]:
        try:
            futures = self._admin.list_offsets(
                {KafkaTP(tp.topic, tp.partition): spec for tp in tps}, request_timeout=10
            )
            return {TopicPartition(topic=k.topic, partition=k.partition): f.result().offset for k, f in futures.items()}
        except KafkaException as exc:
            raise BrokerUnreachable(f"cannot read the offsets of {len(tps)} partitions: {exc}") from None
