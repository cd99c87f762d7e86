"""The DDL of tables kept by ClickHouse Keeper: stage tables of a ``Replicated*MergeTree`` or
``Shared*MergeTree`` target, chtxn's own replicated tables, ``ON CLUSTER`` clauses, and the local
table behind a ``Distributed`` target. Pure: text in, text out (docs/clusters.md).

Guarantees of ``stage_engine``:

- A stage table of a replicated target has its own Keeper path, never the target's: a
  ``Replicated*`` stage gets ``STAGE_PATH_ROOT`` + the target's path + ``/`` + the stage's name
  (``stage_keeper_path``), the same for a stage made again after a crash, so ``DROP TABLE ...
  SYNC`` of one frees the path for the next. The target's own macros (``{shard}``, ...) are kept,
  so every shard's stage tables are a table of their own; ``{database}``, ``{table}`` and
  ``{uuid}`` name the target, whose path they are part of. A ``Shared*`` stage, and a stage in a
  ``Replicated`` database (which refuses explicit Keeper paths), take no engine arguments: the
  server's default path then names the stage table's own UUID.
- A stage table keeps every row staged: its engine is the plain ``MergeTree`` of the target's
  family (``ReplicatedReplacingMergeTree(ver)`` -> ``ReplicatedMergeTree``), with the target's
  partition key, sorting key and settings (its storage policy among them), which ``MOVE PARTITION``
  requires of the two tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

#: Where the Keeper paths of chtxn's stage tables start (then the target's path, then the stage's name).
STAGE_PATH_ROOT = "/clickhouse/chtxn_stages"
#: Engine-name prefixes of the MergeTree families that keep their metadata in Keeper.
REPLICATED, SHARED = "Replicated", "Shared"

_PATH_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class EngineCall:
    """An ``engine_full``: the engine's name, its arguments as written, and the clauses after them."""

    name: str
    args: tuple[str, ...]
    rest: str  # " PARTITION BY ... ORDER BY ... SETTINGS ...", or ""


def parse_engine(engine_full: str) -> EngineCall:
    """``engine_full`` (``system.tables``) split into the engine call and the clauses after it."""
    match = re.match(r"\s*(\w+)", engine_full)
    if not match:
        raise ValueError(f"not an engine definition: {engine_full!r}")
    name, rest = match.group(1), engine_full[match.end() :]
    if not rest.startswith("("):
        return EngineCall(name, (), rest)
    close = _closing(rest, 0)
    args = tuple(a.strip() for a in _split_top(rest[1:close], ",") if a.strip())
    return EngineCall(name, args, rest[close + 1 :])


def family(engine: str) -> str:
    """``REPLICATED``, ``SHARED`` or "" (a single server's table) for a MergeTree engine's name."""
    if engine.startswith(REPLICATED):
        return REPLICATED
    return SHARED if engine.startswith(SHARED) or engine.endswith("SharedMergeTree") else ""


def base_engine(engine: str) -> str:
    """The engine's merge mode as a single server's engine: ``ReplicatedReplacingMergeTree`` and
    ``SharedReplacingMergeTree`` -> ``ReplacingMergeTree``."""
    for prefix in (REPLICATED, SHARED):
        if engine.startswith(prefix):
            return engine[len(prefix) :]
    return engine.replace("SharedMergeTree", "MergeTree")


def quote(text: str) -> str:
    """``text`` as a ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def unquote(literal: str) -> str | None:
    """The text of a ClickHouse string literal, None when ``literal`` is not one."""
    if len(literal) < 2 or literal[0] != "'" or literal[-1] != "'":
        return None
    return re.sub(r"\\(.)", r"\1", literal[1:-1])


def stage_keeper_path(target_path: str, *, database: str, table: str, uuid: str, stage: str) -> str:
    """The Keeper path of stage table ``stage`` of a target whose path (as its DDL has it, macros
    unexpanded) is ``target_path``: under ``STAGE_PATH_ROOT``, never inside the target's path
    (dropping the target's last replica removes everything under that), and on the same Keeper
    (an ``auxiliary:`` prefix is kept: ``MOVE PARTITION`` writes both tables' nodes in one session)."""
    keeper, path = "", target_path
    if not path.startswith("/") and ":" in path:
        keeper, path = path.split(":", 1)
        keeper += ":"
    path = path.replace("{database}", database).replace("{table}", table)
    if uuid:
        path = path.replace("{uuid}", uuid)
    return f"{keeper}{STAGE_PATH_ROOT}{path.rstrip('/')}/{_PATH_SAFE.sub(_escape, stage)}"


def _escape(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group(0).encode())


def stage_engine(
    engine_full: str,
    *,
    database: str,
    table: str,
    uuid: str,
    stage: str,
    replicated_database: bool = False,
    settings: dict[str, int] | None = None,
) -> str:
    """The ``ENGINE = ...`` text (without ``ENGINE =``) of stage table ``stage`` of replicated or
    shared target ``database.table`` (``engine_full``, UUID ``uuid`` or ""): the plain MergeTree of
    the target's family with the target's clauses, ``settings`` merged into them (module docstring).
    A single server's target has no Keeper path to change (``table_shape.engine_clause_as``)."""
    call = parse_engine(engine_full)
    kind = family(call.name)
    if not kind:
        raise ValueError(f"{database}.{table} is not replicated ({call.name}): its stage table needs no Keeper path")
    rest = with_settings(call.rest, settings or {})
    if kind == SHARED or replicated_database:
        return f"{kind}MergeTree" + rest
    target_path = unquote(call.args[0]) if call.args else None
    replica = unquote(call.args[1]) if len(call.args) > 1 else None
    if target_path is None or replica is None:
        raise ValueError(f"{database}.{table} has no Keeper path and replica name in {engine_full!r}")
    path = stage_keeper_path(target_path, database=database, table=table, uuid=uuid, stage=stage)
    return f"{REPLICATED}MergeTree({quote(path)}, {quote(replica)})" + rest


def with_settings(rest: str, settings: dict[str, int]) -> str:
    """``rest`` (an ``engine_full`` after the engine call) with ``settings`` in its SETTINGS clause,
    replacing the values it had for them."""
    if not settings:
        return rest
    ours = [f"{name} = {value}" for name, value in settings.items()]
    at = _find_top(rest, " SETTINGS ")
    if at < 0:
        return f"{rest} SETTINGS {', '.join(ours)}"
    theirs = [s.strip() for s in _split_top(rest[at + len(" SETTINGS ") :], ",")]
    kept = [s for s in theirs if s.split("=", 1)[0].strip() not in settings]
    return f"{rest[:at]} SETTINGS {', '.join(kept + ours)}"


# ---- ON CLUSTER, drops, chtxn's own tables -------------------------------------------------


def on_cluster(cluster: str) -> str:
    """`` ON CLUSTER `cluster```, or "" on a single server."""
    return f" ON CLUSTER `{cluster}`" if cluster else ""


def drop_table_sql(qualified: str, *, cluster: str = "") -> str:
    """Drop a table on every replica, and wait until it is gone (``SYNC``): a replicated table's
    Keeper path is free again when this returns, so a table of the same path can be made."""
    return f"DROP TABLE IF EXISTS {qualified}{on_cluster(cluster)} SYNC"


def drop_tables_sql(qualified: list[str]) -> str:
    """``drop_table_sql`` of several tables of one server in one statement (ClickHouse 24.2+)."""
    return f"DROP TABLE IF EXISTS {', '.join(qualified)} SYNC"


def keeper_path(database: str, table: str) -> str:
    """The Keeper path of chtxn's own replicated table ``table``: one table per shard (``{shard}``)."""
    return f"/clickhouse/tables/{{shard}}/{_PATH_SAFE.sub(_escape, database)}/{table}"


def replicated_engine(database: str, table: str) -> str:
    """``ReplicatedMergeTree('<keeper_path>', '{replica}')`` of chtxn's own table ``table``."""
    return f"ReplicatedMergeTree({quote(keeper_path(database, table))}, '{{replica}}')"


# ---- Distributed targets -------------------------------------------------------------------


def distributed_local_table(engine_full: str, database: str) -> tuple[str, str, str]:
    """(cluster, database, table) of the local tables behind a ``Distributed`` table of ``database``
    (``Distributed('cluster', 'db', 'table'[, sharding key[, policy]])``; '' is the table's own database)."""
    args = parse_engine(engine_full).args
    if len(args) < 3:
        raise ValueError(f"not a Distributed engine: {engine_full!r}")
    cluster, db, local = (_name(a) for a in args[:3])
    return cluster, db or database, local


def _name(arg: str) -> str:
    """An engine argument naming something: a string literal's text, or an identifier as written."""
    text = unquote(arg)
    return arg.strip("`") if text is None else text


# ---- scanning ------------------------------------------------------------------------------


def _scan(text: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, parenthesis depth) of each character of ``text`` outside quotes."""
    depth, quote_char, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote_char:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote_char:
                quote_char = ""
            continue
        if ch in "'`\"":
            quote_char = ch
            continue
        if ch in "([":
            depth += 1
        yield i, ch, depth
        if ch in ")]":
            depth -= 1


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at ``start``."""
    for i, ch, depth in _scan(text):
        if i > start and ch == ")" and depth == 1:
            return i
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _split_top(text: str, sep: str) -> list[str]:
    parts, last = [], 0
    for i, ch, depth in _scan(text):
        if ch == sep and depth == 0:
            parts.append(text[last:i])
            last = i + 1
    return [*parts, text[last:]]


def _find_top(text: str, needle: str) -> int:
    """Index of the last ``needle`` outside quotes and parentheses, -1 if none."""
    found = -1
    tops = {i for i, _, depth in _scan(text) if depth == 0}
    start = text.find(needle)
    while start >= 0:
        if all(i in tops for i in range(start, start + len(needle))):
            found = start
        start = text.find(needle, start + 1)
    return found
