"""Where each source partition starts, for the leader: the initial offsets of never-committed
partitions, gaps left by retention, and the watermarks both are decided from; and, while leading,
partitions added to the source topics and gaps that open. Partitions whose log no longer matches
the ledger (``coordinator.offsets.partition_logs``) are stopped: left out of the partitions txns read."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition as KafkaTP
from confluent_kafka.admin import OffsetSpec

from clients import kafka as kafka_clients
from clients.kafka import BrokerUnreachable
from coordinator.ledger import rows as ledger_rows
from coordinator.ledger.store import LedgerStore
from coordinator.offsets import first_start as first_starts
from coordinator.offsets.partition_logs import PartitionLogs
from protocol import routing
from protocol.config.parse import PipelineConfig
from protocol.coordinator.events import GapFound, PartitionsChanged
from protocol.coordinator.state import CoordinatorState
from protocol.errors import ChtxnError, SetupError
from protocol.messages import TopicPartition
from protocol.offsets.partition_logs import Stop

log = logging.getLogger(__name__)


class SourceOffsets:
    """The source partitions as the leader of ``epoch`` sees them, through ``admin`` (an admin
    client) and the ledger. The constructor does no I/O."""

    def __init__(self, cfg: PipelineConfig, admin: Any, ledger: LedgerStore, *, epoch: int, coordinator: str) -> None:
        self.cfg, self.ledger, self.epoch, self.coordinator = cfg, ledger, epoch, coordinator
        self._admin = admin
        self._gaps_recorded: set[tuple[TopicPartition, int, int]] = set()
        self._ambiguous: dict[str, str] = {}  # topic -> why: the routes of several tables match it
        self._unreadable: dict[str, str] = {}  # new topic -> why: its offsets could not be read
        self.logs = PartitionLogs(cfg, admin, ledger, epoch=epoch, coordinator=coordinator)
        #: Partitions not read: their log no longer matches the ledger (``PartitionLogs.check``).
        self.stopped: dict[TopicPartition, Stop] = {}

    @property
    def held(self) -> dict[str, str]:
        """Topics left out of the source partitions, each with why and what to do: one the routes of
        several tables match (``partitions``), or a new one whose offsets cannot be read yet
        (``partitions_changed``, which tries again at each partition check)."""
        return {**self._unreadable, **self._ambiguous}

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the source topics, sorted, but for those of a topic the routes of several
        tables match: that topic is held (``held``, an error logged once), none of its records are
        read, and every other topic goes on being discovered and read."""
        found = kafka_clients.partitions_of(
            self._admin, self.cfg.source_topics, bootstrap=self.cfg.kafka.bootstrap_servers
        )
        ambiguous = routing.route(sorted({tp.topic for tp in found}), self.cfg.routes).ambiguous
        self._ambiguous = _hold(self._ambiguous, {t: routing.ambiguity(t, tables) for t, tables in ambiguous.items()})
        return [tp for tp in found if tp.topic not in self._ambiguous]

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
        ``state``'s: every listed partition but the stopped ones (their logs are checked here); a new
        topic whose offsets cannot be read is held until they can (``held``), the others join."""
        try:
            partitions = self.partitions()
        except ChtxnError as exc:
            log.warning("could not list partitions", extra={"error": str(exc)})
            return []
        new = [tp for tp in partitions if tp not in state.head and tp not in state.initial]
        try:
            self._unreadable = _hold(self._unreadable, self._unreadable_topics(new))
            partitions = [tp for tp in partitions if tp.topic not in self._unreadable]
            new = [tp for tp in new if tp.topic not in self._unreadable]
            initial = self.initial(new, dict(state.head)) if new else {}
        except BrokerUnreachable as exc:
            log.warning("could not read the offsets of new partitions", extra={"error": str(exc)})
            return []
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

    def _unreadable_topics(self, new: list[TopicPartition]) -> dict[str, str]:
        """The topics of ``new`` partitions whose offsets cannot be read, each with why; when none of
        them can be read, the broker is the problem: ``BrokerUnreachable``, as before."""
        if not new:
            return {}
        try:
            self.watermarks(new)
            return {}
        except BrokerUnreachable as exc:
            everything = exc
        failing: dict[str, str] = {}
        topics = sorted({tp.topic for tp in new})
        for topic in topics:  # one topic at a time, so that one failing topic holds only itself
            try:
                self.watermarks([tp for tp in new if tp.topic == topic])
            except BrokerUnreachable as exc:
                failing[topic] = f"{exc}; it is tried again at each partition check"
        if len(failing) == len(topics):
            raise everything
        return failing

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


def _hold(was: dict[str, str], now: dict[str, str]) -> dict[str, str]:
    """``now``'s held topics (topic -> why), logging each that is newly held, and each no longer held."""
    for topic in sorted(now.keys() - was.keys()):
        log.error("topic held: none of its records are read", extra={"topic": topic, "error": now[topic]})
    for topic in sorted(was.keys() - now.keys()):
        log.warning("topic no longer held", extra={"topic": topic})
    return now
