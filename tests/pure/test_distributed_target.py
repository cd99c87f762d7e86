"""``protocol.tables.distributed``: a pipeline whose target is a ``Distributed`` table runs as if its config
named the local table and listed the cluster's shards, fed with what a server would say of its tables."""

from __future__ import annotations

import pytest

from protocol.config.parse import PipelineConfig, parse_config
from protocol.errors import SetupError
from protocol.tables.distributed import learn_shards, learnt_check
from protocol.tables.target_rules import ClusterShard, TargetFacts

LOCAL = TargetFacts(engine="MergeTree", engine_full="MergeTree ORDER BY id")
#: a cluster of three servers as a ClickHouse server lists it: native ports, this server is shard 1
NATIVE = (
    ClusterShard(host="ch-1", port=9000, local=True),
    ClusterShard(host="ch-2", port=9000),
    ClusterShard(host="ch-3", port=9000, weight=2),
)


def distributed(
    local: str = "events_local",
    key: str = ", cityHash64(user)",
    *,
    cluster: str = "main",
    database: str = "''",
    shards: tuple[ClusterShard, ...] = NATIVE,
) -> TargetFacts:
    return TargetFacts(
        engine="Distributed",
        engine_full=f"Distributed('{cluster}', {database}, '{local}'{key})",
        cluster_shards=shards,
    )


def config(clickhouse: str = "", *, route: str = "") -> PipelineConfig:
    one = "" if route else 'topics = ["src"]\n'
    table = "" if route else 'target_table = "events"\n'
    return parse_config(
        f'[pipeline]\nname = "p"\n{one}[kafka]\nbootstrap_servers = "k:9092"\n'
        f'[clickhouse]\nurl = "http://ch-1:8123"\ndatabase = "db"\n{table}{clickhouse}{route}',
        {},
    )


def test_a_target_that_is_no_distributed_table_leaves_the_config_as_it_is() -> None:
    cfg = config()
    assert learn_shards(cfg, {"events": LOCAL}) is cfg
    assert learn_shards(cfg, {"events": None}) is cfg  # missing: the target check says so
    assert learnt_check(cfg, cfg) is None


def test_a_distributed_target_becomes_its_local_table_on_every_shard_of_its_cluster_at_the_http_port() -> None:
    cfg = learn_shards(config(), {"events": distributed()})
    ch = cfg.clickhouse
    assert ch.target_table == "events_local" and cfg.tables == ("events_local",)
    assert ch.shards == ["http://ch-1:8123", "http://ch-2:8123", "http://ch-3:8123"]
    assert (ch.placement, ch.sharding_key, ch.shard_weights) == ("partition", "", [])
    check = learnt_check(config(), cfg)
    assert check is not None and check.status == "ok"
    assert "events -> events_local on 3 shards from its cluster in system.clusters" in check.found
    assert "placed by source partition" in check.found


def test_a_cluster_that_names_http_ports_keeps_each_shards_port() -> None:
    """The embedded stack's cluster lists each endpoint's HTTP port, and this server's row has clickhouse.url's."""
    http = (ClusterShard(host="127.0.0.1", port=8123, local=True), ClusterShard(host="127.0.0.1", port=8124))
    cfg = learn_shards(config(), {"events": distributed(shards=http)})
    assert cfg.clickhouse.shards == ["http://127.0.0.1:8123", "http://127.0.0.1:8124"]


def test_placed_by_key_the_distributed_tables_key_and_the_clusters_weights_are_learnt() -> None:
    cfg = learn_shards(config('placement = "sharding-key"\n'), {"events": distributed()})
    assert (cfg.clickhouse.sharding_key, cfg.clickhouse.shard_weights) == ("cityHash64(user)", [1, 1, 2])
    even = tuple(ClusterShard(host=s.host, port=s.port, local=s.local) for s in NATIVE)
    cfg = learn_shards(config('placement = "sharding-key"\n'), {"events": distributed(shards=even)})
    assert cfg.clickhouse.shard_weights == []  # all 1


def test_what_the_config_says_wins_over_what_is_learnt() -> None:
    given = config('shards = ["http://a:8123", "http://b:8123"]\nplacement = "sharding-key"\nsharding_key = "id"\n')
    cfg = learn_shards(given, {"events": distributed()})
    ch = cfg.clickhouse
    assert (ch.target_table, ch.shards, ch.sharding_key, ch.shard_weights) == (
        "events_local",
        ["http://a:8123", "http://b:8123"],
        "id",
        [],  # the cluster's weights are its shards', not the list's
    )
    check = learnt_check(given, cfg)
    assert check is not None and "from clickhouse.shards" in check.found


def test_routes_into_distributed_tables_go_to_their_local_tables() -> None:
    route = (
        '[[route]]\ntopics = ["a"]\ntable = "orders"\n[[route]]\ntopics = ["b"]\ntable = "clicks"\n'
        '[[route]]\ntopics = ["c"]\ntable = "plain"\npublish_mode = "insert-select"\n'
    )
    cfg = learn_shards(
        config(route=route),
        {"orders": distributed("orders_local"), "clicks": distributed("clicks_local"), "plain": LOCAL},
    )
    assert cfg.tables == ("orders_local", "clicks_local", "plain")
    assert cfg.publish_mode_of("plain") == "insert-select"
    assert len(cfg.clickhouse.shards) == 3


@pytest.mark.parametrize(
    ("given", "facts", "named"),
    [
        ("", {"events": distributed(shards=())}, "does not define in system.clusters: list one server of every shard"),
        ("", {"events": distributed(database="'other'")}, 'with clickhouse.database = "other"'),
        ('placement = "sharding-key"\n', {"events": distributed(key="")}, "set clickhouse.sharding_key"),
        ('placement = "sharding-key"\n', {"events": LOCAL}, "and there are none: list one server of every shard"),
        (
            'placement = "sharding-key"\nshards = ["http://a:8123"]\n',
            {"events": LOCAL},
            "needs clickhouse.sharding_key, the Distributed table's key (or a Distributed target table with one)",
        ),
    ],
    ids=["cluster-not-defined", "other-database", "no-key", "no-shards", "no-key-given"],
)
def test_what_cannot_be_learnt_is_refused_naming_what_to_set(given: str, facts: dict, named: str) -> None:
    with pytest.raises(SetupError) as refused:
        learn_shards(config(given), facts)
    assert named in str(refused.value)
    assert "(docs/clusters.md, A Distributed target)" in str(refused.value)


def test_distributed_targets_on_two_clusters_or_over_one_local_table_are_refused() -> None:
    route = '[[route]]\ntopics = ["a"]\ntable = "orders"\n[[route]]\ntopics = ["b"]\ntable = "clicks"\n'
    with pytest.raises(SetupError, match="are on clusters east, west; a pipeline loads one cluster"):
        learn_shards(
            config(route=route), {"orders": distributed(cluster="east"), "clicks": distributed(cluster="west")}
        )
    with pytest.raises(SetupError, match="share a local table"):
        learn_shards(config(route=route), {"orders": distributed(), "clicks": distributed()})


def test_the_doctor_row_of_a_target_that_cannot_be_learnt_fails_with_the_refusal_as_its_fix() -> None:
    check = learnt_check(config(), None, "it cannot: set this")
    assert check is not None and (check.status, check.fix) == ("fail", "it cannot: set this")


def test_a_local_target_on_a_cluster_of_several_shards_is_loaded_on_every_shard() -> None:
    """``clickhouse.cluster`` plus the local table: the cluster's shards, the target itself on each."""
    given = config('cluster = "main"\nplacement = "sharding-key"\nsharding_key = "id"\n')
    cfg = learn_shards(given, {"events": LOCAL}, NATIVE)
    ch = cfg.clickhouse
    assert (ch.target_table, ch.shards, ch.shard_weights) == (
        "events",
        ["http://ch-1:8123", "http://ch-2:8123", "http://ch-3:8123"],
        [1, 1, 2],
    )
    check = learnt_check(given, cfg)
    assert check is not None and "loading events on 3 shards from cluster main in system.clusters" in check.found
    one_shard = config('cluster = "main"\n')
    assert learn_shards(one_shard, {"events": LOCAL}, NATIVE[:1]) is one_shard  # replicas of one shard
    listed = config('cluster = "main"\nshards = ["http://a:8123"]\n')
    assert learn_shards(listed, {"events": LOCAL}, NATIVE) is listed


def test_a_distributed_key_that_changes_between_tries_is_refused_when_rows_are_placed_by_it() -> None:
    """``rand()`` is a common Distributed key: placed by partition it is never evaluated; placed by key, a
    chunk sent again would put its rows elsewhere, so it is refused, naming both ways out."""
    assert learn_shards(config(), {"events": distributed(key=", rand()")}).clickhouse.placement == "partition"
    with pytest.raises(SetupError) as refused:
        learn_shards(config('placement = "sharding-key"\n'), {"events": distributed(key=", rand()")})
    assert "sharding key rand() cannot place rows exactly once" in str(refused.value)
    assert 'set clickhouse.sharding_key, or clickhouse.placement = "partition"' in str(refused.value)


def test_a_cluster_whose_shards_do_not_make_a_config_stops_the_process_instead_of_being_retried() -> None:
    """A ``SetupError`` stops the coordinator and the job (a ``ConfigError`` would be retried as an outage)."""
    twice = (ClusterShard(host="ch-1", port=9000, local=True), ClusterShard(host="ch-1", port=9000))
    with pytest.raises(SetupError, match="the shards learnt from the server do not make a config"):
        learn_shards(config(), {"events": distributed(shards=twice)})
