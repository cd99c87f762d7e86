"""``chtxn embedded up --user U --password P``: the detached stack's ClickHouse endpoint takes only
that user, as a ClickHouse server would; without the options it takes anyone, as before."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from tests.helpers import run_chtxn

chtxn = partial(run_chtxn, check=True)


@pytest.fixture
def data_dir(tmp_path: Path):
    directory = tmp_path / "embedded"
    yield directory
    chtxn("embedded", "down", "--data-dir", str(directory), "--purge", check=False)


def up(data_dir: Path, *options: str, check: bool = True):
    return chtxn(
        "embedded",
        "up",
        "--data-dir",
        str(data_dir),
        "--kafka-port",
        "0",
        "--clickhouse-port",
        "0",
        *options,
        check=check,
    )


def test_up_with_a_user_and_password_checks_them(data_dir: Path) -> None:
    started = json.loads(up(data_dir, "--user", "ingest", "--password", "s3cret", "--json").stdout)
    assert started["clickhouse_users"] == ["ingest"]
    assert started["env"]["CHTXN_CLICKHOUSE_USER"] == "ingest"
    assert started["env"]["CHTXN_CLICKHOUSE_PASSWORD"] == "s3cret"
    port = started["components"]["clickhouse"]["port"]
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="ingest", password="s3cret")
    assert client.command("SELECT 1") == 1
    client.close()
    for user, password in (("ingest", "wrong"), ("default", "")):
        with pytest.raises(DatabaseError) as refused:
            clickhouse_connect.get_client(host="127.0.0.1", port=port, username=user, password=password)
        assert refused.value.code == 516
    assert "s3cret" not in (data_dir / "state.json").read_text(), "the password is never written down"

    again = json.loads(up(data_dir, "--user", "ingest", "--password", "s3cret", "--json").stdout)
    assert again["already_up"] is True

    other = up(data_dir, "--user", "ingest", "--password", "Wr0ngPw", check=False)
    assert other.returncode == 1, other.stdout + other.stderr
    [line] = other.stderr.strip().splitlines()
    assert line.startswith(f"chtxn: the ClickHouse endpoint running in {data_dir.resolve()} refuses user ingest ")
    assert "chtxn embedded down" in line and "Wr0ngPw" not in line

    status = json.loads(chtxn("embedded", "status", "--data-dir", str(data_dir), "--json").stdout)
    assert status["components"]["clickhouse"]["users"] == ["ingest"]


def test_up_with_credentials_on_a_stack_that_takes_anyone_refuses(data_dir: Path) -> None:
    started = json.loads(up(data_dir, "--json").stdout)
    assert "CHTXN_CLICKHOUSE_USER" not in started["env"] and started["clickhouse_users"] == []
    port = started["components"]["clickhouse"]["port"]
    client = clickhouse_connect.get_client(host="127.0.0.1", port=port, username="whoever", password="x")
    assert client.command("SELECT 1") == 1  # without the options: anyone, as before
    client.close()
    refused = up(data_dir, "--user", "ingest", "--password", "s3cret", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "accepts any user and password" in line and "chtxn embedded down" in line, line
