"""Credentials tried before production: an embedded ClickHouse endpoint that checks them (users
``default`` without a password, for the tests' own set-up, and ``ingest``), the session's broker.
A wrong ``clickhouse.password`` is named by ``chtxn doctor`` and ``chtxn init`` with what to do; the
right one runs a pipeline exactly once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from embedded.clickhouse_process import EmbeddedClickHouse
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import committed_through, coordinator, participants
from tests.pipelines import assert_exactly_once, make_pipeline

chtxn = partial(run_chtxn, timeout_s=180, inherit_chtxn_vars=False, env={"COLUMNS": "200"})
REFUSED = "ingest: Authentication failed: password is incorrect, or there is no user with such name"


@dataclass(frozen=True)
class CheckingStack:
    """What ``make_pipeline`` needs of a stack: the session's broker, an endpoint that checks users."""

    kafka_bootstrap: str
    clickhouse_url: str


@pytest.fixture(scope="module")
def checking(stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckingStack]:
    users = {"default": "", "ingest": "s3cret"}
    with EmbeddedClickHouse(tmp_path_factory.mktemp("checking") / "clickhouse", users=users) as endpoint:
        yield CheckingStack(stack.kafka_bootstrap, endpoint.url)


def last_failure(stderr: str) -> str:
    [line] = [line for line in stderr.splitlines() if line.startswith("chtxn: ")]
    return line


def test_doctor_and_init_name_a_wrong_password_and_what_to_do(checking: CheckingStack, tmp_path: Path) -> None:
    wrong = {"clickhouse.user": "ingest", "clickhouse.password": "not-it"}
    pipeline = make_pipeline(checking, tmp_path, unique_name("badpw"), settings=wrong)
    config = str(pipeline.config_path)

    doctor = chtxn("doctor", "--config", config, "--json")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    row = checks["clickhouse"]
    assert row["status"] == "fail" and REFUSED in row["found"] and "AUTHENTICATION_FAILED" in row["found"], row
    assert row["fix"].startswith("set clickhouse.user and clickhouse.password (or CHTXN_CLICKHOUSE_PASSWORD)"), row
    assert "not-it" not in doctor.stdout + doctor.stderr

    init = chtxn("init", "--config", config)
    assert init.returncode == 1, init.stdout + init.stderr
    line = last_failure(init.stderr)
    assert REFUSED in line and "ClickHouse error 516 (AUTHENTICATION_FAILED)" in line, line
    assert "set clickhouse.user and clickhouse.password (or CHTXN_CLICKHOUSE_PASSWORD)" in line, line
    assert "not-it" not in init.stdout + init.stderr


def test_a_pipeline_with_the_right_password_loads_exactly_once(checking: CheckingStack, tmp_path: Path) -> None:
    right = {"clickhouse.user": "ingest", "clickhouse.password": "s3cret"}
    pipeline = make_pipeline(checking, tmp_path, unique_name("goodpw"), settings=right)
    config = str(pipeline.config_path)
    assert chtxn("doctor", "--config", config).returncode == 0
    init = chtxn("init", "--config", config)
    assert init.returncode == 0, init.stdout + init.stderr

    produced = pipeline.produce(500)
    ends = {tp: produced // len(pipeline.partitions) for tp in pipeline.partitions}
    with participants(pipeline, tasks=1), coordinator(pipeline):
        wait_until(lambda: committed_through(pipeline, ends), 120, f"every offset committed up to {ends}")
    assert_exactly_once(pipeline, produced)
    verified = chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert json.loads(verified.stdout)["deep"]["rows_in_target"] == produced
