"""The detached embedded stack behind ``chtxn embedded up | down | status``.

``up`` starts the servers as background processes that outlive the command and records them in
``<data_dir>/state.json`` (pid, process start time, port, address), so ``down`` and ``status``
work from any shell. Guarantees:

- ``down`` signals only processes recorded by ``up`` whose pid *and* start time still match: a
  recycled pid is never touched, and nothing that ``up`` did not start is stopped.
- ``up`` on a running stack starts nothing and says so; on a half-running one (a server died) it
  starts only what is missing.
- ``up``, ``down`` hold a lock on the data directory, so two of them never interleave.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from embedded.broker import EmbeddedBroker
from embedded.clickhouse_process import EmbeddedClickHouse
from embedded.stack import EmbeddedStack
from procs import is_running, port_is_free, stop_group

DEFAULT_DATA_DIR = Path(".chtxn") / "embedded"
STATE_FILE = "state.json"
COMPONENTS = ("kafka", "clickhouse")
TITLES = {"kafka": "Kafka broker (Tansu)", "clickhouse": "ClickHouse endpoint (chDB)"}


class ComponentState(msgspec.Struct, frozen=True, kw_only=True):
    """One server that ``up`` started."""

    pid: int
    token: str | None  # process start time: tells our process from one that reuses its pid
    port: int
    address: str  # "127.0.0.1:9092" (Kafka bootstrap) or "http://127.0.0.1:8123"
    log: str
    started_at: str


class StackState(msgspec.Struct, kw_only=True):
    """The content of ``state.json``."""

    version: int = 1
    host: str = "127.0.0.1"
    data_dir: str = ""
    components: dict[str, ComponentState] = {}


@dataclass
class ComponentStatus:
    name: str
    state: ComponentState
    running: bool  # the recorded process is alive
    answering: bool  # its port answers (metadata for Kafka, /ping for ClickHouse)


@dataclass
class UpResult:
    state: StackState
    started: list[str] = field(default_factory=list)  # components started by this call
    notes: list[str] = field(default_factory=list)  # e.g. "port 9092 is taken: ..."

    @property
    def already_up(self) -> bool:
        return not self.started


def read_state(data_dir: Path) -> StackState | None:
    """The recorded state, or None when ``up`` never ran here (or ``down`` cleared it)."""
    path = Path(data_dir) / STATE_FILE
    if not path.exists():
        return None
    return msgspec.json.decode(path.read_bytes(), type=StackState)


def _write_state(data_dir: Path, state: StackState) -> None:
    path = data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(state)))
    tmp.replace(path)


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _alive(component: ComponentState) -> bool:
    return is_running(component.pid, component.token)


def up(data_dir: Path, *, kafka_port: int = 9092, clickhouse_port: int = 8123, host: str = "127.0.0.1") -> UpResult:
    """Start whatever of the stack is not running, detached. Raises SetupError when a server fails
    to start (after stopping any server this call started)."""
    data_dir = Path(data_dir).resolve()
    with _locked(data_dir):
        state = read_state(data_dir) or StackState(host=host, data_dir=str(data_dir))
        state.components = {k: v for k, v in state.components.items() if _alive(v)}
        result = UpResult(state=state)
        wanted = {"kafka": kafka_port, "clickhouse": clickhouse_port}
        for name in COMPONENTS:
            if name not in state.components and wanted[name] and not port_is_free(host, wanted[name]):
                result.notes.append(f"port {wanted[name]} is taken: the {TITLES[name]} uses a free port instead")
                wanted[name] = 0
        stack = EmbeddedStack(
            data_dir, kafka_port=wanted["kafka"], clickhouse_port=wanted["clickhouse"], host=state.host, detached=True
        )
        try:
            for name in COMPONENTS:
                if name in state.components:
                    continue
                service = stack.start_kafka() if name == "kafka" else stack.start_clickhouse()
                address = service.bootstrap if isinstance(service, EmbeddedBroker) else service.url
                state.components[name] = ComponentState(
                    pid=service.pid,
                    token=service.token,
                    port=service.port,
                    address=address,
                    log=str(service.log_path),
                    started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                )
                result.started.append(name)
        except BaseException:
            stack.stop()  # only what this call started
            for name in result.started:
                state.components.pop(name, None)
            _write_state(data_dir, state)
            raise
        _write_state(data_dir, state)
        return result


def down(data_dir: Path, *, purge: bool = False) -> list[str]:
    """Stop every server ``up`` recorded here; returns the names of those that were running.

    ``purge`` also deletes what the stack wrote (ClickHouse data, logs, state); nothing else in
    ``data_dir`` is touched.
    """
    data_dir = Path(data_dir).resolve()
    if not data_dir.exists():
        return []
    with _locked(data_dir):
        state = read_state(data_dir)
        stopped = []
        if state is not None:
            for name in reversed(COMPONENTS):
                component = state.components.get(name)
                if component is not None and stop_group(component.pid, component.token):
                    stopped.append(name)
            (data_dir / STATE_FILE).unlink(missing_ok=True)
        if purge:
            for sub in ("clickhouse", "logs"):
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
    for name in COMPONENTS:
        component = state.components.get(name)
        if component is None:
            continue
        running = _alive(component)
        probe = (
            EmbeddedBroker(component.port, state.host)
            if name == "kafka"
            else EmbeddedClickHouse(Path(data_dir) / "clickhouse", component.port, state.host)
        )
        out.append(ComponentStatus(name, component, running, running and probe.answers()))
    return out
