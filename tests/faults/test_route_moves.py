"""A route moved by a rolling deploy while a committed txn still waits to publish: the txn goes to the
table the ledger committed it for, and the new route takes the records after it (docs/architecture.md
§11, routes changed between restarts). Found by the change soak (``make soak``)."""

from __future__ import annotations

from protocol.config.parse import parse_config
from tests.helpers import crash_a_coordinator_at, run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import TARGET_DDL, Pipeline
from tests.routed import make_routed_pipeline, produce_to, stage_tables_left, table_count

WAIT_S = 60.0


def ids_in(pipeline: Pipeline, table: str) -> list[int]:
    db = pipeline.cfg.clickhouse.database
    return sorted(int(r[0]) for r in pipeline.client().query(f"SELECT id FROM `{db}`.`{table}`").result_rows)


def test_a_txn_committed_for_a_table_no_route_names_any_more_is_published_there(stack, tmp_path):
    """A coordinator dies after committing txn k for tables t0 and t1, before publishing it (failpoint
    crash); the deploy moves topic t1's route to table t1b. The next coordinator, on the new config,
    publishes k into t0 and t1, where the ledger sent it, and t1's later records into t1b: every record
    once, stage tables gone, ``verify --deep`` OK. On main the next coordinator refused to start ("...
    which no route of the config names"), and every one after it: the pipeline stayed down until the
    old route was put back."""
    old = make_routed_pipeline(stack, tmp_path, unique_name("rtmove"), tables=2)
    name, db = old.cfg.name, old.cfg.clickhouse.database
    old.client().command(TARGET_DDL.rstrip().format(db=f"`{db}`", table="`t1b`"))
    first = {f"t{i}": produce_to(old, f"{name}_t{i}", 200) for i in range(2)}
    with ScriptedParticipants(old.cfg, old.partitions):
        crash_a_coordinator_at(old.config_path, "leader.before-publish", WAIT_S * 2)
    (k,) = [t.txn for t in old.ledger().history(limit=50, state="COMMITTED")]
    assert next(c for c in old.ledger().commits() if c.txn == k).target == "t0,t1"
    assert table_count(old, "t0") == table_count(old, "t1") == 0, "k is committed, not published"

    text = old.config_path.read_text()
    assert 'table = "t1"\n' in text
    path = tmp_path / f"{name}-moved.toml"
    path.write_text(text.replace('table = "t1"\n', 'table = "t1b"\n'))
    new = Pipeline(parse_config(path.read_text(), source=str(path)), path, old.partitions)
    later = produce_to(old, f"{name}_t1", 100, start_id=200)
    with ScriptedParticipants(new.cfg, new.partitions), coordinator(new, coordinator_id="next"):
        wait_until(lambda: old.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by the next leader")
        wait_until(lambda: table_count(old, "t1b") >= later, WAIT_S, "t1's later records in t1b")
    assert ids_in(old, "t0") == list(range(first["t0"]))
    assert ids_in(old, "t1") == list(range(first["t1"])), "k's rows of t1 where the ledger sent them, once"
    assert ids_in(old, "t1b") == list(range(200, 200 + later))
    assert stage_tables_left(old) == []
    verified = run_chtxn("verify", "--config", str(new.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
