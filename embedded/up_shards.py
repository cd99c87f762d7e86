"""What ``chtxn embedded up`` decides about ClickHouse shards (:mod:`embedded.daemon`): how many it
runs, and which running ones it restarts because their configuration names another cluster or no
keeper.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from embedded.ch_config import cluster_name_ok
from embedded.stack import CLICKHOUSE_DIR, shard_dir
from embedded.stack_state import StackState, shard_of, title
from procs import stop_group
from protocol.errors import SetupError


def count(
    data_dir: Path, shards: int | None, cluster: str, option: str, notes: list[str], recorded: Mapping[str, int]
) -> int:
    """How many ClickHouse shards ``up`` runs: ``shards``, else as many as ``data_dir`` holds (``recorded``:
    the shards ``state.json`` names). Raises SetupError for fewer than it holds, or a ``cluster`` name
    ClickHouse would not take."""
    if not cluster_name_ok(cluster):
        raise SetupError(
            f"--cluster {cluster!r}: a cluster name is letters, digits and _, not starting with a digit "
            "(nothing was started or stopped)"
        )
    held = max([1, *(shard_of(p.name) for p in data_dir.glob(f"{CLICKHOUSE_DIR}-shard*") if p.is_dir())])
    if shards is None:
        if held > 1 and len(recorded) < held:
            notes.append(
                f"{data_dir} holds the data of {held} ClickHouse shards, so all {held} start; "
                "`down --purge` is the way back to one"
            )
        return held
    if shards < 1:
        raise SetupError(f"--shards {shards}: a stack has at least one ClickHouse shard")
    if shards < held:
        raise SetupError(
            f"{data_dir} holds the data of {held} ClickHouse shards ({data_dir / shard_dir(held)} the last), and "
            f"--shards {shards} would leave some of it unserved: run `chtxn embedded up --shards {held}{option}` "
            f"(or without --shards), or `chtxn embedded down --purge{option}` to start from nothing "
            "(nothing was started or stopped)"
        )
    return shards


def restart_changed(
    state: StackState,
    names: list[str],
    *,
    keeper: bool,
    cluster: str,
    users: Mapping[str, str] | None,
    option: str,
    notes: list[str],
) -> None:
    """Stop the running shards configured otherwise than this ``up`` configures them (without the
    keeper it starts, or with another cluster), so that they start again on their ports, their data
    kept. Raises SetupError, stopping nothing, when one takes users whose passwords are not given."""
    changed = [
        name
        for name in names
        if name in state.components
        and ((keeper and not state.components[name].keeper) or state.components[name].cluster != cluster)
    ]
    for name in changed:
        component = state.components[name]
        if component.users and users is None:  # its passwords are known only to who set them
            if keeper and not component.keeper:
                why, how = "without a keeper", "with the keeper"
            else:
                why, how = "with another cluster", f"with the cluster of {len(names)} shards"
            command = "up" + (" --keeper" if keeper else "") + (f" --shards {len(names)}" if len(names) > 1 else "")
            raise SetupError(
                f"the {title(name)} runs {why} and takes users {', '.join(component.users)}: restarting it {how} "
                f"needs their passwords; run `chtxn embedded {command}{option} --user {component.users[0]} "
                "--password ...` (nothing was started or stopped)"
            )
    for name in changed:
        component = state.components.pop(name)
        stop_group(component.pid, component.token)
        if keeper and not component.keeper:
            what = "the ClickHouse endpoint" if name == CLICKHOUSE_DIR else f"the {title(name)}"
            notes.append(f"{what} ran without a keeper: restarted on port {component.port} with one, its data kept")
        else:
            notes.append(
                f"the {title(name)} was configured with another cluster: restarted on port {component.port} "
                f"with the cluster of {len(names)} shards, its data kept"
            )
