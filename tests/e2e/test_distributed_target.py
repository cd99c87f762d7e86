"""A ``Distributed`` target (issue 39) under the real Spark participant job and a coordinator process:
``clickhouse.target_table`` names a Distributed table over three real embedded endpoints
(``EmbeddedStack(shards=3)``, whose cluster ``system.clusters`` lists), and the config lists no shard.
The coordinator and the job's driver learn the shards, the local table and the sharding key from the
server (``protocol.tables.distributed``); rows are placed by the Distributed table's key. It must end
with the oracle over the union of the shards, every row on the shard the key picks, and ``chtxn verify
--deep`` and ``chtxn doctor`` reading the same config agreeing.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from clients import target_table
from embedded.stack import EmbeddedStack
from tests.e2e.processes import running
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.pipelines import TARGET_DDL, Pipeline, make_pipeline
from tests.sharded import assert_exactly_once_over_shards, client_of, rows_per_shard, union_count

pytestmark = pytest.mark.e2e

SHARDS, PARTITIONS, RECORDS = 3, 4, 4_000
CLUSTER = "chtxn_shards"  # EmbeddedStack's


@pytest.fixture
def shards(tmp_path):
    """Three ClickHouse endpoints and their cluster (the test stack's broker is the pipeline's)."""
    sharded = EmbeddedStack(tmp_path / "shards", shards=SHARDS)
    sharded.start_clickhouse()
    yield sharded.shard_urls
    sharded.stop()


def test_a_distributed_target_over_three_shards_is_loaded_shard_by_shard_by_its_key(stack, shards, tmp_path):
    name = unique_name("dist")
    on_shard_1 = SimpleNamespace(kafka_bootstrap=stack.kafka_bootstrap, clickhouse_url=shards[0])
    for url in shards[1:]:
        client_of(url).command(f"CREATE DATABASE `{name}`")
        client_of(url).command(TARGET_DDL.format(db=f"`{name}`", table="`events`"))
    given = make_pipeline(
        on_shard_1,
        tmp_path,
        name,
        partitions=PARTITIONS,
        settings={
            "clickhouse.target_table": "events_all",
            "clickhouse.placement": "sharding-key",
            "participant.chunk_rows": 500,
        },
    )
    client_of(shards[0]).command(
        f"CREATE TABLE `{name}`.events_all AS `{name}`.events ENGINE = Distributed({CLUSTER}, `{name}`, events, id)"
    )
    learnt = target_table.learnt(given.cfg)
    assert (learnt.clickhouse.target_table, learnt.clickhouse.shards) == ("events", shards)
    pipeline = Pipeline(learnt, given.config_path, given.partitions)  # the file names the Distributed table
    produced = given.produce(RECORDS)
    with running(given, tmp_path, slots=2) as procs:
        wait_until(lambda: procs.alive() or union_count(pipeline) >= produced, 300, f"{produced} rows over the shards")

    assert_exactly_once_over_shards(pipeline, produced, by_partition=False)
    for i, rows in enumerate(rows_per_shard(pipeline)):
        ids = [r[0] for r in client_of(shards[i]).query(f"SELECT id FROM `{name}`.events").result_rows]
        assert rows and all(n % SHARDS == i for n in ids), f"shard {i + 1} holds rows the key puts elsewhere"
    verified = run_chtxn("verify", "--config", str(given.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = json.loads(verified.stdout)
    ((table, deep),) = report["tables"].items()
    assert (report["ok"], table, deep["rows_in_target"]) == (True, "events", produced), report
    doctor = run_chtxn("doctor", "--config", str(given.config_path), "--json")
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["learnt shards"]["status"] == "ok", checks["learnt shards"]
    assert "events_all -> events on 3 shards" in checks["learnt shards"]["found"]
    assert checks["sharding key"]["found"] == (
        f"all 3 shards: id over {name}.events is UInt64: each row on the shard of its value modulo 3 (weights 1, 1, 1)"
    )
