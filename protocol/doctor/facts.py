"""What ``chtxn doctor`` found on the live ClickHouse server and Kafka broker, and the verdict shape it
gives them. Pure: the facts are gathered by ``coordinator.doctor``, judged by ``protocol.doctor.rules``.

Every field is what the server or broker said, not an interpretation: settings as ``system.settings``
shows them for this user's profile, tables as ``system.tables`` shows them (``engine_full`` keeps
macros unexpanded), the KeeperMap probe as the steps it took.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from protocol.checks import Check
from protocol.tables.target_rules import ViewTable


class Report(msgspec.Struct, frozen=True, kw_only=True):
    """What ``chtxn doctor --json`` prints: the checks in order; ``ok`` when none failed."""

    pipeline: str
    ok: bool
    checks: tuple[Check, ...]


class Setting(msgspec.Struct, frozen=True, kw_only=True):
    """A setting of the user's profile (``system.settings``); ``readonly``: a constraint forbids changing it."""

    value: str
    readonly: bool = False


class Table(msgspec.Struct, frozen=True, kw_only=True):
    engine: str
    engine_full: str
    columns: tuple[str, ...] = ()
    types: tuple[str, ...] = ()  # each column's type, in the order of ``columns`` (the target's only)
    sorting_key: str = ""  # as system.tables shows them ("" when the table has none)
    partition_key: str = ""


class Replica(msgspec.Struct, frozen=True, kw_only=True):
    """The target's row of ``system.replicas`` on the server asked."""

    is_readonly: bool
    is_session_expired: bool
    queue_size: int
    absolute_delay: int  # seconds behind the freshest replica


KeeperOutcome = Literal["ok", "disabled", "unreachable", "not-strict", "failed"]


class KeeperProbe(msgspec.Struct, frozen=True, kw_only=True):
    """How the KeeperMap probe went: ``ok`` (a strict insert took a key, a second strict insert of it
    failed, the key read back), ``disabled`` (the server has no KeeperMap: no Keeper or no
    ``keeper_map_path_prefix``), ``unreachable`` (Keeper did not answer), ``not-strict`` (the second
    insert succeeded), ``failed`` (anything else). ``leftover`` names a probe table it could not drop."""

    outcome: KeeperOutcome
    path: str  # the probe's Keeper path (under ledger.keeper_path)
    detail: str = ""  # the server's error, when there was one
    seconds: float = 0.0
    leftover: str = ""


class ClickHouseFacts(msgspec.Struct, frozen=True, kw_only=True):
    error: str = ""  # the server did not answer: every other field is empty
    error_code: int = 0  # ClickHouse's code of that error, 0 when it gave none
    version: str = ""
    settings: dict[str, Setting] = {}  # the names in SETTINGS_READ the server knows
    merge_tree: dict[str, str] = {}  # the defaults of MERGE_TREE_READ (system.merge_tree_settings)
    macros: dict[str, str] = {}
    target: Table | None = None  # None: the target does not exist
    replicas: tuple[Replica, ...] = ()
    views: tuple[str, ...] = ()  # materialized views reading from the target ("db.view")
    view_tables: tuple[ViewTable, ...] = ()  # the tables those views write to (when the server says)
    ledger: Table | None = None  # None: not created yet
    stage_window: int = 0  # the non_replicated_deduplication_window chtxn sets on each stage table
    keeper: KeeperProbe | None = None  # None: not probed
    #: placed by a sharding key: the type of ``clickhouse.sharding_key`` over the target ("" when not
    #: asked), or why the server could not evaluate it there
    key_type: str = ""
    key_error: str = ""


class KafkaFacts(msgspec.Struct, frozen=True, kw_only=True):
    error: str = ""  # the broker did not answer: every other field is empty
    topics: dict[str, int] = {}  # every topic the broker lists -> its partition count
    control_problem: str = ""  # why the existing control topic is refused ("" when it is not)
    transactions: str | None = None  # None: not probed; "": the probe passed; else how it failed
    transactions_s: float = 0.0


#: Settings of the profile the doctor reads and the settings chtxn sends (an older server refuses an
#: unknown setting, so each must exist).
SETTINGS_READ = (
    "async_insert",
    "insert_quorum",
    "select_sequential_consistency",
    "insert_deduplicate",
    "insert_deduplication_token",
    "keeper_map_strict_mode",
    "insert_keeper_max_retries",
    "keeper_max_retries",
)
#: MergeTree defaults that bound deduplication when a table does not set them itself.
MERGE_TREE_READ = (
    "non_replicated_deduplication_window",
    "replicated_deduplication_window",
    "replicated_deduplication_window_seconds",
)
#: Macros ClickHouse fills in itself in a replicated table's path and replica name.
BUILTIN_MACROS = frozenset({"uuid", "database", "table"})


def replicated(engine: str) -> bool:
    """A ReplicatedMergeTree-family or SharedMergeTree-family (ClickHouse Cloud) engine."""
    return engine.startswith(("Replicated", "Shared")) and engine.endswith("MergeTree")


def merge_tree(engine: str) -> bool:
    return engine.endswith("MergeTree")


def engine_args(engine_full: str, engine: str) -> list[str]:
    """The arguments of the engine call at the start of ``engine_full``, each as written, surrounding
    quotes removed (``Distributed('c', db, 'local', rand())`` -> ``['c', 'db', 'local', 'rand()']``)."""
    rest = engine_full[len(engine) :] if engine_full.startswith(engine) else ""
    if not rest.startswith("("):
        return []
    args, depth, quote, current = [], 0, "", ""
    for ch in rest[1:]:
        if quote:
            quote = "" if ch == quote and not current.endswith("\\") else quote
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")" and depth == 0:
            break
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(current)
            current = ""
            continue
        current += ch
    args.append(current)
    return [a.strip().strip("'`\"") for a in args if a.strip()]


def setting_in(engine_full: str, name: str) -> int | None:
    """The value of MergeTree setting ``name`` in a table's ``SETTINGS`` clause, or None when it sets none."""
    match = re.search(rf"\b{name}\s*=\s*(\d+)", engine_full)
    return int(match.group(1)) if match else None


def macros_used(engine_full: str, engine: str) -> set[str]:
    """The macros (``{shard}``, ``{replica}``) a table's engine arguments name, less ClickHouse's own."""
    return set(re.findall(r"\{(\w+)\}", " ".join(engine_args(engine_full, engine)))) - BUILTIN_MACROS


def version_tuple(version: str) -> tuple[int, int] | None:
    """``"26.9.2.1"`` -> ``(26, 9)``; None when it is not a ClickHouse version."""
    match = re.match(r"(\d+)\.(\d+)", version.strip())
    return (int(match.group(1)), int(match.group(2))) if match else None
