"""Source logs that change under a running pipeline (docs/architecture.md §9): a topic deleted and
created again stops its partitions, loudly, while the other partitions flow, until the operator
decides with ``chtxn reset``. A real coordinator service, test code as participants."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from protocol.messages import TopicPartition
from tests.faults.test_start_positions import ids_of, produce
from tests.helpers import create_topic, run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import Pipeline, make_pipeline

READ_DEADLINE_S = 5.0


class LogsMayVanish(ScriptedParticipants):
    """Scripted participants whose read of a partition ends at its end, at an error (its topic was
    deleted) or after ``READ_DEADLINE_S``, each read by a consumer of its own: a librdkafka consumer
    that fetched a topic which is then deleted and created again can crash its process later."""

    def _read(self, tp: TopicPartition, begin: int) -> list[bytes]:
        lines: list[bytes] = []
        consumer = Consumer(
            {
                "bootstrap.servers": self.cfg.kafka.bootstrap_servers,
                "group.id": f"{self.sender}-data",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        consumer.assign([KafkaTP(tp.topic, tp.partition, begin)])
        deadline = time.monotonic() + READ_DEADLINE_S
        at_end = False
        try:
            while not at_end and time.monotonic() < deadline:
                for record in consumer.consume(1000, 0.2):
                    if record.error() is not None:  # its end (EOF), or its topic is gone
                        at_end = True
                        continue
                    if record.topic() == tp.topic and record.offset() == begin + len(lines):
                        lines.append(
                            b'{"_topic":"%s","_partition":%d,"_offset":%d,'
                            % (tp.topic.encode(), tp.partition, record.offset())
                            + record.value()[1:]
                        )
        finally:
            consumer.close()
        return lines


def offsets_of(pipeline: Pipeline, topic: str) -> dict[int, int]:
    """How often each offset of ``topic``'s partition 0 is in the target."""
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    rows = pipeline.client().query(
        f"SELECT _offset, count() FROM `{db}`.`{table}` WHERE _topic = {{t:String}} GROUP BY _offset",
        parameters={"t": topic},
    )
    return {int(o): int(n) for o, n in rows.result_rows}


def status(pipeline: Pipeline) -> dict:
    result = run_chtxn("status", "--config", str(pipeline.config_path), "--json")
    return {"exit": result.returncode, **json.loads(result.stdout)} if result.stdout else {"exit": result.returncode}


def stopped_check(pipeline: Pipeline) -> dict | None:
    """The failed ``partition logs`` check of ``chtxn status``, if it failed."""
    found = status(pipeline)
    checks = {c["name"]: c for c in found.get("checks", [])}
    check = checks.get("partition logs")
    return check if found["exit"] == 1 and check and check["status"] == "fail" else None


def re_create(admin: AdminClient, topic: str) -> None:
    """Delete ``topic`` and create it again, empty, with one partition."""
    for future in admin.delete_topics([topic], operation_timeout=30).values():
        future.result(30)
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, 30, f"topic {topic} deleted")
    create_topic(admin, topic, 1)


@pytest.mark.parametrize("new_records", [200, 500])
def test_a_topic_re_created_under_a_running_pipeline_stops_its_partition_until_a_reset(stack, tmp_path, new_records):
    """Topic A (300 records committed) is deleted and created again with fewer (200) or more (500)
    records than the committed offset, under a running pipeline that also reads topic B. A/0 stops,
    loudly: ``chtxn status`` fails naming it and the fix, no record of the new A is committed from the
    old offset, and B keeps flowing. ``chtxn reset --to-earliest`` on A/0 (recorded in the ledger) then
    reads the new A whole: every record of each log exactly once, the oracle and ``verify --deep`` agree.
    A leader that takes over meanwhile keeps A/0 stopped, even once the new log has grown past the
    old offset."""
    name = unique_name("recreate")
    a, b = f"{name}_events", f"{name}_other"
    pipeline = make_pipeline(stack, tmp_path, name, partitions=1, settings={"pipeline.topics": [a, b]})
    admin = AdminClient({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
    create_topic(admin, b, 1)
    pipeline.partitions = [TopicPartition(topic=a, partition=0), TopicPartition(topic=b, partition=0)]
    config = str(pipeline.config_path)
    produce(pipeline, a, 300, start_id=0)
    produce(pipeline, b, 100, start_id=0)
    total_a = new_records
    with LogsMayVanish(pipeline.cfg, pipeline.partitions):
        with ServiceThread(pipeline.cfg, "c1"):
            wait_until(lambda: pipeline.target_count() == 400, 60, "the first records of A and B committed")
            re_create(admin, a)
            produce(pipeline, a, new_records, start_id=1000)
            produce(pipeline, b, 100, start_id=100)
            wait_until(lambda: len(ids_of(pipeline, b)) == 200, 60, "B's new records committed (B flows)")
            check = wait_until(lambda: stopped_check(pipeline), 60, f"chtxn status to fail naming {a}/0")
            assert f"{a}/0" in check["found"] and "deleted and created again" in check["found"], check
            assert f"chtxn reset --partition {a}/0" in check["fix"], check
            doctor = run_chtxn("doctor", "--config", config, "--json")
            explained = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}["partition logs"]
            assert doctor.returncode == 1 and explained["status"] == "fail", doctor.stdout
            assert f"{a}/0" in explained["found"] and "chtxn pause" in explained["fix"], explained
            if new_records < 300:  # the new log grows past the old offset while no leader runs
                total_a += produce(pipeline, a, 300, start_id=1000 + new_records)
        with ServiceThread(pipeline.cfg, "c2"):  # a new leader keeps A/0 stopped, from the ledger
            produce(pipeline, b, 100, start_id=200)
            wait_until(lambda: len(ids_of(pipeline, b)) == 300, 60, "B still flows while A/0 is stopped")
            assert stopped_check(pipeline), "the new leader does not keep A/0 stopped"
            assert not [i for i in ids_of(pipeline, a) if i >= 1000], (
                "records of the new A committed from the old offset"
            )

            assert run_chtxn("pause", "--config", config, "--reason", "A was re-created").returncode == 0
            reset = run_chtxn("reset", "--config", config, "--partition", f"{a}/0", "--to-earliest", "--json")
            assert reset.returncode == 0, reset.stderr
            moved = json.loads(reset.stdout)["partitions"]
            assert moved == [{"partition": f"{a}/0", "committed": 300, "reset_to": 0}], reset.stdout
            assert run_chtxn("resume", "--config", config).returncode == 0
            wait_until(
                lambda: len([i for i in ids_of(pipeline, a) if i >= 1000]) == total_a, 90, "the new A read whole"
            )
            wait_until(lambda: stopped_check(pipeline) is None, 30, "chtxn status to pass the partition logs again")
    assert ids_of(pipeline, a) == dict.fromkeys([*range(300), *range(1000, 1000 + total_a)], 1)
    assert ids_of(pipeline, b) == dict.fromkeys(range(300), 1)
    both = min(300, total_a)
    assert offsets_of(pipeline, a) == {o: 2 if o < both else 1 for o in range(max(300, total_a))}
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    verified = run_chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
