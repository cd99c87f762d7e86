"""Secrets are masked wherever chtxn shows a value (``protocol.secrets``, ``protocol.config.parse``)."""

from __future__ import annotations

import pytest

from protocol import secrets
from protocol.config.parse import parse_config
from protocol.errors import ConfigError

BASE = '[pipeline]\nname = "orders"\ntopics = ["orders"]\n[clickhouse]\ntarget_table = "events"\n'


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "ssl.key.password",
        "clickhouse.password",
        "sasl.jaas.config",
        "sasl.oauthbearer.client.secret",
        "ssl.key.pem",
        "api_token",
    ],
)
def test_keys_that_hold_secrets(key: str) -> None:
    assert secrets.is_secret_key(key)


@pytest.mark.parametrize("key", ["sasl.username", "ssl.key.location", "bootstrap.servers", "clickhouse.user"])
def test_keys_that_do_not(key: str) -> None:
    assert not secrets.is_secret_key(key)


def test_url_passwords_are_masked() -> None:
    assert secrets.mask_url("http://u:pw@host:8123/x") == "http://u:***@host:8123/x"
    assert secrets.mask_url("https://host:8443") == "https://host:8443"
    assert secrets.mask_url("http://u@host") == "http://u@host"
    assert secrets.masked("note", "at http://u:pw@h:1 and https://v:p2@k") == "at http://u:***@h:1 and https://v:***@k"
    assert secrets.masked("props", {"sasl.password": "x", "acks": "all"}) == {"sasl.password": "***", "acks": "all"}


def test_remembered_secrets_are_redacted_from_any_text() -> None:
    secrets.remember(["pw-in-some-library-error", "abc"])  # too short to search for
    assert secrets.redact("auth failed for pw-in-some-library-error at abc") == "auth failed for *** at abc"


def test_a_forbidden_kafka_property_beside_a_secret_one_names_it_without_the_secret() -> None:
    text = BASE + '[kafka.properties]\n"group.id" = "g"\n"sasl.password" = "hunter2-hunter2"\n'
    with pytest.raises(ConfigError, match="group ids are chtxn's") as info:
        parse_config(text)
    assert "hunter2" not in str(info.value) and "'sasl.password': '***'" in str(info.value)


def test_a_password_of_the_wrong_type_is_not_echoed() -> None:
    with pytest.raises(ConfigError, match=r"clickhouse.password = '\*\*\*': Expected `str`") as info:
        parse_config(BASE + "password = 90210777\n")
    assert "90210777" not in str(info.value)


def test_credentials_in_the_url_are_used_and_leave_the_url() -> None:
    cfg = parse_config(BASE + 'url = "https://alice:s%40cret-pw@ch.example.com:8443"\n')
    ch = cfg.clickhouse
    assert (ch.url, ch.user, ch.password) == ("https://ch.example.com:8443", "alice", "s@cret-pw")
    assert "s@cret-pw" not in repr(cfg)


@pytest.mark.parametrize(
    "extra, what",
    [
        ('password = "other-pw-1"\n', "password other than clickhouse.password"),
        ('user = "bob"\n', "clickhouse.user is 'bob'"),
    ],
)
def test_credentials_in_the_url_that_disagree_are_refused_without_the_secret(extra: str, what: str) -> None:
    with pytest.raises(ConfigError, match=what) as info:
        parse_config(BASE + 'url = "http://alice:url-pw-1@h:8123"\n' + extra)
    assert "url-pw-1" not in str(info.value) and "other-pw-1" not in str(info.value)
    assert "http://alice:***@h:8123" in str(info.value)
