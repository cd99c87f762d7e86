"""``clickhouse.insert_settings`` that would let a chunk store a different number of rows than records,
or that break the commit protocol, are refused at load with the key, the value and what to do."""

from __future__ import annotations

import pytest

from protocol.config.parse import parse_config
from protocol.errors import ConfigError

BASE = """
[pipeline]
name = "orders"
topics = ["src"]

[clickhouse]
target_table = "events"

[clickhouse.insert_settings]
"""


@pytest.mark.parametrize(
    ("setting", "value", "why"),
    [
        ("input_format_allow_errors_num", "10", "skips up to that many bad rows"),
        ("input_format_allow_errors_ratio", "0.01", "skips bad rows"),
        ("input_format_csv_skip_first_lines", "1", "skips the first records"),
        ("input_format_tsv_skip_first_lines", "2", "skips the first records"),
        ("input_format_csv_detect_header", "true", "a header"),
        ("async_insert", "1", "synchronous"),
        ("async_insert", "true", "synchronous"),
        ("insert_deduplicate", "0", "retried insert"),
        ("insert_deduplicate", "false", "retried insert"),
        ("insert_deduplication_token", '"mine"', "chtxn sets its own"),
    ],
)
def test_an_unsafe_insert_setting_is_refused_naming_key_value_and_remedy(setting: str, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE + f"{setting} = {value}\n", {}, source="pipeline.toml")
    err = info.value
    key = f"clickhouse.insert_settings.{setting}"
    assert err.key == key
    message = str(err)
    assert message.startswith(f"pipeline.toml: {key} = ")
    assert why in message
    assert "remove it" in message or "set it to" in message, "the message says what to do"


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("input_format_allow_errors_num", "0"),
        ("input_format_allow_errors_ratio", "0.0"),
        ("async_insert", "0"),
        ("async_insert", "false"),
        ("insert_deduplicate", "1"),
        ("optimize_on_insert", "1"),
        ("input_format_skip_unknown_fields", "1"),
        ("max_insert_block_size", "100000"),
    ],
)
def test_safe_insert_settings_pass(setting: str, value: str) -> None:
    cfg = parse_config(BASE + f"{setting} = {value}\n", {})
    assert setting in cfg.clickhouse.insert_settings
