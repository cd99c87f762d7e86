"""Naming rules: txn ids, stage tables, deduplication tokens, consumer group."""

from __future__ import annotations

import pytest

from protocol import naming


@pytest.mark.parametrize(("epoch", "seq"), [(1, 1), (3, 17), (12, 0), (999999, 123456789)])
def test_txn_ids_round_trip(epoch: int, seq: int) -> None:
    txn = naming.txn_id(epoch, seq)
    assert txn == f"e{epoch}_t{seq}"
    assert naming.parse_txn_id(txn) == (epoch, seq)


@pytest.mark.parametrize("bad", ["", "e1", "t1", "e1_t", "ex_t1", "e1_t1_x", "E1_T1", " e1_t1", "e-1_t1"])
def test_a_malformed_txn_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="e<epoch>_t<n>"):
        naming.parse_txn_id(bad)


def test_txn_ids_of_different_epochs_never_collide() -> None:
    ids = {naming.txn_id(e, s) for e in range(1, 30) for s in range(30)}
    assert len(ids) == 29 * 30


def test_stage_tables_and_back() -> None:
    stage = naming.stage_table("events", "orders", "e3_t17")
    assert stage == "events__chtxn_orders__e3_t17"
    assert stage.startswith(naming.stage_table_prefix("events", "orders"))
    assert naming.txn_of_stage_table("events", "orders", stage) == "e3_t17"
    assert naming.txn_of_stage_table("events", "orders", naming.restage_table(stage)) == "e3_t17"
    probe = naming.probe_table(stage, "orders/e3_t17/src/2/5/100-250")
    assert probe.startswith(f"{stage}__probe_") and len(probe) == len(stage) + len("__probe_") + 8
    assert naming.txn_of_stage_table("events", "orders", probe) == "e3_t17"
    assert naming.is_side_table(stage, probe) and naming.is_side_table(stage, naming.restage_table(stage))
    assert not naming.is_side_table(stage, stage) and not naming.is_side_table(stage, f"{stage}__probe_xyz")


@pytest.mark.parametrize(
    "table",
    [
        "events",
        "other__chtxn_orders__e1_t1",
        "events__chtxn_orders__",
        "events__chtxn_orders__e1_t1_old",
        "events__chtxn_orders__backup",
        "events__chtxn_e1_t1",
    ],
)
def test_tables_that_are_not_stage_tables_of_the_pipeline(table: str) -> None:
    assert naming.txn_of_stage_table("events", "orders", table) is None


def test_a_target_whose_name_extends_another_is_not_confused() -> None:
    # events_v2's stage tables must not look like stage tables of events
    assert naming.txn_of_stage_table("events", "p", naming.stage_table("events_v2", "p", "e1_t1")) is None


@pytest.mark.parametrize(
    "other",
    [
        "orders2",
        "orders__e1_t1",
        "orders__x",
        "o",
        "orders__restage",
        "orders__probe_0000abcd",
        "orders__e1_t1__probe_0000abcd",
    ],
)
def test_pipelines_sharing_a_target_never_see_each_others_stage_tables(other: str) -> None:
    """Pipeline names may contain ``__``: the txn id that ends every stage table name keeps them apart."""
    stage = naming.stage_table("events", other, "e1_t1")
    for table in (stage, naming.restage_table(stage), naming.probe_table(stage, "t")):
        assert naming.txn_of_stage_table("events", "orders", table) is None
        assert naming.txn_of_stage_table("events", other, table) == "e1_t1"


def test_tokens() -> None:
    assert naming.chunk_token("orders", "e3_t17", "src", 2, 5, 100, 250) == "orders/e3_t17/src/2/5/100-250"
    assert naming.commit_token("orders", 41) == "orders/commit/41"
    assert naming.epoch_token("orders", 3) == "orders/epoch/3"
    assert naming.publish_token("orders", "e3_t17") == "orders/publish/e3_t17"


def test_tokens_are_distinct_across_kinds_pipelines_and_slots() -> None:
    tokens = [
        naming.commit_token("orders", 1),
        naming.commit_token("orders", 2),
        naming.commit_token("orders2", 1),
        naming.epoch_token("orders", 1),
        naming.publish_token("orders", "e1_t1"),
        naming.chunk_token("orders", "e1_t1", "src", 0, 0, 0, 5),
        naming.chunk_token("orders", "e1_t1", "src", 0, 1, 5, 9),
        naming.chunk_token("orders", "e1_t1", "src", 1, 0, 0, 5),
        naming.chunk_token("orders", "e1_t2", "src", 0, 0, 0, 5),
        naming.chunk_token("orders", "e1_t1", "src", 0, 0, 0, 6),
    ]
    assert len(set(tokens)) == len(tokens)


def test_the_same_chunk_always_gets_the_same_token() -> None:
    assert naming.chunk_token("p", "e1_t1", "t", 0, 3, 7, 9) == naming.chunk_token("p", "e1_t1", "t", 0, 3, 7, 9)


def test_consumer_group_is_the_pipeline_name() -> None:
    assert naming.consumer_group("orders") == "orders"
