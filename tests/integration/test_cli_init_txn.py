"""``chtxn init`` and ``chtxn txn list/show`` run as an operator runs them, against the session's
broker and ClickHouse."""

from __future__ import annotations

import json
import socket
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from protocol.config.parse import load_config
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from tests.helpers import create_topic, run_chtxn, unique_name

#: The installed ``chtxn`` script, without the session's ``CHTXN_*`` settings.
chtxn = partial(run_chtxn, timeout_s=120, installed=True, inherit_chtxn_vars=False, env={"COLUMNS": "200"})


def write_config(path: Path, stack, database: str, **over: str) -> Path:  # TestStack
    url = urlsplit(stack.clickhouse_url)
    values = {
        "name": unique_name("pipe"),
        "topics": "[]",
        "bootstrap": stack.kafka_bootstrap,
        "url": f"{url.scheme}://{url.hostname}:{stack.clickhouse_port}",
        "user": url.username or "default",
        "password": url.password or "",
        "database": database,
        "target": "events",
        "control": "",
        **over,
    }
    path.write_text(
        "[pipeline]\n"
        f'name = "{values["name"]}"\ntopics = {values["topics"]}\n'
        + (f'control_topic = "{values["control"]}"\n' if values["control"] else "")
        + f'[kafka]\nbootstrap_servers = "{values["bootstrap"]}"\n'
        f'[clickhouse]\nurl = "{values["url"]}"\nuser = "{values["user"]}"\npassword = "{values["password"]}"\n'
        f'database = "{values["database"]}"\ntarget_table = "{values["target"]}"\n'
    )
    return path


@pytest.fixture(scope="module")
def target(ch_client, ch_database: str) -> str:  # clickhouse-connect client
    ch_client.command(f"CREATE TABLE `{ch_database}`.events (id UInt64, body String) ENGINE = MergeTree ORDER BY id")
    return "events"


def statuses(report: dict) -> dict[str, str]:
    return {item["name"]: item["status"] for item in report["items"]}


def test_init_creates_then_finds(stack, kafka_admin, ch_database: str, target: str, tmp_path: Path) -> None:
    a = create_topic(kafka_admin, unique_name("src_a"), 2)
    b = create_topic(kafka_admin, unique_name("src_b"), 3)
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics=json.dumps([a, b]))
    cfg = load_config(str(path), {})

    first = chtxn("init", "--config", str(path), "--json")
    assert first.returncode == 0, first.stderr + first.stdout
    report = json.loads(first.stdout)
    assert report["ok"] and report["problems"] == []
    found = statuses(report)
    assert found[cfg.control_topic] == "created"
    assert found[cfg.dead_letter_topic] == "created"
    assert found[f"{ch_database}.chtxn_ledger"] in ("created", "found")  # another test may have made it
    assert found[a] == found[b] == found[f"{ch_database}.events"] == "found"
    topics = kafka_admin.list_topics(timeout=10).topics
    assert len(topics[cfg.control_topic].partitions) == 1
    assert len(topics[cfg.dead_letter_topic].partitions) == 3  # the widest source topic

    second = chtxn("init", "--config", str(path), "--json")
    assert second.returncode == 0, second.stderr + second.stdout
    again = statuses(json.loads(second.stdout))
    assert again[cfg.control_topic] == again[cfg.dead_letter_topic] == again[f"{ch_database}.chtxn_ledger"] == "found"

    people = chtxn("init", "--config", str(path))
    assert people.returncode == 0 and "ready" in people.stdout and cfg.control_topic in people.stdout


def test_init_refuses_a_control_topic_with_two_partitions(
    stack, kafka_admin, ch_database: str, target: str, tmp_path: Path
) -> None:
    src = create_topic(kafka_admin, unique_name("src"), 1)
    control = create_topic(kafka_admin, unique_name("ctl"), 2)
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics=json.dumps([src]), control=control)
    result = chtxn("init", "--config", str(path), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert statuses(report)[control] == "wrong"
    assert any(
        f"control topic {control} has 2 partitions; chtxn needs exactly 1: delete and recreate it with one "
        "partition, or point pipeline.control_topic at a new topic" in p
        for p in report["problems"]
    ), report["problems"]


def test_init_says_what_is_missing(stack, kafka_admin, ch_database: str, target: str, tmp_path: Path) -> None:
    missing_topic = unique_name("nosuch")
    path = write_config(
        tmp_path / "p.toml", stack, ch_database, topics=json.dumps([missing_topic]), target="nosuch_table"
    )
    result = chtxn("init", "--config", str(path), env={"COLUMNS": "80"})
    assert result.returncode == 1
    out = result.stdout
    assert f"source topic {missing_topic} does not exist" in out and "kafka-topics.sh --create" in out
    assert f"target table {ch_database}.nosuch_table does not exist: create it" in out
    assert "…" not in out and all(line == line.rstrip() for line in out.splitlines()), "a pipe gets whole lines"
    assert any(line.split()[:3] == ["clickhouse", "table", f"{ch_database}.nosuch_table"] for line in out.splitlines())
    [failure] = [line for line in result.stderr.splitlines() if line.startswith("chtxn: ")]
    assert failure == result.stderr.strip().splitlines()[-1]
    assert (
        failure.startswith(f"chtxn: source topic {missing_topic} does not exist")
        and "(and 1 more problem above)" in failure
    )


def test_init_names_an_unreachable_broker(stack, ch_database: str, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics='["src"]', bootstrap=closed)
    result = chtxn("init", "--config", str(path), "--timeout", "2", "--json")
    assert result.returncode == 1
    [problem] = [p for p in json.loads(result.stdout)["problems"] if "Kafka" in p]
    assert f"cannot reach a Kafka broker at {closed} within 2 s" in problem
    assert "kafka.bootstrap_servers" in problem


@pytest.fixture
def ledger_pipeline(stack, ch_database: str, target: str, tmp_path: Path):
    """A config and the ledger store of a fresh pipeline, with the ledger table in place."""
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics='["src"]')
    cfg = load_config(str(path), {})
    store = LedgerStore(make_client(cfg.clickhouse), ch_database, cfg.name)
    store.ensure_tables()
    return path, store


def test_txn_list_and_show(ledger_pipeline) -> None:
    path, store = ledger_pipeline
    p = store.pipeline
    r = PartitionRange(topic="src", partition=0, start=0, end=42, rows=40)
    store.append(LedgerRow(pipeline=p, txn="e1_t1", event=LedgerEvent.STARTED, epoch=1, started_at=100.0))
    assert store.claim_commit(
        LedgerRow(
            pipeline=p,
            txn="e1_t1",
            event=LedgerEvent.COMMITTED,
            epoch=1,
            commit_seq=1,
            coordinator="c1",
            ranges=(r,),
            total_rows=40,
            dead_letters=2,
            started_at=100.0,
            ended_at=101.0,
            committed_at=101.2,
        )
    )
    store.append(LedgerRow(pipeline=p, txn="e1_t2", event=LedgerEvent.STARTED, epoch=1, started_at=102.0))
    store.append(LedgerRow(pipeline=p, txn="e1_t2", event=LedgerEvent.ABORTED, epoch=1, reason="write-status timeout"))

    listed = chtxn("txn", "list", "--config", str(path), "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(t["txn"], t["state"]) for t in json.loads(listed.stdout)] == [("e1_t2", "ABORTED"), ("e1_t1", "COMMITTED")]

    aborted = json.loads(chtxn("txn", "list", "--config", str(path), "--json", "--state", "aborted").stdout)
    assert [(t["txn"], t["reason"]) for t in aborted] == [("e1_t2", "write-status timeout")]
    assert len(json.loads(chtxn("txn", "list", "--config", str(path), "--json", "--limit", "1").stdout)) == 1

    shown = chtxn("txn", "show", "e1_t1", "--config", str(path), "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert (detail["state"], detail["epoch"], detail["commit_seq"], detail["total_rows"]) == ("COMMITTED", 1, 1, 40)
    assert detail["ranges"] == [{"topic": "src", "partition": 0, "start": 0, "end": 42, "rows": 40, "table": ""}]
    assert (detail["consume_ms"], detail["commit_ms"], detail["dead_letters"]) == (1000.0, 200.0, 2)

    table = chtxn("txn", "list", "--config", str(path))
    assert table.returncode == 0 and "e1_t1" in table.stdout and "write-status timeout" in table.stdout
    people = chtxn("txn", "show", "e1_t1", "--config", str(path))
    assert people.returncode == 0 and "COMMITTED" in people.stdout and "42" in people.stdout

    unknown = chtxn("txn", "show", "e7_t7", "--config", str(path))
    assert unknown.returncode == 1 and "no ledger rows for txn 'e7_t7'" in unknown.stderr


def test_txn_list_without_a_ledger_says_to_run_init(stack, ch_client, tmp_path: Path) -> None:
    empty_db = unique_name("t_noledger")
    ch_client.command(f"CREATE DATABASE `{empty_db}`")
    try:
        path = write_config(tmp_path / "p.toml", stack, empty_db, topics='["src"]')
        result = chtxn("txn", "list", "--config", str(path))
        assert result.returncode == 1
        assert (
            f"the ledger table {empty_db}.chtxn_ledger does not exist: run chtxn init --config {path}" in result.stderr
        )
    finally:
        ch_client.command(f"DROP DATABASE IF EXISTS `{empty_db}`")
