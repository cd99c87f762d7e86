"""The detached embedded stack behind ``chtxn embedded up | down | status``.

``up`` starts the servers as background processes that outlive the command and records them in
``<data_dir>/state.json`` (pid, process start time, port, address), so ``down`` and ``status``
work from any shell. The data directory is one per user by default (:func:`default_data_dir`), so
every command finds the same stack from any working directory. ``up --keeper`` also starts a keeper (ZooKeeper) before the ClickHouse
endpoint and configures the endpoint for it. Guarantees:

- ``down`` signals only processes recorded by ``up`` whose pid *and* start time still match: a
  recycled pid is never touched, and nothing that ``up`` did not start is stopped.
- ``up`` on a running stack starts nothing and says so; on a half-running one (a server died) it
  starts only what is missing.
- ``up``, ``down`` hold a lock on the data directory, so two of them never interleave.
- Data survives ``down`` and ``up``: ClickHouse's in ``DATA_DIR/clickhouse``, the broker's topics and
  records in ``DATA_DIR/kafka`` (:mod:`embedded.kafka_storage`), the keeper's in ``DATA_DIR/keeper``.
  ``down --purge`` is the one way to start from nothing.
- ``up --keeper`` on a stack whose ClickHouse endpoint runs without a keeper starts the keeper and
  restarts the endpoint with it, on its port, its data kept.
- Once a data directory has a keeper (``DATA_DIR/keeper``), every ``up`` starts it, ``--keeper`` or
  not, as its ClickHouse data may hold KeeperMap tables, which open only with their keeper; ``down
  --purge`` removes it. A keeper that died while the endpoint runs is started again on the port the
  endpoint was configured with.
- ``up`` with users (``--user``/``--password``) starts an endpoint that takes only them, and refuses
  (starting nothing) when the endpoint already running does not take them; without users it takes
  anyone, as before. Passwords reach the endpoint in its environment and are never written down.
- ``up --shards N`` runs N ClickHouse endpoints (``clickhouse``, ``clickhouse-shard2``, ...; see
  :mod:`embedded.stack`), each configured with the cluster naming all N. Shard K's port is
  ``--clickhouse-port`` + K - 1 unless taken. A shard whose configuration names other shards than
  this ``up``'s (one came back on another port, the cluster grew or was renamed) is restarted on its
  port, its data kept. A data directory holding N shards' data starts all N (``--shards`` or not)
  and refuses fewer; ``down --purge`` is the way back to one.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from embedded import credentials, up_shards
from embedded.broker import EmbeddedBroker
from embedded.ch_config import DEFAULT_CLUSTER
from embedded.clickhouse_process import EmbeddedClickHouse
from embedded.keeper import EmbeddedKeeper, port_is_free as keeper_port_is_free
from embedded.stack import CLICKHOUSE_DIR, KAFKA_DIR, EmbeddedStack
from embedded.stack_state import (
    COMPONENTS,
    REQUIRED as REQUIRED,  # read by cli.embedded_dir
    STATE_FILE,
    ComponentState,
    StackState as StackState,
    ordered,
    read_state as read_state,
    shard_names,
    shard_of,
    title,
    write_state,
)
from procs import is_running, port_is_free, stop_group

#: Names the data directory, overriding the per-user default.
DIR_ENV = "CHTXN_EMBEDDED_DIR"
#: Where chtxn kept the stack before the per-user default: relative to the directory ``up`` ran in.
LEGACY_DATA_DIR = Path(".chtxn") / "embedded"
KEEPER_DIR = "keeper"


@dataclass
class ComponentStatus:
    name: str
    state: ComponentState
    running: bool  # the recorded process is alive
    answering: bool  # its port answers (metadata for Kafka, /ping for ClickHouse, srvr for the keeper)


@dataclass
class UpResult:
    state: StackState
    started: list[str] = field(default_factory=list)  # components started by this call
    notes: list[str] = field(default_factory=list)  # e.g. "port 9092 is taken: ..."

    @property
    def already_up(self) -> bool:
        return not self.started


def default_data_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """``$CHTXN_EMBEDDED_DIR`` when set, else ``$XDG_STATE_HOME/chtxn/embedded``, else
    ``~/.local/state/chtxn/embedded``: the same directory whatever the working directory."""
    if environ.get(DIR_ENV):
        return Path(environ[DIR_ENV]).expanduser()
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "chtxn" / "embedded"


def runs(data_dir: Path) -> bool:
    """Some server that ``up`` recorded in ``data_dir`` still runs."""
    state = read_state(Path(data_dir).resolve())
    return state is not None and any(_alive(c) for c in state.components.values())


def legacy_stack(data_dir: Path) -> Path | None:
    """``./.chtxn/embedded`` (resolved) when a stack that an older chtxn started there still runs and it is
    not ``data_dir``; else None."""
    legacy = LEGACY_DATA_DIR.resolve()
    if legacy == Path(data_dir).resolve() or not runs(legacy):
        return None
    return legacy


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _alive(component: ComponentState) -> bool:
    return is_running(component.pid, component.token)


def up(
    data_dir: Path,
    *,
    kafka_port: int = 9092,
    clickhouse_port: int = 8123,
    keeper: bool = False,
    keeper_port: int = 2181,
    host: str = "127.0.0.1",
    clickhouse_users: Mapping[str, str] | None = None,
    option: str = "",
    shards: int | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> UpResult:
    """Start whatever of the stack is not running, detached; with ``keeper`` (or when ``data_dir``
    has one) the keeper too; with ``clickhouse_users`` (name -> password) an endpoint started here
    takes only those, and one already running must take them (else SetupError, saying how: ``option``
    is what finds this stack on a command line); with ``shards`` (None: as many as ``data_dir``
    holds, at least 1) that many ClickHouse endpoints in a cluster named ``cluster``. Raises
    SetupError when a server fails to start (after stopping any server this call started)."""
    data_dir = Path(data_dir).resolve()
    with _locked(data_dir):
        state = read_state(data_dir) or StackState(host=host, data_dir=str(data_dir))
        recorded_keeper = "keeper" in state.components
        # A shard that died comes back on its port if it can: the other shards' cluster names it.
        recorded_shards = {name: c.port for name, c in state.components.items() if shard_of(name)}
        state.components = {k: v for k, v in state.components.items() if _alive(v)}
        running = state.components.get("clickhouse")
        if clickhouse_users is not None and running is not None:
            credentials.check_running(running.address, running.users, clickhouse_users, data_dir, option)
        result = UpResult(state=state)
        names = shard_names(up_shards.count(data_dir, shards, cluster, option, result.notes, recorded_shards))
        if not keeper and (data_dir / KEEPER_DIR).exists():
            keeper = True
            if not recorded_keeper:
                result.notes.append(
                    f"{data_dir / KEEPER_DIR} exists, so the keeper starts too (its ClickHouse data may hold "
                    "KeeperMap tables); `down --purge` removes it"
                )
        wanted = {
            "keeper": keeper_port if keeper else 0,
            "kafka": kafka_port,
            **{name: clickhouse_port + shard - 1 if clickhouse_port else 0 for shard, name in enumerate(names, 1)},
        }
        if len(names) > 1:
            wanted.update({name: port for name, port in recorded_shards.items() if name in names})
        clickhouse = state.components.get("clickhouse")
        # A running endpoint names its keeper's port: a keeper started again serves that one, taken or not.
        pinned = int(clickhouse.keeper.rpartition(":")[2]) if clickhouse is not None and clickhouse.keeper else 0
        if pinned:
            keeper, wanted["keeper"] = True, pinned
        for name in [*COMPONENTS, *names[1:]]:
            if name in state.components:
                wanted[name] = state.components[name].port
                continue
            if not wanted[name] or (name == "keeper" and pinned):
                continue
            free = keeper_port_is_free if name == "keeper" else port_is_free
            if not free(host, wanted[name]):
                result.notes.append(f"port {wanted[name]} is taken: the {title(name)} uses a free port instead")
                wanted[name] = 0
        stack = EmbeddedStack(
            data_dir,
            kafka_port=wanted["kafka"],
            clickhouse_port=wanted["clickhouse"],
            host=state.host,
            detached=True,
            keeper=keeper and "keeper" not in state.components,
            keeper_port=wanted["keeper"],
            kafka_on_disk=True,
            clickhouse_users=clickhouse_users,
            shards=len(names),
            shard_ports=[wanted[name] for name in names[1:]],
            cluster=cluster,
        )
        defined = stack.cluster.arg if stack.cluster is not None else ""
        up_shards.restart_changed(
            state, names, keeper=keeper, cluster=defined, users=clickhouse_users, option=option, notes=result.notes
        )
        if "keeper" in state.components:
            for endpoint in stack.shards:
                endpoint.keeper = state.components["keeper"].address
        try:
            for name in [*COMPONENTS, *names[1:]]:
                if name in state.components or (name == "keeper" and not keeper):
                    continue
                service = _start(stack, name)
                state.components[name] = ComponentState(
                    pid=service.pid,
                    token=service.token,
                    port=service.port,
                    address=service.bootstrap if isinstance(service, EmbeddedBroker) else _address(service),
                    log=str(service.log_path),
                    started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    keeper=(service.keeper or "") if isinstance(service, EmbeddedClickHouse) else "",
                    users=tuple(clickhouse_users or ()) if isinstance(service, EmbeddedClickHouse) else (),
                    cluster=defined if isinstance(service, EmbeddedClickHouse) else "",
                )
                result.started.append(name)
        except BaseException:
            stack.stop()  # only what this call started
            for name in result.started:
                state.components.pop(name, None)
            write_state(data_dir, state)
            raise
        state.components = {name: state.components[name] for name in ordered(state.components)}
        write_state(data_dir, state)
        return result


def _start(stack: EmbeddedStack, name: str) -> EmbeddedBroker | EmbeddedClickHouse | EmbeddedKeeper:
    if name == "keeper":
        return stack.start_keeper()
    return stack.start_kafka() if name == "kafka" else stack.start_shard(shard_of(name))


def _address(service: EmbeddedClickHouse | EmbeddedKeeper) -> str:
    return service.url if isinstance(service, EmbeddedClickHouse) else service.address


def down(data_dir: Path, *, purge: bool = False) -> list[str]:
    """Stop every server ``up`` recorded here; returns the names of those that were running.

    ``purge`` also deletes what the stack wrote (every shard's ClickHouse data, the keeper's, logs, state);
    nothing else in ``data_dir`` is touched.
    """
    data_dir = Path(data_dir).resolve()
    if not data_dir.exists():
        return []
    with _locked(data_dir):
        state = read_state(data_dir)
        stopped = []
        if state is not None:
            for name in reversed(ordered(state.components)):
                component = state.components[name]
                if stop_group(component.pid, component.token):
                    stopped.append(name)
            (data_dir / STATE_FILE).unlink(missing_ok=True)
        if purge:
            shards = [p.name for p in data_dir.glob(f"{CLICKHOUSE_DIR}-shard*") if shard_of(p.name)]
            for sub in (CLICKHOUSE_DIR, *shards, KAFKA_DIR, KEEPER_DIR, "logs"):
                shutil.rmtree(data_dir / sub, ignore_errors=True)
    if purge:
        (data_dir / ".lock").unlink(missing_ok=True)
        if not any(data_dir.iterdir()):
            data_dir.rmdir()
    return stopped


def status(data_dir: Path) -> list[ComponentStatus]:
    """What ``up`` recorded here and whether it runs and answers; empty when nothing is recorded."""
    state = read_state(Path(data_dir).resolve())
    if state is None:
        return []
    out = []
    for name in ordered(state.components):
        component = state.components[name]
        running = _alive(component)
        probe: EmbeddedBroker | EmbeddedClickHouse | EmbeddedKeeper
        if name == "kafka":
            probe = EmbeddedBroker(component.port, state.host)
        elif name == "keeper":
            probe = EmbeddedKeeper(Path(data_dir) / KEEPER_DIR, component.port, state.host)
        else:
            probe = EmbeddedClickHouse(Path(data_dir) / name, component.port, state.host)
        out.append(ComponentStatus(name, component, running, running and probe.answers()))
    return out
