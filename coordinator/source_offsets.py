"""Where each source partition starts, for the leader: the initial offsets of never-committed
partitions, gaps left by retention, and the watermarks both are decided from; and, while leading,
partitions added to the source topics and gaps that open."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from clients import kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from coordinator import first_start as first_starts, ledger_rows
from coordinator.ledger_store import LedgerStore
from protocol import routing
from protocol.config import PipelineConfig
from protocol.coordinator_events import GapFound, PartitionsChanged
from protocol.coordinator_state import CoordinatorState
from protocol.errors import ChtxnError, SetupError
from protocol.messages import TopicPartition

log = logging.getLogger(__name__)


class SourceOffsets:
    """The source partitions as the leader of ``epoch`` sees them, through ``admin`` (an admin
    client) and the ledger. The constructor does no I/O."""

    def __init__(self, cfg: PipelineConfig, admin: Any, ledger: LedgerStore, *, epoch: int, coordinator: str) -> None:
        self.cfg, self.ledger, self.epoch, self.coordinator = cfg, ledger, epoch, coordinator
        self._admin = admin
        self._gaps_recorded: set[tuple[TopicPartition, int, int]] = set()

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the source topics, sorted; ``SetupError`` naming a topic that the routes
        of two tables match."""
        found = kafka_clients.partitions_of(
            self._admin, self.cfg.source_topics, bootstrap=self.cfg.kafka.bootstrap_servers
        )
        routing.table_map(sorted({tp.topic for tp in found}), self.cfg.routes)
        return found

    def initial(self, partitions: list[TopicPartition], head: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Where each partition's next txn may start, beyond its committed end: the recorded
        initial offset of a never-committed partition, or where a skipped gap ends.

        ``start_from`` applies to the topics the pipeline sees at its first start; every topic and
        partition it first sees later (created, matched by a pattern or added to the config since)
        starts from its earliest offset. The first start is a fact of the ledger, not of this
        listing: its first leader records the choice (an INITIAL row per partition, and one with no
        partition when it sees none), so a run in which no topic matched still counts. Each choice
        is recorded once, so a later leader never moves it.
        """
        recorded = self.ledger.initial_offsets()
        first_start = not head and not recorded and not first_starts.recorded(self.ledger)
        latest = first_start and self.cfg.pipeline.start_from == "latest"
        marks = self.watermarks([tp for tp in partitions if tp not in head and tp not in recorded])
        choices = {tp: high if latest else low for tp, (low, high) in marks.items()}
        recorded.update(self.ledger.claim_initials(choices, epoch=self.epoch, coordinator=self.coordinator))
        if first_start and not choices:
            first_starts.record(
                self.ledger, self.cfg.pipeline.start_from, epoch=self.epoch, coordinator=self.coordinator
            )
        initial = {tp: recorded[tp] for tp in partitions if tp not in head}
        base = {tp: max(head.get(tp, 0), initial.get(tp, 0)) for tp in partitions}
        for tp, skip_to in self.gaps(base).items():
            initial[tp] = skip_to
        return initial

    def gaps(self, base: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Partitions whose next offset is gone (retention), each recorded once as a GAP; per
        ``on_gap``, raise (fail) or return where to go on from (skip)."""
        skips = {}
        marks = self.watermarks(list(base))
        for tp, offset in sorted(base.items()):
            low, _ = marks[tp]
            if offset < low:
                self._gap(tp, offset, low)
                skips[tp] = low
        return skips

    def gaps_found(self, state: CoordinatorState) -> list[GapFound]:
        """A gap that opened while leading (lag passed retention during an outage), per partition;
        none before ``state`` is ready, or when the broker cannot be reached (checked again later)."""
        if not state.ready:
            return []
        try:
            skips = self.gaps({tp: state.base(tp) for tp in state.partitions})
        except BrokerUnreachable as exc:
            log.warning("could not check for gaps", extra={"error": str(exc)})
            return []
        return [GapFound(tp, offset) for tp, offset in skips.items()]

    def partitions_changed(self, state: CoordinatorState) -> list[PartitionsChanged]:
        """The source partitions, with where new ones start, when they are no longer ``state``'s."""
        try:
            partitions = self.partitions()
        except ChtxnError as exc:
            log.warning("could not list partitions", extra={"error": str(exc)})
            return []
        if tuple(partitions) == state.partitions:
            return []
        new = [tp for tp in partitions if tp not in state.head and tp not in state.initial]
        initial = self.initial(new, dict(state.head))
        log.warning("source partitions changed", extra={"partitions": len(partitions)})
        return [PartitionsChanged(tuple(partitions), initial)]

    def _gap(self, tp: TopicPartition, head: int, low: int) -> None:
        message = (
            f"{tp.topic}-{tp.partition}: offsets {head}..{low - 1} are gone (retention) before they were committed"
        )
        if (tp, head, low) not in self._gaps_recorded:
            self.ledger.append(
                ledger_rows.gap(
                    tp,
                    head,
                    low,
                    pipeline=self.cfg.name,
                    target=",".join(self.cfg.tables),
                    epoch=self.epoch,
                    coordinator=self.coordinator,
                )
            )
            self._gaps_recorded.add((tp, head, low))
        if self.cfg.pipeline.on_gap == "fail":
            raise SetupError(f'{message}; set pipeline.on_gap = "skip" to go on from offset {low}')
        log.error("gap skipped", extra={"topic": tp.topic, "partition": tp.partition, "from": head, "to": low})

    def watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(low, high) of each of ``tps``: two ListOffsets rounds (one request per broker each),
        however many partitions, instead of a blocking round trip per partition."""
        if not tps:
            return {}
        low, high = self.list_offsets(tps, OffsetSpec.earliest()), self.list_offsets(tps, OffsetSpec.latest())
        return {tp: (low[tp], high[tp]) for tp in tps}

    def list_offsets(self, tps: Sequence[TopicPartition], spec: OffsetSpec) -> dict[TopicPartition, int]:
        """What the brokers answer ListOffsets with ``spec`` for each of ``tps`` (one request per broker)."""
        try:
            futures = self._admin.list_offsets(
                {KafkaTP(tp.topic, tp.partition): spec for tp in tps}, request_timeout=10
            )
            return {TopicPartition(topic=k.topic, partition=k.partition): f.result().offset for k, f in futures.items()}
        except KafkaException as exc:
            raise BrokerUnreachable(
                f"cannot read the offsets of {len(tps)} partitions of {', '.join(sorted({tp.topic for tp in tps}))} "
                f"from {self.cfg.kafka.bootstrap_servers}: {exc}"
            ) from None
