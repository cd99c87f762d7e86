"""``chtxn init`` prints the DDL it ran (with ``clickhouse.cluster`` set that is the replicated,
``ON CLUSTER`` DDL an operator may also run by hand; chDB refuses ``ON CLUSTER``, so here it is the
single server's), in the table and in ``--json``, per table and in order."""

from __future__ import annotations

import json
from pathlib import Path

from protocol.dead_letters import letters as dead_letters
from protocol.ledger import rows as ledger
from tests.helpers import create_topic, unique_name
from tests.integration.test_cli_init_txn import chtxn, write_config


def test_init_prints_the_ddl_it_ran(stack, kafka_admin, ch_client, ch_database: str, tmp_path: Path) -> None:
    ch_client.command(f"CREATE TABLE `{ch_database}`.events (id UInt64) ENGINE = MergeTree ORDER BY id")
    source = create_topic(kafka_admin, unique_name("src"), 1)
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics=json.dumps([source]))
    ledger_ddl = ledger.create_table_sql(ch_database)
    letters_ddl = dead_letters.create_table_sql(ch_database)

    first = chtxn("init", "--config", str(path), "--json")

    assert first.returncode == 0, first.stderr + first.stdout
    report = json.loads(first.stdout)
    items = {item["name"]: item for item in report["items"]}
    assert items[f"{ch_database}.chtxn_ledger"]["status"] == "created"
    assert items[f"{ch_database}.chtxn_ledger"]["ddl"] == [ledger_ddl]
    assert items[f"{ch_database}.chtxn_dead_letters"]["ddl"] == [letters_ddl]
    assert report["ddl"] == [letters_ddl, ledger_ddl], "every statement, in the order it ran"

    people = chtxn("init", "--config", str(path))

    assert people.returncode == 0, people.stderr + people.stdout
    assert "DDL run:" in people.stdout
    assert f"{letters_ddl};" in people.stdout, "each statement whole, as it can be run again"
    again = {item["name"]: item for item in json.loads(chtxn("init", "--config", str(path), "--json").stdout)["items"]}
    assert again[f"{ch_database}.chtxn_ledger"]["status"] == "found"
    assert again[f"{ch_database}.chtxn_ledger"]["ddl"] == [], "a ledger found is not created again"
