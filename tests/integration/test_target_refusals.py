"""One target check for ``chtxn init``, ``chtxn doctor``, the coordinator and the participant: a target
one of them refuses, all four refuse, each with the same one-line message (``protocol.tables.target_rules``,
read by ``clients.target_table``), run as an operator runs them against the session's broker and
ClickHouse."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from tests.helpers import run_chtxn, unique_name
from tests.pipelines import make_pipeline

chtxn = partial(run_chtxn, timeout_s=180, inherit_chtxn_vars=False, env={"COLUMNS": "200"})

MEMORY = "CREATE TABLE {db}.{table} (id UInt64, _topic String, _partition Int32, _offset Int64) ENGINE = Memory"
METADATA_MERGE_TREE = (
    "CREATE TABLE {db}.{table} (id UInt64, _topic String, _partition Int32, _offset Int64) "
    "ENGINE = MergeTree ORDER BY id"
)
#: (target DDL, pipeline settings, the doctor's row it fails): shapes the coordinator refuses.
REFUSED = {
    "memory-engine": (MEMORY, {}, "target table"),
    "metadata-columns-with-parquet": (METADATA_MERGE_TREE, {"clickhouse.input_format": "Parquet"}, "metadata columns"),
}


def last_failure(stderr: str) -> str:
    """The one ``chtxn: ...`` line a failed command ends with."""
    [line] = [line for line in stderr.splitlines() if line.startswith("chtxn: ")]
    assert line == stderr.strip().splitlines()[-1], stderr
    return line.removeprefix("chtxn: ")


@pytest.mark.parametrize("shape", sorted(REFUSED))
def test_init_doctor_coordinator_and_participant_refuse_a_target_alike(stack, tmp_path: Path, shape: str) -> None:
    ddl, settings, row = REFUSED[shape]
    pipeline = make_pipeline(stack, tmp_path, unique_name("refused"), settings=settings, target_ddl=ddl)
    config = str(pipeline.config_path)

    init = chtxn("init", "--config", config)
    assert init.returncode == 1, init.stdout + init.stderr
    said_by_init = last_failure(init.stderr)

    doctor = chtxn("doctor", "--config", config, "--json")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks[row]["status"] == "fail", checks[row]
    said_by_doctor = checks[row]["fix"]

    coordinator = chtxn("coordinator", "--config", config, env={"CHTXN_COORDINATOR_ID": "refused-1"}, timeout_s=120)
    assert coordinator.returncode == 1, coordinator.stdout + coordinator.stderr
    said_by_coordinator = last_failure(coordinator.stderr)

    participant = chtxn("participant", "--config", config, timeout_s=120)
    assert participant.returncode == 3, participant.stdout + participant.stderr  # a setup error
    said_by_participant = last_failure(participant.stderr)

    assert said_by_init == said_by_doctor == said_by_coordinator == said_by_participant, (
        f"init: {said_by_init}\ndoctor: {said_by_doctor}\ncoordinator: {said_by_coordinator}\n"
        f"participant: {said_by_participant}"
    )
    # ... and it is the refusal the shared rules give for what the server says of the table
    from clients.clickhouse import make_client
    from clients.target_table import target_refusals

    client = make_client(pipeline.cfg.clickhouse)
    try:
        [refusal] = target_refusals(client, pipeline.cfg, "events")
    finally:
        client.close()
    assert (refusal.check, refusal.message) == (row, said_by_init)
    assert said_by_init.startswith(f"target table {pipeline.cfg.clickhouse.database}.events ")


def test_init_finds_a_target_the_others_accept(stack, tmp_path: Path) -> None:
    pipeline = make_pipeline(stack, tmp_path, unique_name("accepted"))
    init = chtxn("init", "--config", str(pipeline.config_path), "--json")
    assert init.returncode == 0, init.stdout + init.stderr
    items = {item["name"]: item for item in json.loads(init.stdout)["items"]}
    assert items[f"{pipeline.cfg.clickhouse.database}.events"]["status"] == "found"
