"""``chtxn config check``: every effective value with its source, secrets masked, the offline checks, and
the exit codes (0, 1 on a failed check, 2 on a refused config). No server is contacted."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from cli import main
from cli.config_cmd import report
from protocol.config.parse import PipelineConfig

CONFIG = """
[pipeline]
name = "orders"
topics = ["orders"]

[kafka.properties]
"sasl.password" = "kafka-secret-1"
"compression.type" = "lz4"

[clickhouse]
url = "http://alice:pw-in-url-7@127.0.0.1:8123"
target_table = "events"

[transaction]
interval_s = 1.0

[coordinator]
id = "c1"
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(CONFIG)
    return path


def test_every_value_names_its_source(config: Path) -> None:
    settings = report(str(config), {"CHTXN_TRANSACTION_INTERVAL_S": "3"}).settings
    assert settings["transaction.interval_s"] == {"value": 3.0, "source": "CHTXN_TRANSACTION_INTERVAL_S"}
    assert settings["clickhouse.target_table"] == {"value": "events", "source": "file"}
    assert settings["transaction.write_status_timeout_s"] == {"value": 30.0, "source": "default"}
    assert settings["pipeline.control_topic"] == {
        "value": "orders.chtxn-control",
        "source": "default, from pipeline.name",
    }
    assert settings["ledger.keeper_path"] == {"value": "/chtxn/default", "source": "default, from clickhouse.database"}
    assert settings["clickhouse.user"] == {"value": "alice", "source": "clickhouse.url (file)"}
    assert settings['kafka.properties."compression.type"'] == {"value": "lz4", "source": "file"}
    # every field of every section is there, a table by its entries
    fields = {
        f"{section}.{field.name}"
        for section in PipelineConfig.__struct_fields__
        if section != "route"  # [[route]] entries, one setting each (none here)
        for field in msgspec.structs.fields(getattr(PipelineConfig(), section))
    }
    assert {k.split('."')[0] for k in settings} == fields


def test_secrets_are_masked_wherever_they_came_from(config: Path) -> None:
    environ = {"CHTXN_CLICKHOUSE_URL": "https://bob:pw-from-env-9@ch.example:8443"}
    result = report(str(config), environ)
    text = json.dumps(result.settings)
    assert "pw-from-env-9" not in text and "kafka-secret-1" not in text
    assert result.settings["clickhouse.password"] == {"value": "***", "source": "clickhouse.url (CHTXN_CLICKHOUSE_URL)"}
    assert result.settings["clickhouse.url"]["value"] == "https://ch.example:8443"
    assert result.settings['kafka.properties."sasl.password"']["value"] == "***"


def test_a_clean_config_passes_with_a_warning_for_the_password_in_the_file(config: Path) -> None:
    result = report(str(config), {})
    verdicts = {c.name: c.status for c in result.checks}
    assert verdicts == {
        "config": "ok",
        "environment": "ok",
        "kafka.properties": "ok",  # compression.type is the producer's: ignored by consumers, no warning
        "secrets": "warn",
        "coordinator.id": "ok",
    }
    assert result.ok
    secrets = next(c for c in result.checks if c.name == "secrets")
    assert secrets.found == "the ClickHouse password is in the config file"  # loopback: plain http is fine


def test_the_password_sent_in_clear_to_another_host_is_a_warning(config: Path) -> None:
    environ = {"CHTXN_CLICKHOUSE_URL": "http://ch.example:8123", "CHTXN_CLICKHOUSE_PASSWORD": "x" * 8}
    secrets = next(c for c in report(str(config), environ).checks if c.name == "secrets")
    assert (secrets.status, secrets.found) == ("warn", "the ClickHouse password goes to ch.example over plain http")


def test_a_misspelled_variable_fails_with_its_likely_spelling(config: Path) -> None:
    result = report(str(config), {"CHTXN_CLICKHOUSE_DATABSE": "x"})
    environment = next(c for c in result.checks if c.name == "environment")
    assert environment.status == "fail" and not result.ok
    assert "CHTXN_CLICKHOUSE_DATABSE (did you mean CHTXN_CLICKHOUSE_DATABASE?)" in environment.found


def test_a_property_librdkafka_refuses_fails_and_one_it_warns_about_warns(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(CONFIG.replace('"compression.type" = "lz4"', '"compression.type" = "lz5"'))
    check = next(c for c in report(str(bad), {}).checks if c.name == "kafka.properties")
    assert check.status == "fail" and 'Invalid value "lz5"' in check.found
    odd = tmp_path / "odd.toml"
    odd.write_text(CONFIG.replace('"compression.type" = "lz4"', '"sasl.mechanism" = "PLAIN"'))
    check = next(c for c in report(str(odd), {}).checks if c.name == "kafka.properties")
    assert check.status == "warn" and "security.protocol" in check.found


def test_the_command_exits_0_1_and_2(config: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CHTXN_CONFIG", raising=False)
    assert main(["config", "check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "transaction.interval_s" in out and "config check: no check failed (1 warning)" in out
    assert "pw-in-url-7" not in out

    monkeypatch.setenv("CHTXN_TRANSACTION_INTERVL_S", "3")
    assert main(["config", "check", "--config", str(config), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False
    monkeypatch.delenv("CHTXN_TRANSACTION_INTERVL_S")

    monkeypatch.setenv("CHTXN_TRANSACTION_INTERVAL_S", "abc")
    assert main(["config", "check", "--config", str(config)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "chtxn: config error: CHTXN_TRANSACTION_INTERVAL_S='abc': Expected `float`, got `str` "
        f"(from the environment, overriding transaction.interval_s of {config})\n"
    )


def test_tsv_prints_only_the_settings_on_stdout(config: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("CHTXN_CONFIG", raising=False)
    assert main(["config", "check", "--config", str(config), "--format", "tsv"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == "key\tvalue\tsource"
    assert "transaction.interval_s\t1.0\tfile" in lines
    assert all(line.count("\t") == 2 for line in lines)
    assert "check secrets: warn" in captured.err
