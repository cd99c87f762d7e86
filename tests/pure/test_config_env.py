"""Environment overrides: a refused value is named by its variable (secrets masked), a misspelled
variable is found with its likely spelling, and ``--config`` falls back to CHTXN_CONFIG or
./pipeline.toml."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.config_option import default_config
from protocol.config.env import override_variables, unknown_variables
from protocol.errors import ConfigError
from tests.pure.test_config import BASE, error_of


@pytest.mark.parametrize(
    ("var", "raw", "why"),
    [
        ("CHTXN_TRANSACTION_INTERVAL_S", "abc", "Expected `float`"),
        ("CHTXN_TRANSACTION_INTERVAL_S", "-1", "must be greater than 0"),
        ("CHTXN_CLICKHOUSE_URL", "ftp://ch:8123", "must start with http:// or https://"),
        ("CHTXN_PIPELINE_START_FROM", "middle", "Invalid enum value"),
    ],
)
def test_a_bad_env_value_is_named_by_its_variable_not_the_file(var: str, raw: str, why: str) -> None:
    err = error_of(BASE, {var: raw})
    assert str(err).startswith(f"{var}={raw!r}: "), err
    assert why in str(err) and "from the environment" in str(err)
    assert not str(err).startswith("pipeline.toml:")


def test_a_bad_value_in_the_file_still_names_the_file() -> None:
    err = error_of(BASE + "[transaction]\ninterval_s = -1\n", {"CHTXN_CLICKHOUSE_URL": "http://ch:8123"})
    assert str(err).startswith("pipeline.toml: transaction.interval_s = -1.0: ")


def test_an_env_topic_list_names_the_bad_topic() -> None:
    err = error_of(BASE, {"CHTXN_PIPELINE_TOPICS": "good, bad topic"})
    assert str(err).startswith("CHTXN_PIPELINE_TOPICS='good, bad topic' (pipeline.topics = 'bad topic'): ")


def test_a_password_from_the_env_stays_masked() -> None:
    url = "http://alice:url-pw-42@h:8123"
    err = error_of(BASE, {"CHTXN_CLICKHOUSE_URL": url})  # differs from clickhouse.password
    assert "url-pw-42" not in str(err) and "s3cret-pw" not in str(err)
    assert str(err).startswith("CHTXN_CLICKHOUSE_URL='http://alice:***@h:8123': holds a password")


def test_a_misspelled_variable_gets_its_likely_spelling() -> None:
    environ = {
        "CHTXN_CLICKHOUSE_UR": "x",
        "CHTXN_TRANSACTION_INTERVAL": "1",
        "CHTXN_WHATEVER": "x",
        "CHTXN_CLICKHOUSE_URL": "http://h:8123",
        "CHTXN_CONFIG": "p.toml",
        "CHTXN_FAILPOINTS": "",
        "CHTXN_EMBEDDED_KEEPER": "127.0.0.1:1",
        "CHTXN_TEST_KAFKA": "h:9092",
        "PATH": "/bin",
    }
    assert unknown_variables(environ) == [
        ("CHTXN_CLICKHOUSE_UR", "CHTXN_CLICKHOUSE_URL"),
        ("CHTXN_TRANSACTION_INTERVAL", "CHTXN_TRANSACTION_INTERVAL_S"),
        ("CHTXN_WHATEVER", None),
    ]


def test_every_override_variable_is_known() -> None:
    variables = override_variables()
    assert variables["CHTXN_KAFKA_BOOTSTRAP_SERVERS"] == "kafka.bootstrap_servers"
    assert unknown_variables(dict.fromkeys(variables, "")) == []


def test_the_default_config_is_chtxn_config_then_pipeline_toml(tmp_path: Path) -> None:
    assert default_config({"CHTXN_CONFIG": "/etc/p.toml"}, tmp_path) == "/etc/p.toml"
    with pytest.raises(ConfigError) as info:
        default_config({}, tmp_path)
    assert str(info.value) == (
        f"no pipeline config: --config not given, CHTXN_CONFIG not set, and no ./pipeline.toml in {tmp_path}; "
        "pass --config FILE"
    )
    (tmp_path / "pipeline.toml").write_text(BASE)
    assert default_config({}, tmp_path) == "pipeline.toml"
    assert default_config({"CHTXN_CONFIG": "other.toml"}, tmp_path) == "other.toml"
