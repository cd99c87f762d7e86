"""ClickHouse's engine (chDB) with its data under one directory, shared by all HTTP requests.

Guarantees:
- Statements run concurrently, each on its own connection (``connect``), as on a server: inserts
  into one table from many connections are all kept, ``insert_deduplication_token`` deduplicates
  across connections, and DDL is atomic per statement, all by ClickHouse's own locking.
- A running statement can be cancelled by its HTTP query id (``kill``); it then fails with
  QUERY_WAS_CANCELLED.
- Data is ClickHouse's own on-disk format under ``data_dir``: closing and opening the engine on
  the same directory gives back every committed part.
- With a keeper (``keeper="host:port"``, a ZooKeeper such as :mod:`embedded.keeper`), the engine
  is configured for it (:func:`embedded.ch_config.server_config`): KeeperMap tables work, their
  znodes under ``KEEPER_MAP_PATH_PREFIX``. ClickHouse connects to the keeper when a statement first
  needs it and opens a new session by itself when the old one is lost. A data directory holding
  KeeperMap tables opens only with a keeper. The macros ``{shard}`` and ``{replica}`` are defined
  (``MACROS``), as on a replicated server, so ReplicatedMergeTree tables can be created with the
  usual paths; they stay read-only (chDB starts no interserver endpoint, which a replica needs to
  become active).
- With a cluster (``cluster``, this engine being its shard ``shard``), ``system.clusters`` lists
  the cluster's shards and the macros are defined, ``{shard}`` being this shard's number
  (:mod:`embedded.ch_config` says what ClickHouse does with the cluster).
- Background merges run at nice ``MERGE_NICE`` (ClickHouse's ``os_threads_nice_value_merge_mutate``):
  the engine shares its machine with the pipeline, and a merge can wait where an insert or a
  commit-path query should not. ClickHouse applies it only with ``CAP_SYS_NICE``; without it
  merges run at the process's own priority, as before.
- ``system.query_log`` and ``system.part_log`` are kept, as a server keeps them by default
  (:mod:`embedded.ch_config`).
"""

from __future__ import annotations

from pathlib import Path

from embedded.ch_config import KEEPER_MAP_PATH_PREFIX, MACROS, Cluster, server_config
from embedded.ch_connection import QUERY_ID_SETTING, EngineConnection, Outcome, latin1
from embedded.ch_errors import EngineError
from embedded.ch_sql import quote

__all__ = ["CANNOT_OPEN_DATA_DIR", "KEEPER_MAP_PATH_PREFIX", "MACROS", "Engine", "Outcome"]

CANNOT_OPEN_DATA_DIR = 76  # ClickHouse's CANNOT_OPEN_FILE
#: The engine's configuration file, in its data directory (rewritten at each open).
CONFIG_FILE = "chtxn-server.xml"
#: Where versions before 2026-11-29 kept it, with a keeper or a cluster only: removed at open.
OLD_CONFIG_FILE = "chtxn-keeper.xml"
#: Nice value of the engine's merge and mutation threads (0 = the process's priority, 19 lowest).
MERGE_NICE = 10


class Engine:
    """chDB on ``data_dir``, with the ZooKeeper at ``keeper`` ("host:port") when given, as shard
    ``shard`` (1-based) of ``cluster`` when given. Thread-safe; open one per process. Raises
    EngineError (CANNOT_OPEN_FILE) when the directory cannot be opened, e.g. another process serves it."""

    def __init__(self, data_dir: str | Path, keeper: str | None = None, cluster: Cluster | None = None, shard: int = 1):
        path = Path(data_dir)
        path.mkdir(parents=True, exist_ok=True)
        # chDB passes the parameters of its connection string to the engine as server settings.
        self._path = f"{path}?os_threads_nice_value_merge_mutate={MERGE_NICE}"
        config = path / CONFIG_FILE
        config.write_text(server_config(keeper, cluster, shard))
        (path / OLD_CONFIG_FILE).unlink(missing_ok=True)
        self._path += f"&config-file={config}"
        try:
            # The engine lives while any connection is open: this one is kept until close().
            self._anchor = EngineConnection(self._path, {})
        except Exception as ex:
            raise EngineError(
                CANNOT_OPEN_DATA_DIR,
                f"Cannot open the ClickHouse data directory {path} ({ex}): only one process at a time can serve a "
                "data directory; stop the other endpoint or chDB process using it, or choose another directory",
                "CANNOT_OPEN_FILE",
            ) from None
        version, tz = self._anchor.raw(b"SELECT version(), timezone()").bytes().decode().rstrip("\n").split("\t")
        self.version: str = version
        self.timezone: str = tz
        rows = self._anchor.raw(b"SELECT name, value FROM system.settings").bytes().decode().splitlines()
        self._baseline = {name: _unescape_tsv(value) for name, _, value in (r.partition("\t") for r in rows)}

    def connect(self) -> EngineConnection:
        """A new connection with start-up settings, ``default`` database and no temporary tables."""
        return EngineConnection(self._path, self._baseline)

    def kill(self, query_id: str) -> bool:
        """Cancel the running statement with this HTTP query id and wait until it stops; False when
        no such statement runs."""
        conn = self.connect()
        try:
            sql = f"KILL QUERY WHERE Settings['{QUERY_ID_SETTING}'] = {quote(query_id)} SYNC"
            return bool(conn.raw(latin1(sql)).bytes().strip())
        finally:
            conn.close()

    def close(self) -> None:
        """Release the engine; the data stays on disk. Open connections must be closed first."""
        self._anchor.close()


def _unescape_tsv(value: str) -> str:
    """A TabSeparated field back to its text (system.settings values are escaped in TSV)."""
    if "\\" not in value:
        return value
    out, i = [], 0
    escapes = {"t": "\t", "n": "\n", "\\": "\\", "'": "'", "0": "\0", "r": "\r", "b": "\b", "f": "\f"}
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            out.append(escapes.get(value[i + 1], value[i + 1]))
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)
