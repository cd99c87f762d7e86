"""The server configuration the embedded engine opens with: a keeper, macros and a cluster.

chDB takes a ClickHouse server configuration file (``config-file`` in its connection string) and
reads from it what an engine without servers uses: ``<zookeeper>``, ``<keeper_map_path_prefix>``,
``<macros>``, ``<remote_servers>``, ``<tcp_port>`` and the system logs. This module writes that
file's text.

Every endpoint keeps ``system.query_log`` and ``system.part_log``, as a ClickHouse server does with
its default configuration: what each statement and each merge cost (``ProfileEvents``) is then a
query away, for an operator and for the benchmarks (``benchmarks/ch_profile.py``). Each is flushed
every ``LOG_FLUSH_MS``, as a server does, and by ``SYSTEM FLUSH LOGS``.

A cluster (:class:`Cluster`) names every shard's endpoint as ``<remote_servers>`` does, one replica
per shard, so ``system.clusters`` lists them and ``Distributed`` tables and ``cluster()`` accept the
name. The port given for each shard is its HTTP port: the embedded endpoints speak ClickHouse's
HTTP interface only, there is no native (TCP) port to name. An endpoint's own ``<tcp_port>`` is set
to that same port, so that ClickHouse sees its own row as local (``is_local = 1``) as a server
does, and reads its own shard in-process. What ClickHouse does with the other rows (it speaks the
native protocol to them, which an HTTP port does not answer) is written down in
``tests/integration/test_embedded_shards.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.sax.saxutils import escape

#: The znode under which KeeperMap tables keep their rows (ClickHouse's ``keeper_map_path_prefix``).
KEEPER_MAP_PATH_PREFIX = "/chtxn_keeper_map"
#: The server macros of shard 1 (``system.macros``), as a replicated server defines them; shard ``k``
#: of a cluster has ``shard`` = ``k`` in two digits.
MACROS = {"shard": "01", "replica": "chdb"}
#: The name of the embedded stack's cluster unless it is given another.
DEFAULT_CLUSTER = "chtxn_shards"
#: How often the system logs are written to their tables (ClickHouse's default).
LOG_FLUSH_MS = 7500
#: The system logs every endpoint keeps (ClickHouse's default configuration keeps them too).
SYSTEM_LOGS = ("query_log", "part_log")

_CLUSTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Cluster:
    """A cluster of ``shards`` (each ``host:port``, shard 1 first), one replica per shard."""

    name: str
    shards: tuple[str, ...]

    def __post_init__(self) -> None:
        if not cluster_name_ok(self.name):
            raise ValueError(f"cluster name {self.name!r}: expected letters, digits and _, not starting with a digit")
        if not self.shards:
            raise ValueError(f"cluster {self.name}: no shard")
        for address in self.shards:
            _split(address)

    @property
    def arg(self) -> str:
        """``name=host:port,host:port``: the form :meth:`parse` reads (and ``--cluster`` takes)."""
        return f"{self.name}={','.join(self.shards)}"

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """The cluster of ``name=host:port,host:port``; ValueError when it is not that."""
        name, sep, shards = text.partition("=")
        if not sep:
            raise ValueError(f"cluster {text!r}: expected NAME=HOST:PORT[,HOST:PORT...]")
        return cls(name, tuple(s.strip() for s in shards.split(",")))

    def port(self, shard: int) -> int:
        """The port of shard ``shard`` (1-based)."""
        if not 1 <= shard <= len(self.shards):
            raise ValueError(f"cluster {self.name} has shards 1 to {len(self.shards)}, not {shard}")
        return _split(self.shards[shard - 1])[1]


def cluster_name_ok(name: str) -> bool:
    """Whether ClickHouse takes ``name`` for a cluster (an XML element of ``<remote_servers>``)."""
    return bool(_CLUSTER_NAME.match(name))


def macros(shard: int = 1) -> dict[str, str]:
    """The macros of shard ``shard`` (1-based)."""
    return {**MACROS, "shard": f"{shard:02d}"}


def server_config(keeper: str | None = None, cluster: Cluster | None = None, shard: int = 1) -> str:
    """The configuration of shard ``shard`` of ``cluster`` (or of a lone endpoint, without one):
    with ``keeper`` ("host:port" of a ZooKeeper) the keeper and the KeeperMap path prefix; with
    ``cluster`` its ``<remote_servers>`` and this endpoint's ``<tcp_port>``; with either, the macros;
    always the system logs."""
    lines = ["<clickhouse>"]
    lines += [
        f"    <{log}><database>system</database><table>{log}</table>"
        f"<flush_interval_milliseconds>{LOG_FLUSH_MS}</flush_interval_milliseconds></{log}>"
        for log in SYSTEM_LOGS
    ]
    if keeper is not None:
        host, port = _split(keeper)
        lines += [
            "    <zookeeper>",
            f"        <node><host>{escape(host)}</host><port>{port}</port></node>",
            "    </zookeeper>",
            f"    <keeper_map_path_prefix>{KEEPER_MAP_PATH_PREFIX}</keeper_map_path_prefix>",
        ]
    if cluster is not None:
        lines += [
            f"    <tcp_port>{cluster.port(shard)}</tcp_port>",
            "    <remote_servers>",
            f"        <{cluster.name}>",
        ]
        for address in cluster.shards:
            host, port = _split(address)
            lines.append(
                f"            <shard><replica><host>{escape(host)}</host><port>{port}</port></replica></shard>"
            )
        lines += [f"        </{cluster.name}>", "    </remote_servers>"]
    if keeper is not None or cluster is not None:
        lines.append(f"    <macros>{''.join(f'<{k}>{escape(v)}</{k}>' for k, v in macros(shard).items())}</macros>")
    return "\n".join([*lines, "</clickhouse>", ""])


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address {address!r}: expected host:port")
    return host, int(port)
