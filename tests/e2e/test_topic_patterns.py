"""A ``re:`` entry of ``pipeline.topics`` picks up a topic created while the pipeline runs: the
coordinator and the Spark participant job (local mode) add its partitions, and every record of
both topics is committed exactly once."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from clients import kafka as kafka_clients
from tests.e2e.processes import committed, running
from tests.helpers import unique_name
from tests.pipelines import assert_exactly_once, make_pipeline

pytestmark = pytest.mark.e2e


def test_a_topic_created_mid_run_that_a_pattern_matches_is_ingested_exactly_once(stack, tmp_path):
    name = unique_name("regex")
    pipeline = make_pipeline(
        stack, tmp_path, name, settings={"pipeline.topics": [f"{name}_events", f"re:{name}_more_.*"]}
    )
    first = pipeline.produce(2_000)
    with running(pipeline, tmp_path, slots=2) as procs:
        committed(pipeline, first, procs)
        late = f"{name}_more_1"
        admin = AdminClient({"bootstrap.servers": stack.kafka_bootstrap})
        kafka_clients.create_topics(admin, {late: 2})
        producer = Producer({"bootstrap.servers": stack.kafka_bootstrap, "linger.ms": 5})
        for i in range(1_500):
            value = json.dumps({"id": 10_000 + i, "user": "late", "amount": 1.0}).encode()
            producer.produce(late, value=value, key=str(i).encode(), partition=i % 2)
        assert producer.flush(30) == 0
        more = pipeline.produce(500, start_id=first)
        committed(pipeline, first + 1_500 + more, procs)
    assert_exactly_once(pipeline, first + 1_500 + more)
    topics = {r.topic for c in pipeline.ledger().commits() for r in c.ranges if r.rows}
    assert topics == {f"{name}_events", late}
