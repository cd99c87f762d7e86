"""The embedded ClickHouse endpoint given users (``EmbeddedClickHouse(..., users=...)``) checks
credentials as a ClickHouse server does over HTTP; given none, it accepts anyone, as it always did."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from embedded.clickhouse_process import EmbeddedClickHouse

USERS = {"ingest": "s3cret", "reader": "r3ad"}
REFUSED = "Authentication failed: password is incorrect, or there is no user with such name"


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedClickHouse]:
    clickhouse = EmbeddedClickHouse(tmp_path_factory.mktemp("credentials") / "clickhouse", users=USERS)
    with clickhouse:
        yield clickhouse


def post(url: str, sql: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """Status, headers and body of ``sql`` POSTed to ``url``."""
    request = urllib.request.Request(url, data=sql.encode(), headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers), refused.read().decode()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_clickhouse_connect_gets_in_with_a_users_password_and_not_without(endpoint: EmbeddedClickHouse) -> None:
    for user, password in USERS.items():
        client = clickhouse_connect.get_client(host=endpoint.host, port=endpoint.port, username=user, password=password)
        assert client.command("SELECT 1") == 1
        client.close()
    for user, password in (("ingest", "wrong"), ("ingest", ""), ("nobody", "s3cret"), ("default", "")):
        with pytest.raises(DatabaseError) as refused:
            clickhouse_connect.get_client(host=endpoint.host, port=endpoint.port, username=user, password=password)
        assert refused.value.code == 516, refused.value
        assert f"{user}: {REFUSED}" in str(refused.value)


@pytest.mark.parametrize("way", ["basic", "headers", "url"])
def test_every_way_of_sending_credentials_is_checked(endpoint: EmbeddedClickHouse, way: str) -> None:
    def send(user: str, password: str) -> tuple[int, dict[str, str], str]:
        if way == "basic":
            return post(endpoint.url, "SELECT 7", basic(user, password))
        if way == "headers":
            return post(endpoint.url, "SELECT 7", {"X-ClickHouse-User": user, "X-ClickHouse-Key": password})
        return post(f"{endpoint.url}/?user={user}&password={password}", "SELECT 7")

    assert send("ingest", "s3cret")[::2] == (200, "7\n")
    status, headers, body = send("default", "wrong")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516")  # as ClickHouse's HTTP handler
    assert body.startswith(f"Code: 516. DB::Exception: default: {REFUSED} (AUTHENTICATION_FAILED) (version ")


def test_no_credentials_are_the_default_user_without_a_password(endpoint: EmbeddedClickHouse) -> None:
    status, headers, body = post(endpoint.url, "SELECT 1")
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516")
    assert f"default: {REFUSED}" in body
    with urllib.request.urlopen(f"{endpoint.url}/ping", timeout=10) as ping:  # never needs credentials
        assert ping.read() == b"Ok.\n"


def test_the_passwords_stay_out_of_the_process_list(endpoint: EmbeddedClickHouse) -> None:
    argv = Path(f"/proc/{endpoint.pid}/cmdline").read_bytes()
    assert b"embedded.clickhouse_server" in argv
    assert not any(password.encode() in argv for password in USERS.values())
    assert "s3cret" not in repr(endpoint)


def test_without_users_any_user_and_password_get_in(tmp_path: Path) -> None:
    with EmbeddedClickHouse(tmp_path / "clickhouse") as open_endpoint:
        for user, password in (("default", ""), ("whoever", "anything")):
            client = clickhouse_connect.get_client(
                host=open_endpoint.host, port=open_endpoint.port, username=user, password=password
            )
            assert client.command("SELECT 1") == 1
            client.close()
