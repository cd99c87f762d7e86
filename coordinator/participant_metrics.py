"""The participants' own figures, exported by the leader: what each copy reports in its heartbeats.

Every participant copy sends its cumulative figures (``ParticipantFigures``) in each heartbeat; the
leader keeps the latest per copy (``Liveness.figures``) and this collector turns them into one series
per copy at each scrape, labelled ``pipeline`` and ``participant`` (the copy's sender id: one per
Spark task attempt, never per record). Only the leader exports them: a standby, and a replica that
stopped leading, export the families with no series, so ``sum by (pipeline)`` never counts a copy
twice. A copy not heard for ten heartbeat timeouts goes; one started again counts from 0, which
Prometheus' ``rate`` reads as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, Metric, SummaryMetricFamily

from protocol.messages import ParticipantFigures

_LABELS = ["pipeline", "participant"]


class ParticipantCollector:
    """A prometheus_client collector of the figures ``follow``'s source gives, until ``stop``."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self._source: Callable[[], Mapping[str, ParticipantFigures]] | None = None

    def follow(self, source: Callable[[], Mapping[str, ParticipantFigures]]) -> None:
        """Export what ``source()`` gives (the leader's ``Liveness.figures``, by sender) at each scrape."""
        self._source = source

    def stop(self) -> None:
        """Export no series any more (this replica no longer leads)."""
        self._source = None

    def describe(self) -> Iterator[Metric]:
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        source = self._source  # read once: the service may stop it meanwhile
        return self._families(source() if source is not None else {})

    def _families(self, reported: Mapping[str, ParticipantFigures]) -> Iterator[Metric]:
        rows = CounterMetricFamily(
            "chtxn_participant_rows_read",
            "Records a participant copy polled from its source partitions since it started (leader only)",
            labels=_LABELS,
        )
        chunks = CounterMetricFamily(
            "chtxn_participant_chunks_staged",
            "Chunks a participant copy inserted into stage tables without an error since it started (leader only)",
            labels=_LABELS,
        )
        inserts = SummaryMetricFamily(
            "chtxn_participant_insert_seconds",
            "A participant copy's deduplicated inserts since it started, retries and back-off included (leader only)",
            labels=_LABELS,
        )
        retries = CounterMetricFamily(
            "chtxn_participant_retries",
            "Retries of a participant copy's ClickHouse calls while staging, since it started (leader only)",
            labels=_LABELS,
        )
        for sender, figures in sorted(reported.items()):
            key = [self.pipeline, sender]
            rows.add_metric(key, figures.rows_read)
            chunks.add_metric(key, figures.chunks_staged)
            inserts.add_metric(key, count_value=figures.inserts, sum_value=figures.insert_seconds)
            retries.add_metric(key, figures.retries)
        yield from (rows, chunks, inserts, retries)
