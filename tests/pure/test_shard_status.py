"""The shards as ``chtxn status`` and ``chtxn txn show`` give them (``protocol.status.shards``): each
shard's rows in the targets and the txns it holds stage tables of, a txn's stage tables per shard,
and the ``shards`` check."""

from __future__ import annotations

from protocol import naming
from protocol.status.shards import ShardStatus, shard_status, shards_check, txn_stage

URL = "http://ch-2:8123"


def test_a_shard_gives_its_target_rows_and_the_txns_of_its_stage_tables_oldest_first() -> None:
    answer = [
        ("events", 1200),
        ("clicks", 30),
        (naming.stage_table("events", "orders", "e2_t10"), 7),
        (naming.stage_table("clicks", "orders", "e2_t9"), 3),
        (naming.stage_table("events", "orders", "e2_t9"), 5),
        (naming.stage_table("events", "orders__x", "e2_t11"), 1),  # another pipeline's
        (naming.probe_table(naming.stage_table("events", "orders", "e1_t4"), "tok"), 0),  # a side table
    ]
    found = shard_status(1, URL, answer, tables=["events", "clicks"], pipeline="orders")
    assert found == ShardStatus(
        shard="shard 2", address="ch-2:8123", target_rows=1230, staged_txns=("e1_t4", "e2_t9", "e2_t10")
    )


def test_a_shard_that_did_not_answer_says_why_and_has_no_figures() -> None:
    found = shard_status(
        2, "http://ch-3:8123", "cannot connect to ClickHouse at http://ch-3:8123", tables=["events"], pipeline="p"
    )
    assert (found.shard, found.address, found.target_rows, found.staged_txns) == ("shard 3", "ch-3:8123", None, ())
    assert found.error.startswith("cannot connect")


def test_a_txns_stage_tables_on_a_shard_and_their_rows() -> None:
    stages = [naming.stage_table("events", "p", "e1_t3"), naming.stage_table("clicks", "p", "e1_t3")]
    held = txn_stage(0, URL, [(stages[0], 40), ("events", 999)], stages=stages)
    assert (held.shard, held.stage_tables, held.rows, held.error) == ("shard 1", (stages[0],), 40, "")
    gone = txn_stage(0, URL, [("events", 999)], stages=stages)
    assert (gone.stage_tables, gone.rows) == ((), 0)
    silent = txn_stage(0, URL, "timed out", stages=stages)
    assert (silent.stage_tables, silent.rows, silent.error) == ((), None, "timed out")


def test_the_shards_check_fails_naming_each_shard_that_did_not_answer() -> None:
    up = shard_status(0, "http://ch-1:8123", [], tables=["events"], pipeline="p")
    down = shard_status(2, "http://ch-3:8123", "no answer within 10 s", tables=["events"], pipeline="p")
    assert shards_check([up, up]).status == "ok"
    assert shards_check([up, up]).found == "all 2 shards answered"
    check = shards_check([up, down])
    assert (check.status, check.found) == ("fail", "shard 3 (ch-3:8123): no answer within 10 s")
    assert check.fix.startswith("start it, or fix its URL in clickhouse.shards")
