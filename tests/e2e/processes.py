"""The processes of an end-to-end test: a coordinator and the Spark participant job started the way
an operator starts them (``python -m cli ...``), each in its own process group, stopped at the end;
waits on what they commit; and the machine's process tree as ``ps`` lists it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import wait_until
from tests.pipelines import Pipeline

REPO = Path(__file__).resolve().parents[2]


class Processes:
    """The pipeline's processes, each in its own process group, stopped at the end."""

    def __init__(self, pipeline: Pipeline, logs: Path) -> None:
        self.pipeline = pipeline
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}

    def start(
        self, name: str, *argv: str, env: dict[str, str] | None = None, stdout_apart: bool = False
    ) -> subprocess.Popen:
        """``python -m cli <argv> --config <pipeline>``: its stdout and stderr in ``<name>.log``; with
        ``stdout_apart``, its stderr alone there and its stdout in ``<name>.stdout`` (``stdout(name)``)."""
        log = open(self.logs / f"{name}.log", "a")  # noqa: SIM115 -- closed with the process
        out = open(self.logs / f"{name}.stdout", "a") if stdout_apart else log  # noqa: SIM115 -- as log
        env = {**os.environ, "PYTHONPATH": str(REPO), "CHTXN_COORDINATOR_ID": name, **(env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", *argv, "--config", str(self.pipeline.config_path)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=log if stdout_apart else subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def coordinator(self, name: str = "coordinator") -> subprocess.Popen:
        return self.start(name, "coordinator")

    def participants(
        self, slots: int, env: dict[str, str] | None = None, stdout_apart: bool = False
    ) -> subprocess.Popen:
        return self.start(
            "participant", "participant", "--master", f"local[{slots},4]", env=env, stdout_apart=stdout_apart
        )

    def kill(self, name: str) -> None:
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(30)

    def alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None and proc.returncode not in (-signal.SIGKILL,):
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def python_workers(self) -> list[int]:
        """The PySpark Python workers of the participant job started here (see :func:`python_workers`)."""
        return python_workers(self.procs["participant"].pid)

    def tail(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()[-4000:]

    def stdout(self, name: str) -> str:
        """The stdout of a process started with ``stdout_apart``."""
        return (self.logs / f"{name}.stdout").read_text()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@contextmanager
def running(pipeline: Pipeline, tmp_path: Path, slots: int):
    procs = Processes(pipeline, tmp_path)
    try:
        procs.coordinator()
        procs.participants(slots)
        yield procs
    finally:
        procs.stop_all()


def committed(pipeline: Pipeline, expected: int, procs: Processes, timeout_s: float = 300) -> None:
    def done() -> bool:
        procs.alive()
        return pipeline.target_count() >= expected

    wait_until(done, timeout_s, f"{expected} rows in the target")


def python_workers(root: int) -> list[int]:
    """PySpark's Python workers under ``root`` (the participant job's launcher): processes forked by
    a ``pyspark.daemon`` (same command line). Only ``root``'s, never another job's on the machine."""
    daemons = {p.pid: p.ppid for p in descendants(root) if "pyspark.daemon" in p.args}
    return sorted(pid for pid, ppid in daemons.items() if ppid in daemons)


@dataclass(frozen=True)
class Proc:
    """A line of ``ps``: a process, its parent and its process group, and its command line."""

    pid: int
    ppid: int
    pgid: int
    args: str


def live_processes() -> list[Proc]:
    """Every process on the machine but zombies (exited, waiting to be reaped)."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,ppid=,pgid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in out.splitlines():
        pid, ppid, pgid, stat, *args = line.split(None, 4)
        if not stat.startswith("Z"):
            found.append(Proc(int(pid), int(ppid), int(pgid), args[0] if args else ""))
    return found


def descendants(root: int) -> list[Proc]:
    """The live processes started by ``root``, recursively (children of reparented orphans are lost)."""
    procs = live_processes()
    children: dict[int, list[Proc]] = {}
    for proc in procs:
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found
