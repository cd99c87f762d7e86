"""A topic that the routes of two tables match (``[[route]]`` patterns), or a new one whose offsets
cannot be read, is held on its own: the real coordinator service and participant tasks in threads,
topics created while the pipeline runs. The held topic is logged and counted by a metric (and an
ambiguous one failed by ``chtxn status``); topics created after it are still found and committed,
and a restarted leader takes over and goes on. Each test ends with the exactly-once oracle per table
and ``chtxn verify --deep``."""

from __future__ import annotations

import json
import logging
import threading

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from clients import kafka as kafka_clients
from clients.kafka import KafkaClientFactory
from coordinator.leader import Leader
from protocol.config.parse import parse_config
from protocol.messages import TopicPartition
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants, task
from tests.pipelines import Pipeline
from tests.routed import assert_exactly_once_per_table, make_routed_pipeline, produce_to, table_count

WAIT_S = 60.0


def test_a_topic_two_tables_patterns_match_is_held_and_later_topics_keep_flowing(stack, tmp_path, caplog):
    """Issue 35 item 10: ``<name>_a_b`` matches t0's ``re:<name>_a_.*`` and t1's ``re:<name>_.*_b``."""
    base = make_routed_pipeline(stack, tmp_path, unique_name("hold"), tables=2)
    name = base.cfg.name
    text = (
        base.config_path.read_text()
        .replace(f'topics = ["{name}_t0"]', f'topics = ["{name}_t0", "re:{name}_a_.*"]')
        .replace(f'topics = ["{name}_t1"]', f'topics = ["{name}_t1", "re:{name}_.*_b"]')
    )
    base.config_path.write_text(text)
    cfg = parse_config(text, source=str(base.config_path))
    both, late = f"{name}_a_b", f"{name}_a_1"
    late_tps = [TopicPartition(topic=late, partition=p) for p in range(2)]
    both_tps = [TopicPartition(topic=both, partition=p) for p in range(2)]
    pipeline = Pipeline(cfg, base.config_path, base.partitions + late_tps)  # the topics that go to one table
    produced = {"t0": produce_to(pipeline, f"{name}_t0", 100), "t1": produce_to(pipeline, f"{name}_t1", 100)}
    counts = lambda: {t: table_count(pipeline, t) for t in produced}  # noqa: E731
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    held = {"pipeline": name, "topic": both}
    late_task = None
    with caplog.at_level(logging.WARNING, logger="coordinator.offsets.source"), participants(pipeline, tasks=1):
        try:
            with coordinator(pipeline, coordinator_id="c1") as service:
                wait_until(lambda: counts() == produced, WAIT_S, "the first records committed")
                kafka_clients.create_topics(admin, {both: 2})
                produce_to(Pipeline(cfg, base.config_path, both_tps), both, 50)  # never read: held
                kafka_clients.create_topics(admin, {late: 2})
                produced["t0"] += produce_to(pipeline, late, 80, start_id=1_000)
                late_task = task(pipeline, late_tps + both_tps, "task-late")  # the job would hold every match
                wait_until(lambda: counts() == produced, WAIT_S, f"{late}'s records committed beside the held {both}")
                metric = service.metrics.registry.get_sample_value
                wait_until(lambda: metric("chtxn_topic_held", held) == 1, WAIT_S, f"{both} counted held")
                status = run_chtxn("status", "--config", str(pipeline.config_path), "--json")
            produced["t0"] += produce_to(pipeline, late, 20, start_id=2_000)
            with coordinator(pipeline, coordinator_id="c2") as restarted:  # takes over with the held topic there
                wait_until(lambda: counts() == produced, WAIT_S, "records committed by the restarted leader")
                metric = restarted.metrics.registry.get_sample_value
                wait_until(lambda: metric("chtxn_topic_held", held) == 1, WAIT_S, f"{both} held by c2")
        finally:
            if late_task is not None:
                late_task.stop()
    assert status.returncode == 1, status.stdout + status.stderr
    routes = next(c for c in json.loads(status.stdout)["checks"] if c["name"] == "routes")
    assert routes["status"] == "fail" and f"{both} matches the routes of t0, t1" in routes["found"], routes
    logged = next(r for r in caplog.records if r.getMessage().startswith("topic held"))
    assert (
        logged.levelname == "ERROR"
        and logged.topic == both
        and "matches the routes of 2 tables (t0, t1)" in logged.error
    )
    ranges = {r.topic for c in pipeline.ledger().commits() for r in c.ranges}
    assert late in ranges and both not in ranges
    assert_exactly_once_per_table(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr


class _AdminFailingOffsetsOf:
    """A real admin client whose ListOffsets fails for any request naming ``topic`` while ``failing``
    is set, as a broker with no leader for that topic's partitions answers."""

    def __init__(self, admin, topic: str, failing: threading.Event) -> None:
        self._admin, self._topic, self._failing = admin, topic, failing

    def list_offsets(self, request, **kwargs):
        if self._failing.is_set() and any(tp.topic == self._topic for tp in request):
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE, f"test: no leader for {self._topic}"))
        return self._admin.list_offsets(request, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._admin, name)


#: The topic whose offsets cannot be read while ``OFFSETS_FAIL`` is set (one test at a time).
BAD_TOPIC, OFFSETS_FAIL = [""], threading.Event()


class _FailingOffsets(KafkaClientFactory):
    def admin(self):
        return _AdminFailingOffsetsOf(super().admin(), BAD_TOPIC[0], OFFSETS_FAIL)


class LeaderFailingOffsetsOfOneTopic(Leader):
    def __init__(self, cfg, **kwargs) -> None:
        super().__init__(cfg, **{**kwargs, "kafka": _FailingOffsets(cfg)})


def test_a_new_topic_whose_offsets_cannot_be_read_is_held_and_later_topics_keep_flowing(stack, tmp_path, caplog):
    """Issue 35 item 10, a failing topic: ``<name>_a_bad``'s offsets cannot be read. It is held (logged,
    counted) while ``<name>_a_1``, created after it, is found and committed; once its offsets can be
    read it joins from its first offset."""
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("holdbad"), tables=2, pattern_table="t0")
    name = pipeline.cfg.name
    bad, late = f"{name}_late_bad", f"{name}_late_1"
    bad_tps = [TopicPartition(topic=bad, partition=p) for p in range(2)]
    late_tps = [TopicPartition(topic=late, partition=p) for p in range(2)]
    pipeline = Pipeline(pipeline.cfg, pipeline.config_path, pipeline.partitions + bad_tps + late_tps)
    produced = {"t0": produce_to(pipeline, f"{name}_t0", 100), "t1": produce_to(pipeline, f"{name}_t1", 100)}
    counts = lambda: {t: table_count(pipeline, t) for t in produced}  # noqa: E731
    admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
    BAD_TOPIC[0] = bad
    OFFSETS_FAIL.set()
    held = {"pipeline": name, "topic": bad}
    late_task = None
    with (
        caplog.at_level(logging.WARNING, logger="coordinator.offsets.source"),
        participants(pipeline, tasks=1),
        coordinator(pipeline, leader_class=LeaderFailingOffsetsOfOneTopic) as service,
    ):
        try:
            wait_until(lambda: counts() == produced, WAIT_S, "the first records committed")
            kafka_clients.create_topics(admin, {bad: 2})
            produced["t0"] += produce_to(pipeline, bad, 30)
            kafka_clients.create_topics(admin, {late: 2})
            late_task = task(pipeline, bad_tps + late_tps, "task-late")
            produced["t0"] += produce_to(pipeline, late, 40, start_id=1_000)
            wait_until(lambda: counts()["t0"] == 100 + 40, WAIT_S, f"{late}'s records committed beside the held {bad}")
            metric = service.metrics.registry.get_sample_value
            wait_until(lambda: metric("chtxn_topic_held", held) == 1, WAIT_S, f"{bad} counted held")
            assert table_count(pipeline, "t0") == 140, "nothing of the held topic is read"
            OFFSETS_FAIL.clear()  # its offsets can be read again: it joins from its first offset
            wait_until(lambda: counts() == produced, WAIT_S, f"{bad}'s records committed")
            wait_until(lambda: metric("chtxn_topic_held", held) in (None, 0), WAIT_S, f"{bad} no longer held")
        finally:
            OFFSETS_FAIL.clear()
            if late_task is not None:
                late_task.stop()
    logged = next(r for r in caplog.records if r.getMessage().startswith("topic held"))
    assert logged.topic == bad and f"no leader for {bad}" in logged.error, logged.error
    assert any(r.getMessage() == "topic no longer held" and r.topic == bad for r in caplog.records)
    assert_exactly_once_per_table(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
