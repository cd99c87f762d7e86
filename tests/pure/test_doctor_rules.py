"""``chtxn doctor``'s verdicts from facts (``protocol.doctor.rules``): each check says ok, warn or fail,
what was found and what to do, for every kind of server, table and broker it can meet."""

from __future__ import annotations

import msgspec
import pytest

from protocol.checks import Check
from protocol.config.parse import PipelineConfig, parse_config
from protocol.doctor.facts import (
    ClickHouseFacts,
    KafkaFacts,
    KeeperProbe,
    Replica,
    Setting,
    Table,
    engine_args,
    macros_used,
    version_tuple,
)
from protocol.doctor.rules import evaluate, failed
from protocol.framing import RECORD_FORMATS
from protocol.tables.target_rules import ViewTable

#: Every setting the rules look at, as a 26.x server's profile shows it.
SETTINGS = {
    name: Setting(value=value)
    for name, value in {
        "async_insert": "1",
        "insert_quorum": "0",
        "select_sequential_consistency": "0",
        "insert_deduplicate": "1",
        "insert_deduplication_token": "",
        "keeper_map_strict_mode": "0",
        "insert_keeper_max_retries": "20",
        "keeper_max_retries": "10",
    }.items()
}
MERGE_TREE = {
    "non_replicated_deduplication_window": "0",
    "replicated_deduplication_window": "10000",
    "replicated_deduplication_window_seconds": "3600",
}
METADATA = ("id", "_topic", "_partition", "_offset")
TARGET = Table(
    engine="MergeTree", engine_full="MergeTree ORDER BY id SETTINGS index_granularity = 8192", columns=METADATA
)
LEDGER = Table(
    engine="MergeTree", engine_full="MergeTree ORDER BY x SETTINGS non_replicated_deduplication_window = 100000"
)
REPLICATED = Table(
    engine="ReplicatedMergeTree",
    engine_full="ReplicatedMergeTree('/clickhouse/tables/{shard}/events', '{replica}') ORDER BY id",
    columns=METADATA,
)
HEALTHY = Replica(is_readonly=False, is_session_expired=False, queue_size=0, absolute_delay=0)
PROBED = KeeperProbe(outcome="ok", path="/chtxn/db/doctor-1", seconds=0.1)


def config(**sections: dict) -> PipelineConfig:
    merged: dict[str, dict] = {"pipeline": {"name": "p", "topics": ["src"]}}
    merged["clickhouse"] = {"database": "db", "target_table": "events", **sections.pop("clickhouse", {})}
    text = "".join(
        f"[{name}]\n" + "".join(f"{k} = {msgspec.json.encode(v).decode()}\n" for k, v in fields.items())
        for name, fields in {**merged, **sections}.items()
    )
    return parse_config(text, {})


def facts(**over: object) -> ClickHouseFacts:
    base = ClickHouseFacts(
        version="26.9.2.1", settings=SETTINGS, merge_tree=MERGE_TREE, target=TARGET, ledger=LEDGER, stage_window=100_000
    )
    return msgspec.structs.replace(base, **over)


KAFKA = KafkaFacts(topics={"src": 2, "p.chtxn-control": 1, "p.chtxn-dlq": 2}, transactions="")


def checks(cfg: PipelineConfig | None = None, ch: ClickHouseFacts | None = None, kafka: KafkaFacts = KAFKA) -> dict:
    return {c.name: c for c in evaluate(cfg or config(), ch or facts(), kafka)}


def test_a_single_server_pipeline_passes_every_check_in_the_report_order() -> None:
    found = evaluate(config(), facts(), KAFKA)
    assert [c.name for c in found] == [
        "server version",
        "target table",
        "replication",
        "macros",
        "dedup: ledger",
        "dedup: stage tables",
        "dedup: target",
        "publish",
        "commit point",
        "keeper",
        "quorum",
        "async_insert",
        "materialized views",
        "metadata columns",
        "control topic",
        "source topics",
        "dead-letter transactions",
    ]
    assert [c for c in found if c.status != "ok"] == []
    assert failed(found) == []
    assert (
        checks()["async_insert"].found == "profile: async_insert = 1; chtxn sends async_insert = 0 with every request"
    )


@pytest.mark.parametrize(
    ("version", "commit_point", "fix"),
    [
        ("21.8.15.7", "token", "upgrade ClickHouse to 22.2 or later, the first with insert_deduplication_token"),
        ("23.3.1.1", "keeper", "upgrade ClickHouse to 23.4 or later, the first with keeper_map_strict_mode"),
    ],
)
def test_an_old_server_fails_naming_the_version_to_upgrade_to(version: str, commit_point: str, fix: str) -> None:
    check = checks(config(ledger={"commit_point": commit_point}), facts(version=version))["server version"]
    assert (check.status, check.fix) == ("fail", fix)


def test_a_server_without_a_setting_chtxn_sends_fails_naming_it() -> None:
    settings = {k: v for k, v in SETTINGS.items() if k != "keeper_max_retries"}
    check = checks(config(ledger={"commit_point": "keeper"}), facts(settings=settings, keeper=PROBED))["server version"]
    assert check.status == "fail" and "knows no setting keeper_max_retries" in check.found
    assert checks(ch=facts(settings=settings))["server version"].status == "ok"  # token mode does not send it


def test_a_missing_target_fails_with_the_coordinators_advice_and_skips_the_checks_of_its_columns() -> None:
    found = checks(ch=facts(target=None))
    assert (found["target table"].status, found["target table"].fix) == (
        "fail",
        "target table db.events does not exist: create it (CREATE TABLE db.events (...) ENGINE = MergeTree ORDER "
        "BY ...; optional columns _topic LowCardinality(String), _partition Int32, _offset Int64 let chtxn verify "
        "--deep check every offset) or fix clickhouse.target_table",
    )
    assert not {"replication", "macros", "dedup: target", "materialized views", "metadata columns"} & set(found)


def test_a_target_outside_the_merge_tree_family_fails() -> None:
    check = checks(ch=facts(target=Table(engine="Memory", engine_full="Memory")))["target table"]
    assert check.status == "fail"
    assert check.found == "db.events: Memory, not of the MergeTree family"
    assert check.fix == (
        "target table db.events has engine Memory, not of the MergeTree family, which chtxn needs: it stages "
        "into clones of the target and moves their partitions in; recreate it with a MergeTree-family engine "
        "(e.g. ENGINE = MergeTree ORDER BY ...)"
    )


@pytest.mark.parametrize(
    ("engine_full", "local", "setting"),
    [
        (
            "Distributed('c', 'shard_db', 'events_local', rand())",
            "shard_db.events_local",
            'set clickhouse.target_table = "events_local" and clickhouse.database = "shard_db", and list',
        ),
        (
            "Distributed(c, currentDatabase(), events_local)",
            "db.events_local",
            'set clickhouse.target_table = "events_local", and list',
        ),
    ],
)
def test_a_distributed_target_is_refused_naming_its_local_table(engine_full: str, local: str, setting: str) -> None:
    check = checks(ch=facts(target=Table(engine="Distributed", engine_full=engine_full)))["target table"]
    assert check.status == "fail" and f"over {local} (cluster c)" in check.found
    assert check.fix.startswith(f"target table db.events is a Distributed table over {local} on cluster c; ")
    assert setting in check.fix


def test_a_replicated_target_with_the_token_commit_point_fails_naming_the_keeper_commit_point() -> None:
    found = checks(ch=facts(target=REPLICATED, replicas=(HEALTHY,), macros={"shard": "01", "replica": "r1"}))
    assert found["target table"].found == "db.events: ReplicatedMergeTree (replicated)"
    assert found["commit point"].status == "fail"
    assert found["commit point"].fix.startswith('set ledger.commit_point = "keeper"')
    assert (found["replication"].status, found["macros"].status) == ("ok", "ok")
    assert found["quorum"].status == "warn" and found["quorum"].fix == "set clickhouse.cluster to the target's cluster"
    assert found["dedup: stage tables"].found == (
        "chtxn creates each stage table with replicated_deduplication_window = 100000 and "
        "replicated_deduplication_window_seconds = 604800"
    )
    assert found["publish"].status == "fail" and found["publish"].fix.startswith(
        'set transaction.publish_mode = "insert-select"'
    )
    keeper = checks(
        config(
            ledger={"commit_point": "keeper"},
            clickhouse={"cluster": "main"},
            transaction={"publish_mode": "insert-select"},
        ),
        facts(target=REPLICATED, replicas=(HEALTHY,), macros={"shard": "01", "replica": "r1"}, keeper=PROBED),
    )
    assert [c.name for c in keeper.values() if c.status != "ok"] == []


@pytest.mark.parametrize(
    ("replica", "status", "fix"),
    [
        (
            Replica(is_readonly=True, is_session_expired=False, queue_size=0, absolute_delay=0),
            "fail",
            "check <zookeeper>",
        ),
        (Replica(is_readonly=False, is_session_expired=True, queue_size=0, absolute_delay=0), "fail", "SYSTEM RESTART"),
        (Replica(is_readonly=False, is_session_expired=False, queue_size=500, absolute_delay=0), "warn", "catch up"),
        (
            Replica(is_readonly=False, is_session_expired=False, queue_size=0, absolute_delay=900),
            "warn",
            "SYNC REPLICA",
        ),
    ],
)
def test_an_unwell_replica_is_reported(replica: Replica, status: str, fix: str) -> None:
    check = checks(ch=facts(target=REPLICATED, replicas=(replica,)))["replication"]
    assert check.status == status and fix in check.fix


def test_a_replicated_target_without_its_row_in_system_replicas_fails_unless_it_is_shared() -> None:
    assert checks(ch=facts(target=REPLICATED))["replication"].status == "fail"
    shared = Table(engine="SharedMergeTree", engine_full="SharedMergeTree('/x', '{replica}') ORDER BY id")
    assert checks(ch=facts(target=shared))["replication"].status == "ok"


def test_missing_macros_fail_when_the_target_names_them_and_warn_otherwise() -> None:
    named = checks(ch=facts(target=REPLICATED, replicas=(HEALTHY,), macros={"replica": "r1"}))["macros"]
    assert named.status == "fail" and named.fix == "define shard in <macros> of the server config"
    assert named.found == "replica = r1; the target's engine names {shard}"
    neither = checks(ch=facts(target=REPLICATED, replicas=(HEALTHY,)))["macros"]
    assert neither.found == "none defined; the target's engine names {replica}, {shard}"
    explicit = Table(engine="ReplicatedMergeTree", engine_full="ReplicatedMergeTree('/t/events', 'r1') ORDER BY id")
    unnamed = checks(ch=facts(target=explicit, replicas=(HEALTHY,)))["macros"]
    assert unnamed.status == "warn" and "tables created ON CLUSTER use {replica}, {shard}" in unnamed.found


def test_the_ledger_window_is_read_from_its_table_or_promised_by_init() -> None:
    assert (
        checks(ch=facts(ledger=None))["dedup: ledger"].fix
        == "run chtxn init: it creates it with a window of 100000 blocks"
    )
    none = checks(ch=facts(ledger=Table(engine="MergeTree", engine_full="MergeTree ORDER BY x")))["dedup: ledger"]
    assert none.status == "fail"
    assert none.fix == "ALTER TABLE chtxn_ledger MODIFY SETTING non_replicated_deduplication_window = 100000"


def test_insert_select_into_a_target_without_a_window_fails_with_the_coordinators_advice() -> None:
    cfg = config(transaction={"publish_mode": "insert-select"})
    check = checks(cfg, facts())["dedup: target"]
    assert (check.status, check.fix) == (
        "fail",
        "publish_mode insert-select needs deduplication on db.events so that a repeated publish stores rows once: "
        "ALTER TABLE db.events MODIFY SETTING non_replicated_deduplication_window = 1000",
    )
    windowed = Table(
        engine="MergeTree", engine_full="MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
    )
    assert checks(cfg, facts(target=windowed))["dedup: target"].status == "ok"


def test_views_fail_with_move_and_pass_with_insert_select_into_a_deduplicating_target() -> None:
    moved = checks(ch=facts(views=("db.v",)))["materialized views"]
    assert (moved.status, moved.fix) == (
        "fail",
        "target table db.events has dependent materialized views (db.v), which do not fire on ALTER TABLE ... "
        'MOVE PARTITION: set transaction.publish_mode = "insert-select"',
    )
    windowed = Table(
        engine="MergeTree", engine_full="MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 9"
    )
    cfg = config(transaction={"publish_mode": "insert-select"})
    assert checks(cfg, facts(target=windowed, views=("db.v",)))["materialized views"].status == "ok"
    agg = ViewTable(view="db.v", table="db.agg", engine="MergeTree", engine_full="MergeTree ORDER BY id")
    unsafe = checks(cfg, facts(target=windowed, views=("db.v",), view_tables=(agg,)))["materialized views"]
    assert (unsafe.status, unsafe.fix) == (
        "fail",
        "materialized view db.v on db.events writes to db.agg, which does not deduplicate, so a repeated publish "
        "would count its rows twice there: ALTER TABLE db.agg MODIFY SETTING non_replicated_deduplication_window "
        "= 1000",
    )


def test_metadata_columns_the_participants_cannot_fill_fail_with_their_advice() -> None:
    check = checks(config(clickhouse={"input_format": "Parquet"}))["metadata columns"]
    assert (check.status, check.found) == ("fail", "_topic, _partition, _offset with clickhouse.input_format = Parquet")
    assert check.fix == (
        "target table db.events has metadata columns _topic, _partition, _offset but clickhouse.input_format is "
        "'Parquet', which chtxn does not load one record per row: set clickhouse.input_format to one of "
        f"{', '.join(sorted(RECORD_FORMATS))}, or drop or rename those columns"
    )
    assert checks(config(clickhouse={"input_format": "CSV"}))["metadata columns"].status == "ok"


@pytest.mark.parametrize(
    ("outcome", "fix"),
    [
        ("disabled", "configure <zookeeper> (or <keeper>) and <keeper_map_path_prefix>"),
        ("unreachable", "start Keeper (or ZooKeeper)"),
        ("not-strict", "upgrade ClickHouse to 23.4+"),
        ("failed", "check the user's grants"),
    ],
)
def test_a_failed_keeper_probe_fails_the_keeper_commit_point_and_only_warns_otherwise(outcome: str, fix: str) -> None:
    probe = KeeperProbe(outcome=outcome, path="/chtxn/db/doctor-1", detail="Code: 999 ...", seconds=26.3)  # type: ignore[arg-type]  # a Literal from the parameter
    needed = checks(config(ledger={"commit_point": "keeper"}), facts(keeper=probe))["keeper"]
    assert needed.status == "fail" and needed.fix.startswith(fix) and "after 26.3 s: Code: 999 ..." in needed.found
    assert checks(ch=facts(keeper=probe))["keeper"].status == "warn"
    assert checks()["keeper"].found == "not probed: ledger.commit_point = token"


def test_a_probe_table_left_behind_is_a_warning_naming_the_drop() -> None:
    probe = msgspec.structs.replace(PROBED, leftover="`db`.`chtxn_doctor_1`")
    check = checks(config(ledger={"commit_point": "keeper"}), facts(keeper=probe))["keeper"]
    assert (check.status, check.fix) == ("warn", "DROP TABLE `db`.`chtxn_doctor_1` SYNC by hand")


def test_an_async_insert_the_profile_forbids_changing_fails() -> None:
    settings = {**SETTINGS, "async_insert": Setting(value="1", readonly=True)}
    assert checks(ch=facts(settings=settings))["async_insert"].status == "fail"


def test_missing_metadata_columns_are_a_warning_naming_them() -> None:
    check = checks(ch=facts(target=Table(engine="MergeTree", engine_full="MergeTree", columns=("id", "_topic"))))
    assert (
        check["metadata columns"].status == "warn" and "has no _partition, _offset" in check["metadata columns"].found
    )


def test_the_kafka_checks() -> None:
    assert [(c.name, c.status) for c in evaluate(config(), facts(), KafkaFacts(error="cannot reach"))][-1] == (
        "kafka broker",
        "fail",
    )
    wrong = "control topic p.chtxn-control has 3 partitions; chtxn needs exactly 1: delete and recreate it ..."
    found = checks(kafka=KafkaFacts(topics={"p.chtxn-control": 3}, control_problem=wrong, transactions="Broker: boom"))
    assert (found["control topic"].status, found["control topic"].fix) == ("fail", wrong)
    assert found["source topics"].status == "fail" and "--topic src" in found["source topics"].fix
    assert (
        found["dead-letter transactions"].status == "fail" and "Broker: boom" in found["dead-letter transactions"].found
    )
    fresh = checks(kafka=KafkaFacts(topics={"src": 1}, transactions=""))
    assert (fresh["control topic"].status, fresh["dead-letter transactions"].status) == ("warn", "warn")


def test_a_server_that_does_not_answer_is_one_failing_row() -> None:
    found = evaluate(config(), ClickHouseFacts(error="cannot connect to ClickHouse at ..."), KAFKA)
    assert found[0] == Check(
        name="clickhouse",
        status="fail",
        found="cannot connect to ClickHouse at ...",
        fix="start the server or fix [clickhouse]",
    )


def test_parsing_engines_and_versions() -> None:
    assert engine_args("Distributed('c', db, 'it''s', rand(1, 2))", "Distributed") == ["c", "db", "it''s", "rand(1, 2)"]
    assert engine_args("MergeTree ORDER BY id", "MergeTree") == []
    assert macros_used(REPLICATED.engine_full, REPLICATED.engine) == {"shard", "replica"}
    assert macros_used("ReplicatedMergeTree('/t/{uuid}/{database}', '{replica}')", "ReplicatedMergeTree") == {"replica"}
    assert version_tuple("23.8.1.2992 (official build)") == (23, 8) and version_tuple("unknown") is None
