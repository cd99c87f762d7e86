"""One pipeline, several tables (``[[route]]``), with the coordinator and the Spark participant job
(local mode): every record in its route's table exactly once, a topic created mid-run that a
route's pattern matches included, and ``chtxn verify --deep`` clean per table."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from clients import kafka as kafka_clients
from protocol import routing
from tests.e2e.processes import running
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.routed import assert_exactly_once_per_table, make_routed_pipeline, produce_to, table_count

pytestmark = pytest.mark.e2e


def test_three_tables_and_a_pattern_route_picking_up_a_topic_created_mid_run(stack, tmp_path):
    name = unique_name("mte2e")
    pipeline = make_routed_pipeline(stack, tmp_path, name, tables=2, pattern_table="late")
    produced = {"t0": produce_to(pipeline, f"{name}_t0", 3_000), "t1": produce_to(pipeline, f"{name}_t1", 2_000)}

    def landed() -> bool:
        return all(table_count(pipeline, t) == n for t, n in produced.items())

    with running(pipeline, tmp_path, slots=2) as procs:
        wait_until(lambda: procs.alive() is None and landed(), 300, "the first records in both tables")
        late = f"{name}_late_1"
        kafka_clients.create_topics(AdminClient({"bootstrap.servers": stack.kafka_bootstrap}), {late: 2})
        pipeline.partitions += [type(pipeline.partitions[0])(topic=late, partition=p) for p in range(2)]
        produced["late"] = produce_to(pipeline, late, 1_500)
        produced["t1"] += produce_to(pipeline, f"{name}_t1", 500, start_id=2_000)
        wait_until(lambda: procs.alive() is None and landed(), 300, "every record in its table")
    assert_exactly_once_per_table(pipeline, produced)
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    report = json.loads(verified.stdout)
    assert verified.returncode == 0 and report["ok"], verified.stdout
    assert {t: r["rows_in_target"] for t, r in report["tables"].items()} == produced
    by_topic = routing.table_map(sorted({tp.topic for tp in pipeline.partitions}), pipeline.cfg.routes)
    filled = [(c, {by_topic[r.topic] for r in c.ranges if r.rows}) for c in pipeline.ledger().commits()]
    spanning = [(c.target, tables) for c, tables in filled if len(tables) > 1]
    # one COMMITTED row for the rows of several tables; its target names (at least) the tables that got rows
    assert spanning and all(tables <= set(target.split(",")) for target, tables in spanning), spanning
