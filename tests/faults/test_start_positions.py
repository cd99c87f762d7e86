"""Where a topic starts (docs/architecture.md §9): ``start_from`` is decided per topic, the first time
the pipeline sees it. The pipeline's first start is a fact of the ledger, so a topic a ``re:`` pattern
matches later (mid-run, or at a restart after a run in which none matched) starts from its earliest
offset, as every topic first seen after the first start does. Real leaders in threads, test code as
participants; the test decides when the leader first lists a topic."""

from __future__ import annotations

import json
import threading
from typing import ClassVar

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from coordinator import leader as leader_module
from coordinator.offsets.source import SourceOffsets
from protocol.config.parse import parse_config
from protocol.messages import TopicPartition
from tests.helpers import create_topic, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline, make_pipeline


def produce(pipeline: Pipeline, topic: str, count: int, *, start_id: int) -> int:
    """``count`` JSON events with ids from ``start_id`` on partition 0 of ``topic``."""
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "linger.ms": 5})
    for i in range(start_id, start_id + count):
        value = json.dumps({"id": i, "user": f"u{i % 97}", "amount": i * 0.5}).encode()
        producer.produce(topic, value=value, key=str(i).encode(), partition=0)
    assert producer.flush(30) == 0, "not every test record was delivered"
    return count


def ids_of(pipeline: Pipeline, topic: str) -> dict[int, int]:
    """How often each record id of ``topic`` is in the target."""
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    rows = pipeline.client().query(
        f"SELECT id, count() FROM `{db}`.`{table}` WHERE _topic = {{t:String}} GROUP BY id", parameters={"t": topic}
    )
    return {int(i): int(n) for i, n in rows.result_rows}


class Hidden(SourceOffsets):
    """A leader's view of the source that does not list the topics in ``Hidden.topics`` yet: the test
    decides when the leader first sees a topic (a listing runs every 5 s). ``Hidden.decided`` is set
    once a leader has decided where the partitions it listed start."""

    topics: ClassVar[set[str]] = set()
    decided: ClassVar[threading.Event] = threading.Event()

    def partitions(self) -> list[TopicPartition]:
        return [tp for tp in super().partitions() if tp.topic not in self.topics]

    def initial(self, *args, **kwargs) -> dict[TopicPartition, int]:
        found = super().initial(*args, **kwargs)
        self.decided.set()
        return found


def pattern_pipeline(stack, tmp_path, name: str) -> Pipeline:
    """A pipeline reading only ``re:<name>_late_.*`` (no such topic yet), ``start_from = "latest"``."""
    pipeline = make_pipeline(stack, tmp_path, name, partitions=1, settings={"pipeline.start_from": "latest"})
    text = pipeline.config_path.read_text().replace(f'"{name}_events"', f'"re:{name}_late_.*"')
    pipeline.config_path.write_text(text)
    pipeline.cfg = parse_config(text, source=str(pipeline.config_path))
    pipeline.partitions = []
    return pipeline


def test_start_from_latest_leaves_a_topic_matched_mid_run_to_start_from_its_earliest_offset(
    stack, tmp_path, monkeypatch
):
    """Only ``re:`` routes and ``start_from = "latest"``: the first start sees no topic; a topic created
    later, whose 500 records are all there before the leader first lists it, is read whole."""
    pipeline = pattern_pipeline(stack, tmp_path, unique_name("latematch"))
    late = f"{pipeline.cfg.name}_late_a"
    monkeypatch.setattr(leader_module, "SourceOffsets", Hidden)
    Hidden.topics, Hidden.decided = {late}, threading.Event()
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1):
        e1.start()
        assert Hidden.decided.wait(60), "E1 never listed the source partitions"
        admin = AdminClient({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
        create_topic(admin, late, 1)
        produce(pipeline, late, 500, start_id=0)
        participants.partitions.append(TopicPartition(topic=late, partition=0))
        Hidden.topics = set()  # the leader's next listing matches it
        wait_until(lambda: pipeline.target_count() == 500, 60, "the late topic's 500 records committed")
        e1.stop.set()
        e1.ended(60)
    assert ids_of(pipeline, late) == dict.fromkeys(range(500), 1)
    assert pipeline.ledger().initial_offsets() == {TopicPartition(topic=late, partition=0): 0}


def test_start_from_latest_leaves_a_topic_first_matched_at_a_restart_to_start_from_its_earliest_offset(stack, tmp_path):
    """A first run in which no topic matched is still the pipeline's first start: a topic created
    while the pipeline was down is read whole by the next run."""
    pipeline = pattern_pipeline(stack, tmp_path, unique_name("latestart"))
    late = f"{pipeline.cfg.name}_late_a"
    e1 = LeaderThread(pipeline, 1, "E1")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, leaders(e1):
        e1.start()
        wait_until(lambda: pipeline.ledger().head()[0] >= 1, 60, "E1's take-over (its seal)")
        e1.stop.set()
        e1.ended(60)
        admin = AdminClient({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
        create_topic(admin, late, 1)
        produce(pipeline, late, 500, start_id=0)
        participants.partitions.append(TopicPartition(topic=late, partition=0))
        e2 = LeaderThread(pipeline, 2, "E2")
        with leaders(e2):
            e2.start()
            wait_until(lambda: pipeline.target_count() == 500, 60, "the late topic's 500 records committed")
            e2.stop.set()
            e2.ended(60)
    assert ids_of(pipeline, late) == dict.fromkeys(range(500), 1)
