"""A slow broker is no evidence of a lost log (issue 36, found in the trial): when the fetch that
confirms a partition's log end does not answer in time, the partition is judged at the next check,
never stopped on the listed end, which the embedded broker gives as a lower bound."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from clients import log_ends as log_ends_module
from coordinator.offsets import partition_logs
from coordinator.offsets.partition_logs import PartitionLogs
from tests.helpers import unique_name
from tests.integration.test_log_ends import produce
from tests.pipelines import make_pipeline


class FetchesUnanswered:
    """A real consumer whose fetches bring nothing back in time: what a busy broker looks like to
    ``clients.log_ends`` (ListOffsets answers, the confirming Fetch does not)."""

    def __init__(self, consumer) -> None:
        self._consumer = consumer

    def consume(self, num_messages: int, timeout: float) -> list:
        return []

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def test_a_log_end_the_fetch_did_not_confirm_in_time_stops_nothing(stack, tmp_path, monkeypatch):
    """500 records in one batch: the embedded broker lists the partition's end as 1. The fetch that
    would confirm 500 gets no time to answer (a broker too slow for the lookup's deadline). The
    ledger's offset 500 is then not "past the log end 1": nothing is stopped or recorded, and with
    time to answer the same check finds the log whole. Before, the partition was stopped as "the
    broker lost its log" (seen in the trial on a busy embedded broker)."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("slowends"), partitions=1)
    [tp] = pipeline.partitions
    produce(stack.kafka_bootstrap, tp.topic, 0, 500, linger_ms=1000)
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    logs = PartitionLogs(pipeline.cfg, admin, pipeline.ledger(), epoch=1, coordinator="c1")

    real = log_ends_module.log_ends

    def no_fetch_answers(consumer, parts, timeout_s, **kw):  # the broker lists ends, its fetches are late
        return real(FetchesUnanswered(consumer), parts, 0.5, **kw)

    monkeypatch.setattr(partition_logs, "log_ends", no_fetch_answers)
    assert logs.check({tp: 500}, head_seq=1) == {}, "a lookup that timed out stopped the partition"
    assert partition_logs.records(pipeline.ledger()) == []

    monkeypatch.setattr(partition_logs, "log_ends", real)
    assert logs.check({tp: 500}, head_seq=1) == {}
    [identity] = partition_logs.records(pipeline.ledger())
    assert identity.event.value == "TOPIC" and identity.ranges[0].end == 500, identity
