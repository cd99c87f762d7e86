"""The processes of a soak: two coordinator replicas and the participant Spark job.

Each process runs in its own process group (``python -m cli ...``, with ``PYTHONPATH`` set to this
checkout), its output appended to ``<logs>/<name>.log`` after a header line per start. The
participant job is ``chtxn participant``, which starts spark-submit in a process group of its own:
killing "the whole job" signals every process group of the launcher's tree. The harness plays the
supervisor: ``supervise()`` restarts any process that exited while not held down by a fault, and
records the exit (a coordinator should never exit by itself).

Only processes started here are ever signalled: worker and job groups are found by walking the
launcher's own process tree, and a recorded group is signalled only while its leader is the same
process (pid and start time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from procs import is_running, signal_group, start_token
from tests.e2e.processes import descendants
from tests.helpers import wait_until

REPO = Path(__file__).resolve().parents[2]
COORDINATORS = ("coord-a", "coord-b")
PARTICIPANT = "participant"


class Cluster:
    def __init__(self, config_path: Path, logs: Path, *, slots: int, extra_env: dict[str, str] | None = None) -> None:
        self.config_path = config_path
        self.logs = logs
        self.slots = slots
        self.extra_env = extra_env or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.armed: dict[str, str] = {}  # name -> CHTXN_FAILPOINTS it runs with
        self.held: set[str] = set()  # deliberately down (or stopped) until a fault ends
        self.exits: list[dict] = []  # processes that exited by themselves
        self._job_groups: dict[int, str | None] = {}  # pgid -> start token of the group leader
        logs.mkdir(parents=True, exist_ok=True)

    # ---- starting ---------------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], env: dict[str, str], config: Path | None = None) -> subprocess.Popen:
        path = self.logs / f"{name}.log"
        with open(path, "a") as log:
            log.write(
                f"=== soak: start {name} at {time.strftime('%H:%M:%S')} "
                f"{' '.join(f'{k}={v}' for k, v in env.items() if k.startswith('CHTXN_'))}\n"
            )
        log = open(path, "a")  # noqa: SIM115 -- the child holds it; ours closes with the Popen
        full_env = {**os.environ, **self.extra_env, "PYTHONPATH": str(REPO), **env}
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli", *argv, "--config", str(config or self.config_path)],
            cwd=REPO,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        self.held.discard(name)
        return proc

    def start_coordinator(self, name: str, failpoints: str = "", config: Path | None = None) -> subprocess.Popen:
        """Start replica ``name``; ``failpoints`` (``CHTXN_FAILPOINTS``, armed by the CLI) and ``config``
        (another config file) for this run only."""
        env = {"CHTXN_COORDINATOR_ID": name}
        if failpoints:
            env["CHTXN_FAILPOINTS"] = failpoints
            self.armed[name] = failpoints
        else:
            self.armed.pop(name, None)
        return self._start(name, ["--log-level", "INFO", "coordinator"], env, config)

    def start_participant(self) -> subprocess.Popen:
        return self._start(PARTICIPANT, ["participant", "--master", f"local[{self.slots},4]"], {})

    def restart(self, name: str) -> subprocess.Popen:
        if name == PARTICIPANT:
            return self.start_participant()
        return self.start_coordinator(name)

    # ---- state ------------------------------------------------------------------------------

    def alive(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    def supervise(self) -> None:
        """Restart every process that exited while not held down, recording how it exited."""
        for name, proc in list(self.procs.items()):
            if name in self.held or proc.poll() is None:
                continue
            self.exits.append(
                {
                    "process": name,
                    "returncode": proc.returncode,
                    "at": time.time(),
                    "armed": self.armed.get(name, ""),
                    "log_tail": self.tail(name, 1500),
                }
            )
            self.restart(name)

    def tail(self, name: str, chars: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def job_tree(self) -> list:
        """The participant launcher's live process tree (``Proc`` rows), recording its groups."""
        proc = self.procs.get(PARTICIPANT)
        if proc is None or proc.poll() is not None:
            return []
        tree = descendants(proc.pid)
        mine = os.getpgrp()
        for p in tree:
            if p.pgid != mine and p.pgid == p.pid and p.pgid not in self._job_groups:
                self._job_groups[p.pgid] = start_token(p.pid)
        return tree

    def python_workers(self) -> list[int]:
        """PySpark task workers of this soak's job: children of its ``pyspark.daemon``."""
        tree = self.job_tree()
        daemons = {p.pid for p in tree if "pyspark.daemon" in p.args}
        return sorted(p.pid for p in tree if p.ppid in daemons and "pyspark.daemon" in p.args)

    # ---- faults -----------------------------------------------------------------------------

    def kill(self, name: str, *, hold: bool = True) -> None:
        """SIGKILL ``name``'s process group (for the participant: every group of the job) and reap it."""
        if hold:
            self.held.add(name)
        proc = self.procs[name]
        groups = self._job_group_leaders() if name == PARTICIPANT else {}
        signal_group(proc.pid, signal.SIGKILL)
        for pgid, token in groups.items():
            if is_running(pgid, token):
                signal_group(pgid, signal.SIGKILL)
        proc.wait(30)
        if groups:
            wait_until(
                lambda: not any(is_running(g, t) for g, t in groups.items()),
                30,
                f"the participant job's groups {sorted(groups)} gone",
            )
            for pgid in groups:
                self._job_groups.pop(pgid, None)

    def _job_group_leaders(self) -> dict[int, str | None]:
        self.job_tree()
        launcher = self.procs[PARTICIPANT].pid
        return {g: t for g, t in self._job_groups.items() if g != launcher}

    def pause(self, name: str) -> None:
        self.held.add(name)
        signal_group(self.procs[name].pid, signal.SIGSTOP)

    def resume(self, name: str) -> None:
        signal_group(self.procs[name].pid, signal.SIGCONT)
        self.held.discard(name)

    def stop_all(self, timeout_s: float = 60.0) -> None:
        """SIGCONT, then SIGTERM every process (the launcher passes it on to its job), SIGKILL what is
        left after ``timeout_s``, including any group of the job that outlived its launcher."""
        groups = dict(self._job_groups)
        try:
            groups.update(self._job_group_leaders() if PARTICIPANT in self.procs else {})
        except Exception:  # a vanished process tree is no reason not to stop
            pass
        for proc in self.procs.values():
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGCONT)
                signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for pgid, token in groups.items():
            if is_running(pgid, token):
                signal_group(pgid, signal.SIGKILL)
