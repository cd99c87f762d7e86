"""What ``chtxn embedded up`` records in ``DATA_DIR/state.json``: the servers it started, each by
name (``keeper``, ``kafka``, ``clickhouse``, ``clickhouse-shard2``, ...), with pid, port, address and
how a ClickHouse shard was configured. Fields added later have defaults, so a state an older chtxn
wrote still reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import msgspec

from embedded.ch_config import Cluster
from embedded.stack import CLICKHOUSE_DIR, shard_dir

STATE_FILE = "state.json"
#: In start order (``down`` stops them in reverse): the keeper, when there is one, before the endpoint;
#: shards 2 to N after it (``shard_names``).
COMPONENTS = ("keeper", "kafka", "clickhouse")
#: What a stack always has; the keeper is optional.
REQUIRED = ("kafka", "clickhouse")
TITLES = {"keeper": "Keeper (ZooKeeper)", "kafka": "Kafka broker (Tansu)", "clickhouse": "ClickHouse endpoint (chDB)"}
_SHARD_NAME = re.compile(rf"{CLICKHOUSE_DIR}-shard([1-9][0-9]*)\Z")


def shard_names(shards: int) -> list[str]:
    """The components of ``shards`` ClickHouse shards, shard 1 first: ``clickhouse``, ``clickhouse-shard2``, ...
    (the names of their data directories too)."""
    return [shard_dir(shard) for shard in range(1, shards + 1)]


def shard_of(name: str) -> int:
    """The shard a component is (1 for ``clickhouse``), 0 when it is no ClickHouse endpoint."""
    if name == CLICKHOUSE_DIR:
        return 1
    match = _SHARD_NAME.match(name)
    return int(match.group(1)) if match else 0


def title(name: str) -> str:
    """What output calls a component: ``ClickHouse endpoint (chDB), shard 2``."""
    shard = shard_of(name)
    return TITLES[CLICKHOUSE_DIR] + f", shard {shard}" if shard > 1 else TITLES[name]


def ordered(names: Iterable[str]) -> list[str]:
    """Component names in start order: the keeper, the broker, then the ClickHouse shards by number."""
    return sorted(names, key=lambda n: (COMPONENTS.index(n), 0) if n in COMPONENTS else (len(COMPONENTS), shard_of(n)))


class ComponentState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One server that ``up`` started."""

    pid: int
    token: str | None  # process start time: tells our process from one that reuses its pid
    port: int
    address: str  # "127.0.0.1:9092" (Kafka bootstrap, keeper) or "http://127.0.0.1:8123"
    log: str
    started_at: str
    keeper: str = ""  # the ClickHouse endpoint: the keeper address it was configured with ("": none)
    users: tuple[str, ...] = ()  # the ClickHouse endpoint: the users it takes (empty: anyone); never a password
    cluster: str = ""  # a ClickHouse shard: the cluster it was configured with, ``name=host:port,...`` ("": none)


class StackState(msgspec.Struct, kw_only=True):
    """The content of ``state.json``."""

    version: int = 1
    host: str = "127.0.0.1"
    data_dir: str = ""
    components: dict[str, ComponentState] = {}

    def shard_urls(self) -> list[str]:
        """The URL of every ClickHouse shard recorded, shard 1 first."""
        return [self.components[name].address for name in ordered(self.components) if shard_of(name)]

    def cluster_name(self) -> str | None:
        """The name of the shards' cluster; None without one (a single endpoint)."""
        shard = self.components.get(CLICKHOUSE_DIR)
        return Cluster.parse(shard.cluster).name if shard is not None and shard.cluster else None


def read_state(data_dir: Path) -> StackState | None:
    """The recorded state, or None when ``up`` never ran here (or ``down`` cleared it)."""
    path = Path(data_dir) / STATE_FILE
    if not path.exists():
        return None
    return msgspec.json.decode(path.read_bytes(), type=StackState)


def write_state(data_dir: Path, state: StackState) -> None:
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    tmp.replace(path)
