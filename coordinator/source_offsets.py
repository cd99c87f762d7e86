"""Where each source partition starts, for the leader: the initial offsets of never-committed
partitions, gaps left by retention, and the watermarks both are decided from; and, while leading,
partitions added to the source topics and gaps that open. Partitions whose log no longer matches
the ledger (``coordinator.partition_logs``) are stopped: left out of the partitions txns read."""

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
from coordinator.partition_logs import PartitionLogs
from protocol import routing
from protocol.config import PipelineConfig
from protocol.coordinator_events import GapFound, PartitionsChanged
from protocol.coordinator_state import CoordinatorState
from protocol.errors import ChtxnError, SetupError
from protocol.messages import TopicPartition
from protocol.partition_logs import Stop

log = logging.getLogger(__name__)


class SourceOffsets:
    """The source partitions as the leader of ``epoch`` sees them, through ``admin`` (an admin
    client) and the ledger. The constructor does no I/O."""

    def __init__(self, cfg: PipelineConfig, admin: Any, ledger: LedgerStore, *, epoch: int, coordinator: str) -> None:
        self.cfg, self.ledger, self.epoch, self.coordinator = cfg, ledger, epoch, coordinator
        self._admin = admin
        self._gaps_recorded: set[tuple[TopicPartition, int, int]] = set()
        self.logs = PartitionLogs(cfg, admin, ledger, epoch=epoch, coordinator=coordinator)
        #: Partitions not read: their log no longer matches the ledger (``PartitionLogs.check``).
        self.stopped: dict[TopicPartition, Stop] = {}

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the source topics, sorted; ``SetupError`` naming a topic that the routes
        of two tables match."""
        found = kafka_clients.partitions_of(
            self._admin, self.cfg.source_topics, bootstrap=self.cfg.kafka.bootstrap_servers
        )
        routing.table_map(sorted({tp.topic for tp in found}), self.cfg.routes)
        return found

    def initial(
        self, partitions: list[TopicPartition], head: dict[TopicPartition, int], *, head_seq: int | None = None
    ) -> dict[TopicPartition, int]:
        """Where each partition's next txn may start, beyond its committed end: the recorded
        initial offset of a never-committed partition, or where a skipped gap ends.

        ``start_from`` applies to the topics the pipeline sees at its first start; every topic and
        partition it first sees later (created, matched by a pattern or added to the config since)
        starts from its earliest offset. The first start is a fact of the ledger, not of this
        listing: its first leader records the choice (an INITIAL row per partition, and one with no
        partition when it sees none), so a run in which no topic matched still counts. Each choice
        is recorded once, so a later leader never moves it.

        With ``head_seq`` (take-over), the logs of ``partitions`` are checked too (``stopped``),
        and a stopped partition is never judged for gaps: its log is not the ledger's.
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
        if head_seq is not None:
            self.stopped = self.logs.check(base, head_seq)
        for tp, skip_to in self.gaps({tp: o for tp, o in base.items() if tp not in self.stopped}).items():
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
            skips = self.gaps({tp: state.base(tp) for tp in state.partitions if tp not in self.stopped})
        except BrokerUnreachable as exc:
            log.warning("could not check for gaps", extra={"error": str(exc)})
            return []
        return [GapFound(tp, offset) for tp, offset in skips.items()]

    def partitions_changed(self, state: CoordinatorState) -> list[PartitionsChanged]:
        """The source partitions txns read, with where new ones start, when they are no longer
        ``state``'s: every listed partition but the stopped ones (their logs are checked here)."""
        try:
            partitions = self.partitions()
        except ChtxnError as exc:
            log.warning("could not list partitions", extra={"error": str(exc)})
            return []
        new = [tp for tp in partitions if tp not in state.head and tp not in state.initial]
        initial = self.initial(new, dict(state.head)) if new else {}
        bases = {tp: initial[tp] if tp in initial else state.base(tp) for tp in partitions}
        try:
            self.stopped = self.logs.check(bases, state.head_seq)
        except BrokerUnreachable as exc:  # the last check stands until the next one
            log.warning("could not check the partitions' logs", extra={"error": str(exc)})
        read = tuple(tp for tp in partitions if tp not in self.stopped)
        if read == state.partitions:
            return []
        log.warning("source partitions changed", extra={"partitions": len(read), "stopped": len(self.stopped)})
        return [PartitionsChanged(read, initial)]

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
