"""``chtxn embedded up | status | down`` as a user runs them: separate processes, another shell's
clients, and no process of the stack left after ``down``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest

from tests.helpers import gone, run_chtxn, wait_until

#: ``chtxn``, failing the test on a non-zero exit unless called with ``check=False``.
chtxn = partial(run_chtxn, check=True)


@pytest.fixture
def data_dir(tmp_path: Path):
    """A data directory whose stack is brought down at the end, whatever the test did."""
    directory = tmp_path / "embedded"
    yield directory
    chtxn("embedded", "down", "--data-dir", str(directory), check=False)


def up(data_dir: Path) -> dict:
    result = chtxn(
        "embedded", "up", "--data-dir", str(data_dir), "--kafka-port", "0", "--clickhouse-port", "0", "--json"
    )
    return json.loads(result.stdout)


CLIENT_SCRIPT = textwrap.dedent("""
    import json, os, time
    import clickhouse_connect
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = os.environ["CHTXN_KAFKA_BOOTSTRAP_SERVERS"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic("cli_demo", 2, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(10):
        producer.produce("cli_demo", json.dumps({"id": i}).encode(), partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cli", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("cli_demo", p, 0) for p in range(2)])
    records, deadline = [], time.monotonic() + 60
    while len(records) < 10 and time.monotonic() < deadline:
        records += [json.loads(m.value()) for m in consumer.consume(100, 0.2) if m.error() is None]
    consumer.close()

    client = clickhouse_connect.get_client(dsn=os.environ["CHTXN_CLICKHOUSE_URL"])
    client.command("CREATE TABLE cli_demo (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.insert("cli_demo", [[r["id"]] for r in records], column_names=["id"])
    total = client.query("SELECT count(), sum(id) FROM cli_demo").result_rows[0]
    print(json.dumps({"consumed": len(records), "count": total[0], "sum": total[1]}))
""")


def test_up_serves_other_processes_and_down_leaves_nothing(data_dir):
    started = up(data_dir)
    assert started["already_up"] is False and started["started"] == ["kafka", "clickhouse"]
    state = json.loads((data_dir / "state.json").read_text())
    pids = [c["pid"] for c in state["components"].values()]
    assert len(pids) == 2 and not any(gone(pid) for pid in pids)

    env = {**os.environ, **started["env"]}
    client = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert client.returncode == 0, client.stderr
    assert json.loads(client.stdout) == {"consumed": 10, "count": 10, "sum": 45}

    status = chtxn("embedded", "status", "--data-dir", str(data_dir), "--json")
    report = json.loads(status.stdout)
    assert report["up"] is True
    assert {n: (c["pid"], c["running"], c["answering"]) for n, c in report["components"].items()} == {
        "kafka": (state["components"]["kafka"]["pid"], True, True),
        "clickhouse": (state["components"]["clickhouse"]["pid"], True, True),
    }

    again = up(data_dir)
    assert again["already_up"] is True and again["started"] == []
    assert again["kafka_bootstrap"] == started["kafka_bootstrap"]

    down = chtxn("embedded", "down", "--data-dir", str(data_dir))
    assert "stopped" in down.stdout
    for pid in pids:
        wait_until(lambda pid=pid: gone(pid), 30, f"pid {pid} of the stack to exit")
    assert not (data_dir / "state.json").exists()
    after = chtxn("embedded", "status", "--data-dir", str(data_dir), "--json", check=False)
    assert after.returncode == 1 and json.loads(after.stdout)["up"] is False


def test_up_restarts_only_what_died(data_dir):
    first = up(data_dir)
    kafka_pid = first["components"]["kafka"]["pid"]
    clickhouse_pid = first["components"]["clickhouse"]["pid"]
    os.kill(clickhouse_pid, signal.SIGKILL)
    wait_until(lambda: gone(clickhouse_pid), 30, "the killed ClickHouse endpoint to exit")

    status = chtxn("embedded", "status", "--data-dir", str(data_dir), check=False)
    assert status.returncode == 1 and "stopped" in status.stdout

    second = up(data_dir)
    assert second["started"] == ["clickhouse"]
    assert second["components"]["kafka"]["pid"] == kafka_pid
    assert second["components"]["clickhouse"]["pid"] != clickhouse_pid
    assert chtxn("embedded", "status", "--data-dir", str(data_dir)).returncode == 0


def test_down_never_signals_a_process_it_did_not_start(data_dir):
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        data_dir.mkdir(parents=True)
        # A recorded pid now owned by another process (a recycled pid): its start time differs.
        recorded = {
            "pid": bystander.pid,
            "token": "linux:0",
            "port": 1,
            "address": "127.0.0.1:1",
            "log": "",
            "started_at": "",
        }
        (data_dir / "state.json").write_text(json.dumps({"components": {"kafka": recorded}}))
        down = chtxn("embedded", "down", "--data-dir", str(data_dir))
        assert "nothing was running" in down.stdout
        assert bystander.poll() is None, "down signalled a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()


def test_every_subcommand_has_help_with_an_example():
    for sub in ("up", "down", "status", "topic", "topic create", "sql"):
        text = chtxn("embedded", *sub.split(), "--help").stdout
        assert "Example" in text and f"chtxn embedded {sub}" in text


def test_down_then_up_keeps_topics_records_and_a_pipeline_that_resumes_exactly_once(data_dir, tmp_path):
    """The broker keeps its topics and records in DATA_DIR/kafka: a pipeline stopped, the stack
    brought down and up again (same ports), and the pipeline started again goes on from its ledger
    over the same logs, every record exactly once."""
    from confluent_kafka import Consumer

    from clients.log_ends import CONSUMER_PROPERTIES, log_ends
    from tests.conftest import TestStack
    from tests.integration.scripted_participants import ScriptedParticipants
    from tests.integration.test_coordinator_publish import ServiceThread
    from tests.pipelines import make_pipeline

    started = up(data_dir)
    ports = [f"--{name}-port={started['components'][name]['port']}" for name in ("kafka", "clickhouse")]
    stack = TestStack(tmp_path / "unused", kafka=started["kafka_bootstrap"])
    stack.external_clickhouse = started["clickhouse_url"]
    pipeline = make_pipeline(stack, tmp_path, "kept")
    first = pipeline.produce(100)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
    more = pipeline.produce(50, start_id=first)  # produced, not yet read, when the stack goes down

    chtxn("embedded", "down", "--data-dir", str(data_dir))
    again = json.loads(chtxn("embedded", "up", "--data-dir", str(data_dir), *ports, "--json").stdout)
    assert again["started"] == ["kafka", "clickhouse"], again
    assert again["kafka_bootstrap"] == started["kafka_bootstrap"], again["notes"]
    consumer = Consumer({**CONSUMER_PROPERTIES, "bootstrap.servers": started["kafka_bootstrap"], "group.id": "ends"})
    try:
        ends = log_ends(consumer, [(tp.topic, tp.partition) for tp in pipeline.partitions])
    finally:
        consumer.close()
    assert sorted(ends.values()) == [(first + more) // 2] * 2, f"the broker lost records: log ends {ends}"

    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c2"):
        wait_until(lambda: pipeline.target_count() == first + more, 60, "the records kept by the broker committed")
    report = pipeline.oracle()
    assert report.ok and report.rows_in_target == first + more, report.anomalies
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
