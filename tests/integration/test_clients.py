"""Client factories against the session's broker and ClickHouse, and against nothing at all."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest
from confluent_kafka import Consumer, Producer

from clients import kafka as kafka_clients
from clients.clickhouse import InsertBody, make_client, shard_client
from protocol.config.parse import parse_config
from protocol.config.sections import ClickHouseSection
from protocol.errors import ClickHouseError, SetupError
from protocol.messages import TopicPartition
from tests.helpers import create_topic, unique_name


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(bootstrap: str, topics: list[str]):  # PipelineConfig
    listed = ", ".join(f'"{t}"' for t in topics)
    return parse_config(
        f'[pipeline]\nname = "p"\ntopics = [{listed}]\n[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        '[kafka.properties]\n"client.id" = "from-properties"\n[clickhouse]\ntarget_table = "t"\n',
        {},
    )


def test_configs_merge_defaults_properties_and_extra(stack) -> None:
    cfg = config(stack.kafka_bootstrap, ["a"])
    consumer = kafka_clients.consumer_conf(cfg, **{"client.id": "explicit"})
    assert consumer["group.id"] == "p" and consumer["enable.auto.commit"] is False
    assert consumer["auto.offset.reset"] == "earliest"
    assert consumer["client.id"] == "explicit"  # extra beats properties
    producer = kafka_clients.producer_conf(cfg)
    assert producer["enable.idempotence"] is True and producer["acks"] == "all"
    assert producer["client.id"] == "from-properties"  # properties beat defaults
    # both are accepted by librdkafka as they are
    Consumer(consumer).close()
    p = Producer(producer)
    p.produce(create_topic(kafka_clients.admin(cfg), unique_name("conf"), 1), b"x")
    assert p.flush(30) == 0


def test_partitions_of_lists_sorted_partitions_and_names_a_missing_topic(stack, kafka_admin) -> None:
    b = create_topic(kafka_admin, unique_name("b"), 3)
    a = create_topic(kafka_admin, unique_name("a"), 2)
    parts = kafka_clients.partitions_of(kafka_admin, [b, a])
    assert parts == sorted(parts)
    assert parts == [TopicPartition(topic=a, partition=p) for p in (0, 1)] + [
        TopicPartition(topic=b, partition=p) for p in (0, 1, 2)
    ]
    missing = unique_name("missing")
    with pytest.raises(SetupError, match=f"Kafka topic '{missing}' does not exist.*create it"):
        kafka_clients.partitions_of(kafka_admin, [a, missing], bootstrap=stack.kafka_bootstrap)
    assert missing not in kafka_admin.list_topics(timeout=10).topics  # asking did not create it


def test_create_topics_is_idempotent_and_checks_the_control_topic(stack, kafka_admin) -> None:
    control, dlq = unique_name("ctl"), unique_name("dlq")
    assert kafka_clients.create_topics(kafka_admin, {control: 1, dlq: 4}) == {control: True, dlq: True}
    assert kafka_clients.create_topics(kafka_admin, {control: 1, dlq: 4}) == {control: False, dlq: False}
    assert len(kafka_admin.list_topics(timeout=10).topics[dlq].partitions) == 4
    kafka_clients.check_control_topic(kafka_admin, control)
    with pytest.raises(SetupError, match=f"control topic {dlq} has 4 partitions; chtxn needs exactly 1"):
        kafka_clients.check_control_topic(kafka_admin, dlq)
    with pytest.raises(SetupError, match="does not exist: run chtxn init"):
        kafka_clients.check_control_topic(kafka_admin, unique_name("none"))


def test_an_unreachable_broker_fails_within_the_timeout_naming_it() -> None:
    bootstrap = f"127.0.0.1:{closed_port()}"
    admin = kafka_clients.admin(config(bootstrap, ["a"]))
    with pytest.raises(kafka_clients.BrokerUnreachable) as info:
        kafka_clients.partitions_of(admin, ["a"], timeout_s=1.5, bootstrap=bootstrap)
    assert f"cannot reach a Kafka broker at {bootstrap} within 1.5 s" in str(info.value)
    assert "chtxn embedded up" in str(info.value)


def test_make_client_talks_to_clickhouse(stack, ch_database: str) -> None:
    url = urlsplit(stack.clickhouse_url)
    section = ClickHouseSection(
        url=f"{url.scheme}://{url.hostname}:{stack.clickhouse_port}",
        database=ch_database,
        user=url.username or "default",
        password=url.password or "",
        target_table="t",
        insert_settings={"max_insert_block_size": 12345},
    )
    client = make_client(section)
    assert str(client.command("SELECT getSetting('async_insert')")).lower() in ("0", "false")
    assert str(client.command("SELECT getSetting('max_insert_block_size')")) == "12345"  # insert_settings apply
    assert client.command("SELECT currentDatabase()") == ch_database


def test_an_insert_body_is_sent_whole_by_command(stack, ch_database: str) -> None:
    """``InsertBody`` answers "" when clickhouse-connect decodes it to classify the request; what goes
    to the server must still be every byte: each row lands as written, non-ASCII text included."""
    client = make_client(ClickHouseSection(url=stack.clickhouse_url, database=ch_database, target_table="t"))
    client.command("CREATE TABLE bodies (n UInt32, s String) ENGINE = MergeTree ORDER BY n")
    rows = [(n, f"Zürich {n} café") for n in range(5_000)]
    body = b"\n".join(json.dumps({"n": n, "s": s}, ensure_ascii=False).encode() for n, s in rows)
    summary = client.command(
        "INSERT INTO bodies SELECT n, s FROM input('n UInt32, s String') FORMAT JSONEachRow", data=InsertBody(body)
    )
    assert summary.written_rows == len(rows)
    stored = client.query("SELECT n, s FROM bodies ORDER BY n").result_rows
    assert [tuple(r) for r in stored] == rows


def test_make_client_names_an_unreachable_server() -> None:
    section = ClickHouseSection(url=f"http://127.0.0.1:{closed_port()}", target_table="t", connect_timeout_s=2)
    with pytest.raises(ClickHouseError) as info:
        make_client(section)
    assert f"cannot connect to ClickHouse at {section.url}" in str(info.value)
    assert info.value.retryable and "clickhouse.url" in str(info.value)


def test_a_shard_that_cannot_be_reached_is_named_by_its_entry_in_clickhouse_shards() -> None:
    section = ClickHouseSection(url=f"http://127.0.0.1:{closed_port()}", target_table="t", connect_timeout_s=2)
    with pytest.raises(ClickHouseError) as info:
        shard_client(2, section)
    assert f"cannot connect to ClickHouse at {section.url}" in str(info.value)
    assert "check clickhouse.shards[2] (shard 3)," in str(info.value) and "clickhouse.url" not in str(info.value)
