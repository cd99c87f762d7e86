"""``chtxn doctor`` over a sharded ClickHouse (``protocol.doctor.shards``): the server and target checks
folded over the shards, the ledger's checks once, an unreachable shard named, and the first difference
between the shards' tables."""

from __future__ import annotations

import msgspec

from protocol.doctor.facts import ClickHouseFacts
from protocol.doctor.shards import alike_check, fold, sharded_checks
from tests.pure.test_doctor_rules import TARGET, config, facts

URLS = ["http://ch-1:8123", "http://ch-2:8123", "http://ch-3:8123"]
TYPED = msgspec.structs.replace(
    TARGET,
    types=("UInt64", "String", "LowCardinality(String)", "Int32", "Int64"),
    columns=("id", "user", "_topic", "_partition", "_offset"),
    sorting_key="id",
)


def sharded(url: str = URLS[0]):  # a PipelineConfig
    return config(clickhouse={"url": url, "shards": URLS})


def on(**over: object) -> ClickHouseFacts:
    return facts(**{"target": TYPED, **over})


def by_name(checks) -> dict[str, list]:
    found: dict[str, list] = {}
    for c in checks:
        found.setdefault(c.name, []).append(c)
    return found


def test_alike_shards_give_one_row_per_check_and_the_ledgers_checks_once() -> None:
    checks = sharded_checks(sharded(), on(), [on(), on(), on()])
    rows = by_name(checks)
    assert all(len(r) == 1 for r in rows.values()), checks
    assert [c for c in checks if c.status != "ok"] == []
    assert rows["target table"][0].found == "all 3 shards: db.events: MergeTree"
    assert rows["server version"][0].found.startswith("all 3 shards: ClickHouse 26.9.2.1")
    assert rows["dedup: ledger"][0].found.startswith("the ledger's server (ch-1:8123): chtxn_ledger: MergeTree")
    assert rows["shard tables"][0].found == (
        "db.events: the same columns and types, sorting key and partition key on 3 shards"
    )
    assert list(rows)[-1] == "shard tables"


def test_an_unreachable_shard_is_named_with_what_to_do_and_the_others_still_checked() -> None:
    down = ClickHouseFacts(error="cannot connect to ClickHouse at http://ch-3:8123 (...)", error_code=0)
    checks = sharded_checks(sharded(), on(), [on(), on(), down])
    rows = by_name(checks)
    (unreachable,) = rows["clickhouse"]
    assert checks[0] == unreachable, "the shard that did not answer comes first"
    assert unreachable.status == "fail"
    assert unreachable.found == "shard 3 (ch-3:8123): cannot connect to ClickHouse at http://ch-3:8123 (...)"
    assert unreachable.fix == "start the server, or fix its URL in clickhouse.shards"
    assert rows["target table"][0].found == "shard 1, shard 2: db.events: MergeTree"
    assert rows["shard tables"][0].found.endswith("on 2 shards (1 not read)")


def test_a_shard_whose_target_is_missing_fails_its_own_row() -> None:
    rows = by_name(sharded_checks(sharded(), on(), [on(), on(target=None), on()]))
    ok, missing = rows["target table"]
    assert ok.found == "shard 1, shard 3: db.events: MergeTree"
    assert (missing.status, missing.found) == ("fail", "shard 2 (ch-2:8123): db.events does not exist")
    assert missing.fix.startswith("target table db.events does not exist: create it")


def test_a_column_of_another_type_on_one_shard_fails_naming_both() -> None:
    narrow = msgspec.structs.replace(TYPED, types=("UInt32", *TYPED.types[1:]))
    check = alike_check(sharded(), [on(), on(), on(target=narrow)])
    assert (check.status, check.found) == ("fail", "shard 3 (ch-3:8123): column id is UInt32, shard 1 has UInt64")
    assert check.fix.startswith("ALTER TABLE db.events on shard 3 (or on the others) until the shards are alike")


def test_a_missing_or_extra_column_fails_and_a_failing_shard_is_named_before_a_warning_one() -> None:
    fewer = msgspec.structs.replace(TYPED, columns=TYPED.columns[:-1], types=TYPED.types[:-1])
    more = msgspec.structs.replace(TYPED, columns=(*TYPED.columns, "x"), types=(*TYPED.types, "UInt8"))
    resorted = msgspec.structs.replace(TYPED, sorting_key="id, user")
    assert alike_check(sharded(), [on(), on(target=fewer), on()]).found == (
        "shard 2 (ch-2:8123): no column _offset, which shard 1 has"
    )
    assert alike_check(sharded(), [on(), on(target=more), on()]).found == (
        "shard 2 (ch-2:8123): column x, which shard 1 has not"
    )
    check = alike_check(sharded(), [on(), on(target=resorted), on(target=more)])
    assert (check.status, check.found) == (
        "fail",
        "shard 3 (ch-3:8123): column x, which shard 1 has not (1 more shard(s) differ)",
    )


def test_other_keys_only_warn() -> None:
    partitioned = msgspec.structs.replace(TYPED, partition_key="toYYYYMM(ts)")
    check = alike_check(sharded(), [on(target=partitioned), on(), on(target=partitioned)])
    assert (check.status, check.found) == (
        "warn",
        "shard 2 (ch-2:8123): partition key none, shard 1 has toYYYYMM(ts)",
    )


def test_the_ledgers_server_outside_the_shards_gets_its_version_checked_too() -> None:
    checks = sharded_checks(sharded(url="http://ledger:8123"), on(), [on(), on(), on()])
    versions = by_name(checks)["server version"]
    assert [v.found.split(":")[0] for v in versions] == ["all 3 shards", "the ledger's server (ledger"]


def test_fold_keeps_each_checks_order_with_unreachable_rows_first() -> None:
    one = sharded_checks(sharded(), on(), [on(), on(), on()])
    names = [c.name for c in fold(URLS[:2], [one[:3], one[1:3]])]
    assert names == [one[0].name, one[1].name, one[2].name]


def keyed(key: str = "cityHash64(user)"):  # a PipelineConfig placing rows by ``key``
    return config(
        clickhouse={
            "url": URLS[0],
            "shards": URLS,
            "placement": "sharding-key",
            "sharding_key": key,
            "shard_weights": [1, 2, 1],
        }
    )


def test_placed_by_key_the_key_is_checked_on_every_shard_and_an_integer_passes() -> None:
    rows = by_name(sharded_checks(keyed(), on(), [on(key_type="UInt64")] * 3))["sharding key"]
    assert [(c.status, c.found) for c in rows] == [
        ("ok", "all 3 shards: cityHash64(user) over db.events is UInt64: each row on the shard of its value "
         "modulo 4 (weights 1, 2, 1)"),
    ]  # fmt: skip
    assert "sharding key" not in by_name(sharded_checks(sharded(), on(), [on()] * 3))  # placed by partition


def test_a_key_that_is_no_integer_or_that_the_server_cannot_evaluate_fails_naming_the_shard() -> None:
    shards = [on(key_type="UInt64"), on(key_type="String"), on(key_error="Unknown expression identifier `usr`")]
    rows = by_name(sharded_checks(keyed("user"), on(), shards))["sharding key"]
    assert [(c.status, c.found.split("): ", 1)[0] + ")") for c in rows] == [
        ("ok", "shard 1 (ch-1:8123)"),
        ("fail", "shard 2 (ch-2:8123)"),
        ("fail", "shard 3 (ch-3:8123)"),
    ]
    assert rows[1].found.endswith("user over db.events is String")
    assert "Unknown expression identifier" in rows[2].found
    assert rows[1].fix.startswith("set clickhouse.sharding_key (or the Distributed table's key) to an integer")
