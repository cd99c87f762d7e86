"""Config errors name the key, the value and why; env overrides; secrets stay out of repr."""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.config.parse import load_config, parse_config
from protocol.errors import ConfigError

BASE = """
[pipeline]
name = "orders"
topics = ["src-a", "src-b"]

[clickhouse]
target_table = "events"
password = "s3cret-pw"
"""


def error_of(text: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, environ or {}, source="pipeline.toml")
    return info.value


def test_a_minimal_config_gets_defaults_and_derived_names() -> None:
    cfg = parse_config(BASE, {})
    assert cfg.name == "orders"
    assert cfg.pipeline.topics == ("src-a", "src-b")
    assert cfg.control_topic == "orders.chtxn-control"
    assert cfg.dead_letter_topic == "orders.chtxn-dlq"
    assert cfg.heartbeat_timeout_s == cfg.transaction.heartbeat_interval_s * cfg.transaction.heartbeat_misses


@pytest.mark.parametrize(
    ("extra", "path"),
    [
        ("[transaction]\nintervall_s = 2\n", "transaction.intervall_s"),
        ("[participant]\nchunk_row = 5\n", "participant.chunk_row"),
        ("[bogus]\nx = 1\n", "bogus"),
    ],
)
def test_an_unknown_key_names_its_path(extra: str, path: str) -> None:
    err = error_of(BASE + extra)
    assert err.key == path
    assert f"unknown key {path!r}" in str(err)
    assert str(err).startswith("pipeline.toml: ")


@pytest.mark.parametrize(
    ("extra", "close"),
    [
        ("[transaction]\nintervall_s = 2\n", "interval_s"),
        ("[participant]\nchunk_row = 5\n", "chunk_rows"),
        ("[transacton]\ninterval_s = 2\n", "transaction"),
        ('[[route]]\ntopics = ["a"]\ntabel = "t"\n', "table"),
    ],
)
def test_an_unknown_key_close_to_a_known_one_names_it(extra: str, close: str) -> None:
    assert f"did you mean {close!r}?" in str(error_of(BASE + extra))


def test_an_unknown_key_far_from_every_known_one_points_at_the_docs() -> None:
    assert "check its spelling against the docs" in str(error_of(BASE + "[bogus]\nx = 1\n"))


def test_an_unknown_key_inside_an_existing_section() -> None:
    err = error_of(BASE.replace("[clickhouse]", '[clickhouse]\nurll = "http://x:8123"'))
    assert err.key == "clickhouse.urll"


@pytest.mark.parametrize(
    ("extra", "key", "value", "why"),
    [
        ("[transaction]\ninterval_s = 'fast'\n", "transaction.interval_s", "fast", "Expected `float`"),
        ("[transaction]\ninterval_s = -1\n", "transaction.interval_s", -1.0, "must be greater than 0"),
        ("[transaction]\nidle_interval_s = -1\n", "transaction.idle_interval_s", -1.0, "must be 0 or more"),
        ("[transaction]\npublish_mode = 'copy'\n", "transaction.publish_mode", "copy", "Invalid enum value"),
        ("[participant]\nchunk_rows = 0\n", "participant.chunk_rows", 0, "must be greater than 0"),
        (
            "[transaction]\nheartbeat_misses = 100\n",
            "transaction.heartbeat_misses",
            100,
            "must be shorter than write_status_timeout_s",
        ),
        ("[kafka.properties]\n'group.id' = 'x'\n", "kafka.properties", {"group.id": "x"}, "group ids are chtxn's"),
        ("[coordinator]\nclickhouse_nice = -21\n", "coordinator.clickhouse_nice", -21, "between -20 (first) and 19"),
        ("[coordinator]\nclickhouse_nice = 20\n", "coordinator.clickhouse_nice", 20, "between -20 (first) and 19"),
    ],
)
def test_a_bad_value_names_key_value_and_reason(extra: str, key: str, value: object, why: str) -> None:
    err = error_of(BASE + extra)
    assert (err.key, err.value) == (key, value)
    assert f"{key} = {value!r}" in str(err)
    assert why in str(err)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (BASE.replace('"orders"', '"1orders"'), "pipeline.name"),
        (BASE.replace('target_table = "events"', 'target_table = "db.events"'), "clickhouse.target_table"),
        (BASE.replace('topics = ["src-a", "src-b"]', "topics = []"), "pipeline.topics"),
        (BASE.replace('topics = ["src-a", "src-b"]', 'topics = ["bad topic"]'), "pipeline.topics"),
        (BASE + '[kafka]\nbootstrap_servers = "h:9092"\n[pipeline.x]\n', "pipeline.x"),
    ],
)
def test_invalid_values_are_refused(text: str, key: str) -> None:
    assert error_of(text).key == key


def test_not_toml_is_refused_with_the_file_name() -> None:
    assert "pipeline.toml: not valid TOML" in str(error_of("[pipeline\n"))


def test_env_overrides_every_kind_of_field() -> None:
    cfg = parse_config(
        BASE,
        {
            "CHTXN_TRANSACTION_INTERVAL_S": "2.5",
            "CHTXN_PIPELINE_TOPICS": "a, b ,c",
            "CHTXN_CLICKHOUSE_PASSWORD": "from-env",
            "CHTXN_KAFKA_BOOTSTRAP_SERVERS": "broker:9093",
            "CHTXN_PIPELINE_START_FROM": "latest",
            "CHTXN_PARTICIPANT_CHUNK_ROWS": "1000",
        },
    )
    assert cfg.transaction.interval_s == 2.5
    assert cfg.pipeline.topics == ("a", "b", "c")
    assert cfg.clickhouse.password == "from-env"
    assert cfg.kafka.bootstrap_servers == "broker:9093"
    assert cfg.pipeline.start_from == "latest"
    assert cfg.participant.chunk_rows == 1000


def test_a_bad_env_value_names_the_key() -> None:
    err = error_of(BASE, {"CHTXN_TRANSACTION_INTERVAL_S": "abc"})
    assert (err.key, err.value) == ("transaction.interval_s", "abc")


def test_a_table_cannot_come_from_the_env() -> None:
    err = error_of(BASE, {"CHTXN_CLICKHOUSE_INSERT_SETTINGS": "a=1"})
    assert err.key == "clickhouse.insert_settings"
    assert "CHTXN_CLICKHOUSE_INSERT_SETTINGS" in str(err) and "set it in the TOML file" in str(err)


def test_the_password_never_appears_in_repr() -> None:
    cfg = parse_config(BASE, {})
    for text in (repr(cfg), str(cfg), repr(cfg.clickhouse), str(cfg.clickhouse)):
        assert "s3cret-pw" not in text
        assert "password=***" in text
    no_password = parse_config(BASE.replace('password = "s3cret-pw"', ""), {})
    assert "password=''" in repr(no_password.clickhouse)


def test_load_config_reads_a_file_and_names_a_missing_one(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(BASE)
    assert load_config(str(path), {}).name == "orders"
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "nope.toml"), {})
    assert "nope.toml" in str(info.value) and "--config" in str(info.value)
    path.write_text(BASE + "[transaction]\ninterval_s = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {})
    assert str(info.value).startswith(f"{path}: transaction.interval_s = 0")
