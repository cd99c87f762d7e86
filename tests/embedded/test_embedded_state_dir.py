"""One embedded stack per user, found from any working directory: ``status`` and ``up --env`` in
another directory find the running stack (``up --env`` never starts a second one, and says which it
uses), a stack an older chtxn left in ``./.chtxn/embedded`` is found too, and ``topic create`` and
``sql`` set up a pipeline's topic and table on the running stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import clickhouse_connect
import pytest
from confluent_kafka.admin import AdminClient

from tests.helpers import REPO, unique_name


def chtxn(
    cwd: Path, *args: str, env: Mapping[str, str], check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``chtxn ARGS`` (this checkout's) run in ``cwd`` with this process's environment, without its
    ``CHTXN_*`` and ``XDG_STATE_HOME`` variables, updated with ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CHTXN_") and k != "XDG_STATE_HOME"}
    result = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(REPO), **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"chtxn {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def exports(stdout: str) -> dict[str, str]:
    """The ``export KEY=VALUE`` lines of ``up --env``."""
    return dict(
        line.removeprefix("export ").split("=", 1) for line in stdout.splitlines() if line.startswith("export ")
    )


def comments(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("#")]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A running stack in a state dir named by CHTXN_EMBEDDED_DIR, started by ``up --env`` from one
    directory; brought down at the end. Yields the state dir, the env, two other directories and
    ``up``'s output."""
    root = tmp_path_factory.mktemp("state_dir")
    state, first, second = root / "state", root / "first", root / "second"
    first.mkdir()
    second.mkdir()
    env = {"CHTXN_EMBEDDED_DIR": str(state)}
    try:
        started = chtxn(first, "embedded", "up", "--env", "--kafka-port", "0", "--clickhouse-port", "0", env=env)
        yield {"state": state, "env": env, "first": first, "second": second, "started": started.stdout}
    finally:
        chtxn(root, "embedded", "down", "--purge", env=env, check=False)


def test_up_env_says_it_started_the_stack_then_reuses_it_from_another_directory(home):
    state = home["state"].resolve()
    assert comments(home["started"]) == [f"# started the embedded stack in {state}"]
    pids = {n: c["pid"] for n, c in json.loads((state / "state.json").read_text())["components"].items()}

    again = chtxn(home["second"], "embedded", "up", "--env", env=home["env"])
    assert comments(again.stdout) == [f"# using the running embedded stack in {state}"]
    assert exports(again.stdout) == exports(home["started"])
    assert {n: c["pid"] for n, c in json.loads((state / "state.json").read_text())["components"].items()} == pids
    assert not (home["second"] / ".chtxn").exists() and not (home["first"] / ".chtxn").exists()

    # What a shell's eval makes of it: the comment line is skipped, the variables are set.
    shell = subprocess.run(
        ["bash", "-c", f'eval "$({sys.executable} -m cli embedded up --env)" && echo "$CHTXN_CLICKHOUSE_URL"'],
        cwd=home["second"],
        env={**os.environ, "PYTHONPATH": str(REPO), **home["env"]},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shell.returncode == 0, shell.stderr
    assert shell.stdout.strip() == exports(home["started"])["CHTXN_CLICKHOUSE_URL"]

    plain = chtxn(home["second"], "embedded", "up", env=home["env"])
    assert f"already running in {state}" in plain.stdout


def test_status_from_another_directory_finds_the_running_stack(home):
    status = chtxn(home["second"], "embedded", "status", env=home["env"])
    assert str(home["state"].resolve()) in status.stdout and "running" in status.stdout
    report = json.loads(chtxn(home["second"], "embedded", "status", "--json", env=home["env"]).stdout)
    assert report["up"] is True and report["data_dir"] == str(home["state"].resolve())
    assert "note" not in report


def test_topic_create_and_sql_set_up_a_pipeline_on_the_running_stack(home):
    env, cwd = home["env"], home["second"]
    addresses = exports(home["started"])
    topic, table = unique_name("orders"), unique_name("orders")

    created = chtxn(cwd, "embedded", "topic", "create", topic, "--partitions", "3", env=env)
    assert f"created topic {topic} with 3 partitions" in created.stdout
    admin = AdminClient({"bootstrap.servers": addresses["CHTXN_KAFKA_BOOTSTRAP_SERVERS"]})
    assert len(admin.list_topics(timeout=10).topics[topic].partitions) == 3
    again = chtxn(cwd, "embedded", "topic", "create", topic, "--partitions", "3", env=env)
    assert "already exists with 3 partitions" in again.stdout
    other = chtxn(cwd, "embedded", "topic", "create", topic, "--partitions", "2", env=env, check=False)
    assert other.returncode == 1 and "has 3 partitions, not 2" in other.stderr

    ddl = f"CREATE TABLE {table} (id UInt64, _partition Int32, _offset Int64) ENGINE = MergeTree ORDER BY id"
    assert chtxn(cwd, "embedded", "sql", ddl, env=env).stdout == ""
    client = clickhouse_connect.get_client(dsn=addresses["CHTXN_CLICKHOUSE_URL"])
    try:
        found = client.query(
            "SELECT engine FROM system.tables WHERE database = 'default' AND name = {t:String}", parameters={"t": table}
        ).result_rows
    finally:
        client.close()
    assert found == [("MergeTree",)]

    chtxn(cwd, "embedded", "sql", "-", stdin=f"INSERT INTO {table} (id) VALUES (1), (2)", env=env)
    selected = chtxn(cwd, "embedded", "sql", f"SELECT count() AS n, sum(id) AS s FROM {table}", env=env)
    assert selected.stdout == "n\ts\n2\t3\n"
    refused = chtxn(cwd, "embedded", "sql", "SELECT * FROM no_such_table_here", env=env, check=False)
    assert refused.returncode == 1 and "UNKNOWN_TABLE" in refused.stderr


def test_topic_create_and_sql_need_a_running_stack(tmp_path):
    env = {"CHTXN_EMBEDDED_DIR": str(tmp_path / "nothing")}
    for args in (("topic", "create", "t", "--partitions", "1"), ("sql", "SELECT 1")):
        result = chtxn(tmp_path, "embedded", *args, env=env, check=False)
        assert result.returncode == 1 and "no embedded stack runs in" in result.stderr


def test_a_stack_left_in_the_old_place_is_found_and_not_doubled(tmp_path):
    project, elsewhere, xdg = tmp_path / "project", tmp_path / "elsewhere", tmp_path / "xdg"
    project.mkdir()
    elsewhere.mkdir()
    legacy = (project / ".chtxn" / "embedded").resolve()
    per_user = xdg / "chtxn" / "embedded"
    env = {"XDG_STATE_HOME": str(xdg)}  # and no CHTXN_EMBEDDED_DIR: the default applies
    ports = ("--kafka-port", "0", "--clickhouse-port", "0")
    try:
        chtxn(project, "embedded", "up", "--data-dir", ".chtxn/embedded", *ports, "--json", env=env)

        report = json.loads(chtxn(project, "embedded", "status", "--json", env=env).stdout)
        assert report["up"] is True and report["data_dir"] == str(legacy) and str(per_user) in report["note"]
        reused = chtxn(project, "embedded", "up", "--env", *ports, env=env)
        assert f"# using the running embedded stack in {legacy}" in comments(reused.stdout)
        assert not per_user.exists(), "a second stack was started in the per-user directory"

        away = chtxn(elsewhere, "embedded", "status", env=env, check=False)
        assert away.returncode == 1 and f"no embedded stack recorded in {per_user.resolve()}" in away.stdout
    finally:
        chtxn(project, "embedded", "down", "--data-dir", ".chtxn/embedded", "--purge", env=env, check=False)
