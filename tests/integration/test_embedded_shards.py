"""``EmbeddedStack(shards=3)``: three ClickHouse endpoints, each its own chDB process and data, each
configured with the cluster naming all three (``embedded.ch_config``); and what chDB does with a
``Distributed`` table over them, pinned so that a chDB (or an endpoint) that serves one fails a test.

What chDB 26.9 (ClickHouse 26.9.2.1) does with the cluster, as these tests find it:

- ``system.clusters`` lists it (``<remote_servers>`` in the engine's configuration): every shard,
  replica 1, ``127.0.0.1`` and the shard's HTTP port, ``is_local = 1`` on the shard's own row only.
- A ``Distributed`` table over it is created, and ``system.tables.engine_full`` names its cluster,
  database, local table and sharding key, as chtxn reads them.
- Everything through it that needs another shard fails: ClickHouse speaks its native TCP protocol to
  the other shards, whose HTTP port never answers the handshake, so a read fails with
  ALL_CONNECTION_TRIES_FAILED (279, "Timeout exceeded while reading from socket"), and with
  ``skip_unavailable_shards = 1`` returns the local shard's rows only; a foreground insert fails
  with SOCKET_TIMEOUT (209); a background insert (the default) is taken, the local shard's rows land,
  the other shards' rows wait in ``system.distribution_queue`` and ``SYSTEM FLUSH DISTRIBUTED``
  fails with 279. ``ON CLUSTER`` DDL is refused (392, "Replicated DDL queries are disabled"): chDB
  runs no distributed DDL worker.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import clickhouse_connect
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError

from clients.target_table import check_target, learnt
from embedded.ch_engine import CONFIG_FILE
from embedded.stack import EmbeddedStack
from protocol.config.parse import parse_config
from protocol.errors import SetupError
from protocol.tables.replicated_ddl import distributed_local_table, parse_engine
from tests.helpers import unique_name, wait_until

SHARDS = 3
CLUSTER = "chtxn_shards"
#: A native connection to a shard's HTTP port waits for a handshake that never comes: by default
#: 10 s (``handshake_timeout_ms``) for each of 3 tries. These end it after one try of 0.3 s.
FAIL_FAST = {"handshake_timeout_ms": 300, "connections_with_failover_max_tries": 1}
FAIL_FAST_SQL = ", ".join(f"{name} = {value}" for name, value in FAIL_FAST.items())
# ClickHouse's error codes.
SOCKET_TIMEOUT = 209
ALL_CONNECTION_TRIES_FAILED = 279
QUERY_IS_PROHIBITED = 392
LOCAL_DDL = "CREATE TABLE {db}.events_local (id UInt64, shard UInt8) ENGINE = MergeTree ORDER BY id"


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    """Three ClickHouse endpoints and their cluster (no broker, no keeper)."""
    stack = EmbeddedStack(tmp_path_factory.mktemp("shards"), shards=SHARDS)
    stack.start_clickhouse()
    yield stack
    stack.stop()


@pytest.fixture
def clients(sharded: EmbeddedStack) -> Iterator[list]:  # clickhouse-connect clients, shard 1 first
    opened = [clickhouse_connect.get_client(dsn=url) for url in sharded.shard_urls]
    yield opened
    for client in opened:
        client.close()


@pytest.fixture
def db(clients: list) -> Iterator[str]:
    """A fresh database of the test on every shard."""
    name = unique_name("t_shards")
    for client in clients:
        client.command(f"CREATE DATABASE {name}")
    yield name
    for client in clients:
        client.command(f"DROP DATABASE IF EXISTS {name} SYNC")


def tables(client, db: str) -> list[str]:
    return [
        r[0] for r in client.query(f"SELECT name FROM system.tables WHERE database = '{db}' ORDER BY name").result_rows
    ]


def local_tables_with_rows(clients: list, db: str) -> None:
    """``events_local`` on every shard; shard k holds the row (k, k)."""
    for shard, client in enumerate(clients, start=1):
        client.command(LOCAL_DDL.format(db=db))
        client.command(f"INSERT INTO {db}.events_local VALUES ({shard}, {shard})")


def create_distributed(client, db: str, settings: str = "") -> None:
    """``events``, over every shard's ``events_local``, sharded by ``id``."""
    client.command(
        f"CREATE TABLE {db}.events AS {db}.events_local "
        f"ENGINE = Distributed({CLUSTER}, {db}, events_local, id) {settings}"
    )


def shard_macro(client) -> str:
    return client.query("SELECT getMacro('shard')").result_rows[0][0]


def ids(client, sql: str, **settings: object) -> list[int]:
    return sorted(r[0] for r in client.query(sql, settings=settings).result_rows)


# ---- the endpoints ---------------------------------------------------------------------------------


def test_each_shard_is_a_process_of_its_own_with_data_of_its_own(sharded: EmbeddedStack, clients, db: str) -> None:
    assert sharded.shards[0] is sharded.clickhouse
    assert [e.data_dir.name for e in sharded.shards] == ["clickhouse", "clickhouse-shard2", "clickhouse-shard3"]
    assert len({e.pid for e in sharded.shards}) == SHARDS
    assert len(set(sharded.shard_urls)) == SHARDS
    assert sharded.shard_urls[0] == sharded.clickhouse_url
    assert [shard_macro(c) for c in clients] == ["01", "02", "03"]

    clients[1].command(f"CREATE TABLE {db}.only_on_2 (id UInt64) ENGINE = MergeTree ORDER BY id")
    assert [tables(c, db) for c in clients] == [[], ["only_on_2"], []]

    local_tables_with_rows(clients, db)
    assert [ids(c, f"SELECT id FROM {db}.events_local") for c in clients] == [[1], [2], [3]]


def test_system_clusters_names_every_shard_and_each_shard_is_local_to_itself(sharded: EmbeddedStack, clients) -> None:
    ports = [e.port for e in sharded.shards]
    sql = (
        "SELECT shard_num, replica_num, host_name, port, is_local FROM system.clusters "
        f"WHERE cluster = '{CLUSTER}' ORDER BY shard_num"
    )
    for me, client in enumerate(clients, start=1):
        rows = [tuple(r) for r in client.query(sql).result_rows]
        assert rows == [(k, 1, "127.0.0.1", ports[k - 1], int(k == me)) for k in range(1, SHARDS + 1)], f"shard {me}"


def test_a_killed_shard_starts_again_on_its_port_with_its_data(sharded: EmbeddedStack, clients, db: str) -> None:
    local_tables_with_rows(clients, db)
    victim = sharded.shards[2]
    url, pid, others = victim.url, victim.pid, [e.pid for e in sharded.shards[:2]]
    os.kill(pid, signal.SIGKILL)
    # Not gone(pid): a killed chDB process shows as a zombie while its threads still exit.
    wait_until(lambda: not victim.running(), 30, f"shard 3 (pid {pid}) to exit")
    assert [ids(c, f"SELECT id FROM {db}.events_local") for c in clients[:2]] == [[1], [2]]

    sharded.start_clickhouse()  # starts what is not running: shard 3 alone
    assert [e.pid for e in sharded.shards[:2]] == others
    assert victim.url == url and victim.pid != pid
    restarted = clickhouse_connect.get_client(dsn=url)
    try:
        assert ids(restarted, f"SELECT id FROM {db}.events_local") == [3]
        assert restarted.command(f"SELECT count() FROM system.clusters WHERE cluster = '{CLUSTER}'") == SHARDS
    finally:
        restarted.close()


def test_every_shard_uses_the_one_keeper(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A KeeperMap table on shard 2 sees the key inserted through shard 1: one keeper, one path. (And
    the whole stack's variables name both shards.)"""
    with EmbeddedStack(tmp_path_factory.mktemp("shards-keeper"), shards=2, keeper=True) as stack:
        one, two = (clickhouse_connect.get_client(dsn=url) for url in stack.shard_urls)
        try:
            for client in (one, two):
                client.command("CREATE TABLE kv (key String, v String) ENGINE = KeeperMap('/shared') PRIMARY KEY key")
            one.command("INSERT INTO kv VALUES ('k', 'from shard 1')")
            assert two.query("SELECT key, v FROM kv").result_rows == [("k", "from shard 1")]
            assert [shard_macro(c) for c in (one, two)] == ["01", "02"]
            assert stack.env()["CHTXN_CLICKHOUSE_SHARDS"] == ",".join(stack.shard_urls)
        finally:
            one.close()
            two.close()


def test_a_stack_of_one_shard_has_no_cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    stack = EmbeddedStack(tmp_path_factory.mktemp("one-shard"))
    try:
        stack.start_clickhouse()
        assert stack.shards == [stack.clickhouse] and stack.cluster is None
        assert stack.shard_urls == [stack.clickhouse_url]
        assert "<remote_servers>" not in (stack.clickhouse.data_dir / CONFIG_FILE).read_text()
        client = clickhouse_connect.get_client(dsn=stack.clickhouse_url)
        assert client.command(f"SELECT count() FROM system.clusters WHERE cluster = '{CLUSTER}'") == 0
        client.close()
    finally:
        stack.stop()


# ---- Distributed: what works, and the exact refusals ------------------------------------------------


def test_a_distributed_table_is_created_and_its_engine_full_names_the_local_table(clients, db: str) -> None:
    local_tables_with_rows(clients, db)
    create_distributed(clients[0], db)
    engine, engine_full = (
        clients[0]
        .query(f"SELECT engine, engine_full FROM system.tables WHERE database = '{db}' AND name = 'events'")
        .result_rows[0]
    )
    assert engine == "Distributed"
    assert engine_full == f"Distributed('{CLUSTER}', '{db}', 'events_local', id)"
    assert distributed_local_table(engine_full, db) == (CLUSTER, db, "events_local")
    assert parse_engine(engine_full).args[3] == "id"  # the sharding key
    assert clients[0].command(f"EXISTS TABLE {db}.events") == 1
    assert [c.command(f"EXISTS TABLE {db}.events") for c in clients[1:]] == [0, 0]


def test_a_read_through_a_distributed_table_reaches_its_own_shard_only(sharded: EmbeddedStack, clients, db) -> None:
    local_tables_with_rows(clients, db)
    create_distributed(clients[0], db)
    with pytest.raises(DatabaseError) as refused:
        clients[0].query(f"SELECT id FROM {db}.events", settings=FAIL_FAST)
    assert refused.value.code == ALL_CONNECTION_TRIES_FAILED
    message = str(refused.value)
    assert "Timeout exceeded while reading from socket" in message and "(ALL_CONNECTION_TRIES_FAILED)" in message
    assert any(f"127.0.0.1:{e.port}" in message for e in sharded.shards[1:]), message

    # Every shard holds one row; only shard 1's comes back, the others are skipped as unavailable.
    skipping = {**FAIL_FAST, "skip_unavailable_shards": 1}
    assert ids(clients[0], f"SELECT id FROM {db}.events", **skipping) == [1]
    assert ids(clients[0], f"SELECT id FROM cluster({CLUSTER}, {db}, events_local)", **skipping) == [1]
    # The native handshakes left on their HTTP ports did not hurt the other shards.
    assert [c.command("SELECT 1") for c in clients] == [1, 1, 1]


def test_an_insert_through_a_distributed_table_lands_on_its_own_shard_only(clients, db: str) -> None:
    for client in clients:
        client.command(LOCAL_DDL.format(db=db))
    # flush_on_detach = 0: else DROP DATABASE tries to send the queue below, 3 times 10 s per shard.
    create_distributed(clients[0], db, "SETTINGS flush_on_detach = 0")
    local = f"SELECT id FROM {db}.events_local"
    # Sharding key id over 3 shards of weight 1: ids 0 and 3 to shard 1, 1 and 4 to shard 2, 2 and 5 to shard 3.
    rows = ", ".join(f"({i}, 0)" for i in range(6))

    with pytest.raises(DatabaseError) as refused:
        clients[0].command(
            f"INSERT INTO {db}.events VALUES {rows}", settings={**FAIL_FAST, "distributed_foreground_insert": 1}
        )
    assert refused.value.code == SOCKET_TIMEOUT
    assert "Timeout exceeded while reading from socket" in str(refused.value)
    assert "Insertion status" in str(refused.value)
    assert [ids(c, local) for c in clients] == [[], [], []]  # not even shard 1's rows

    clients[0].command(f"INSERT INTO {db}.events VALUES {rows}")  # in the background: taken
    assert [ids(c, local) for c in clients] == [[0, 3], [], []]
    queue = (
        "SELECT data_files, error_count FROM system.distribution_queue "
        f"WHERE database = '{db}' AND table = 'events' ORDER BY data_path"
    )
    assert [tuple(r) for r in clients[0].query(queue).result_rows] == [(1, 0), (1, 0)]
    with pytest.raises(DatabaseError) as flushed:
        # The flush takes settings in its statement only; without, 3 times 10 s per shard.
        clients[0].command(f"SYSTEM FLUSH DISTRIBUTED {db}.events SETTINGS {FAIL_FAST_SQL}")
    assert flushed.value.code == ALL_CONNECTION_TRIES_FAILED
    assert clients[0].query(queue).result_rows[0][1] >= 1  # the queue counts the failed send
    assert [ids(c, local) for c in clients] == [[0, 3], [], []]


def test_on_cluster_ddl_is_refused(clients, db: str) -> None:
    with pytest.raises(DatabaseError) as refused:
        clients[0].command(f"CREATE TABLE {db}.everywhere ON CLUSTER {CLUSTER} (id UInt64) ENGINE = Memory")
    assert refused.value.code == QUERY_IS_PROHIBITED
    assert "Replicated DDL queries are disabled" in str(refused.value)
    assert [tables(c, db) for c in clients] == [[], [], []]


def test_a_distributed_target_is_refused_with_its_clusters_shards_to_paste_into_the_config(
    sharded: EmbeddedStack, clients, db: str
) -> None:
    """chtxn refuses the Distributed table, naming the shards its cluster lists in ``system.clusters`` at
    the HTTP port and its key; the config the refusal gives passes every shard's target check."""
    local_tables_with_rows(clients, db)
    create_distributed(clients[0], db, "SETTINGS flush_on_detach = 0")
    base = (
        f'[pipeline]\nname = "p"\ntopics = ["t"]\n[kafka]\nbootstrap_servers = "x:1"\n'
        f'[clickhouse]\nurl = "{sharded.shard_urls[0]}"\ndatabase = "{db}"\n'
    )
    with pytest.raises(SetupError) as refused:
        check_target(clients[0], parse_config(base + 'target_table = "events"\n'), "events")
    urls = ", ".join(f'"{u}"' for u in sharded.shard_urls)
    assert (
        f'set clickhouse.target_table = "events_local", and set clickhouse.shards = [{urls}] (cluster chtxn_shards)'
        in str(refused.value)
    )
    assert 'clickhouse.placement = "sharding-key" and clickhouse.sharding_key = "id"' in str(refused.value)
    fixed = parse_config(
        base + f'target_table = "events_local"\nshards = [{urls}]\nplacement = "sharding-key"\nsharding_key = "id"\n'
    )
    for client in clients:
        check_target(client, fixed, "events_local")


def test_a_distributed_target_is_learnt_from_the_servers_cluster_and_passes_every_shards_check(
    sharded: EmbeddedStack, clients, db: str
) -> None:
    """What the refusal above tells an operator to paste, chtxn learns itself (``clients.target_table.learnt``):
    the local table, every shard of ``system.clusters`` at its HTTP port, and, placed by key, the key."""
    local_tables_with_rows(clients, db)
    create_distributed(clients[0], db, "SETTINGS flush_on_detach = 0")
    given = parse_config(
        f'[pipeline]\nname = "p"\ntopics = ["t"]\n[kafka]\nbootstrap_servers = "x:1"\n'
        f'[clickhouse]\nurl = "{sharded.shard_urls[0]}"\ndatabase = "{db}"\ntarget_table = "events"\n'
        'placement = "sharding-key"\n'
    )
    cfg = learnt(given)
    ch = cfg.clickhouse
    assert (ch.target_table, ch.shards, ch.sharding_key, ch.shard_weights) == (
        "events_local",
        sharded.shard_urls,
        "id",
        [],
    )
    for client in clients:
        check_target(client, cfg, "events_local")


def test_a_local_target_on_clickhouse_cluster_is_learnt_on_every_shard_of_that_cluster(
    sharded: EmbeddedStack, clients, db: str
) -> None:
    """``clickhouse.cluster`` plus the local table: every shard of the cluster, in ``system.clusters``'s order."""
    local_tables_with_rows(clients, db)
    given = parse_config(
        f'[pipeline]\nname = "p"\ntopics = ["t"]\n[kafka]\nbootstrap_servers = "x:1"\n'
        f'[clickhouse]\nurl = "{sharded.shard_urls[0]}"\ndatabase = "{db}"\ntarget_table = "events_local"\n'
        f'cluster = "{CLUSTER}"\n'
    )
    cfg = learnt(given)
    assert (cfg.clickhouse.target_table, cfg.clickhouse.shards) == ("events_local", sharded.shard_urls)
