"""Source partitions written by transactional producers (issue 36, item 6b): each Kafka transaction
leaves a marker, an offset no ``read_committed`` consumer is given. A participant that reads a
partition to its end reports its txn's END there, past trailing markers, never past a record it did
not stage; markers inside committed ranges are no loss to ``chtxn verify --deep``.

The real coordinator and a real participant task run in threads against the embedded stack; the
exactly-once oracle and ``chtxn verify --deep`` end each test.
"""

from __future__ import annotations

import json
from functools import partial

from confluent_kafka import Producer

from clients import failpoints
from clients.kafka import KafkaClientFactory
from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from protocol.messages import TopicPartition
from tests.helpers import REPO, run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

chtxn = partial(run_chtxn, timeout_s=120, inherit_chtxn_vars=False, env={"PYTHONPATH": str(REPO)})


def produce_in_transaction(pipeline: Pipeline, ids: range, *, partition: int = 0) -> None:
    """Events ``ids`` into ``partition``, in one committed Kafka transaction: a marker follows them."""
    producer = Producer(
        {"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers, "transactional.id": unique_name("tx")}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in ids:
        value = json.dumps({"id": i, "user": f"u{i}", "amount": 0.5}).encode()
        producer.produce(pipeline.topic, value=value, key=str(i).encode(), partition=partition)
    producer.commit_transaction(30)


def heads_and_ends(pipeline: Pipeline) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """(ledger head, log end) per partition."""
    _, head = pipeline.ledger().head()
    consumer = KafkaClientFactory(pipeline.cfg).consumer(**{"group.id": "markers-test", **CONSUMER_PROPERTIES})
    try:
        ends = log_ends(consumer, [(tp.topic, tp.partition) for tp in pipeline.partitions])
    finally:
        consumer.close()
    return head, {tp: ends[(tp.topic, tp.partition)] for tp in pipeline.partitions}


def assert_committed_to_the_log_end(pipeline: Pipeline, timeout_s: float = 20) -> None:
    try:
        wait_until(lambda: (lambda h, e: h == e)(*heads_and_ends(pipeline)), timeout_s, "commits up to the log end")
    except AssertionError:
        head, ends = heads_and_ends(pipeline)
        raise AssertionError(f"committed {head}, log ends {ends}: the commits stop before a marker") from None


def test_a_partition_ending_in_markers_commits_past_them_and_a_txn_read_again_passes_them_again(stack, tmp_path):
    """Partition 0 ends in a marker, with another inside: its committed offset reaches the log end (no
    lag of 1 for good). Then a staged chunk fails once, so its txn aborts and is read again from the
    ledger head, through more markers; every record is committed once, and verify --deep agrees."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("markers"), partitions=2)
    produced = pipeline.produce(40)
    produce_in_transaction(pipeline, range(40, 45))
    produced += pipeline.produce(20, start_id=45) + 5
    produce_in_transaction(pipeline, range(65, 68))
    produced += 3
    with coordinator(pipeline), participants(pipeline, tasks=1):
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed")
        assert_committed_to_the_log_end(pipeline)

        failed = failpoints.arm("stage.after-insert", "raise*1", who="task-0")
        produce_in_transaction(pipeline, range(68, 78))
        produced += pipeline.produce(10, start_id=78) + 10
        produce_in_transaction(pipeline, range(88, 90), partition=1)
        produced += 2
        assert failed.reached.wait(60), "no chunk was staged after the markers"
        wait_until(lambda: pipeline.target_count() == produced, 60, "every record committed after the abort")
        assert_committed_to_the_log_end(pipeline)
    history = pipeline.ledger().history(limit=1000)
    assert any(t.state == "ABORTED" and "staging crashed" in t.reason for t in history), [t.reason for t in history]
    assert_exactly_once(pipeline, produced, nothing_lost=True)
    deep = chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    report = json.loads(deep.stdout)
    assert deep.returncode == 0 and report["outcome"] == "OK", deep.stdout + deep.stderr
    assert sum(p["skipped"] for p in report["deep"]["partitions"]) == 4, report  # a marker per Kafka transaction
