"""A Spark standalone cluster for tests: one master and N workers from pyspark's own jars, on loopback.

Each JVM is ``$SPARK_HOME/bin/spark-class org.apache.spark.deploy.{master.Master,worker.Worker}``
(``SPARK_HOME`` = the installed pyspark package) in a process group of its own with a watchdog
(:class:`procs.ManagedProcess`), so none outlives the test session, even a SIGKILLed pytest. Ports
are free ones, work and scratch dirs live under the cluster's directory. :meth:`SparkCluster.start`
returns once every worker is registered with the master (its JSON UI says so); :meth:`stop` stops
the JVMs and reaps every process they started (executors, PySpark daemons and workers) by pid.

Workers run in a clean environment: no ``PYTHONPATH``, no virtualenv on ``PATH``, so an executor can
only import what the application ships to it, as on a real cluster.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from procs import ManagedProcess, free_port, start_token
from tests.helpers import wait_until

EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
#: The JIT of the Spark JVMs the tests start (these daemons and their executors, and spark-submit's driver
#: through tests.conftest): C1 only. Their runs are short, and C2's compiling took half of a driver's CPU,
#: the machine's under ``make test``'s parallel workers, for nothing a test sees.
JVM_JIT = "-XX:TieredStopAtLevel=1"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def process_table() -> dict[int, tuple[int, list[str]]]:
    """Every live process: pid -> (parent pid, argv). Linux ``/proc``; zombies left out."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        table[int(entry.name)] = (int(fields[1]), [a.decode(errors="replace") for a in argv if a])
    return table


def descendants(pid: int, table: dict[int, tuple[int, list[str]]] | None = None) -> list[int]:
    """The processes started by ``pid``, recursively (children of reparented orphans are lost)."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, pending = [], list(children.get(pid, []))
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(children.get(child, []))
    return sorted(found)


@dataclass
class Worker:
    index: int
    port: int
    webui_port: int
    work_dir: Path
    process: ManagedProcess
    started: list[int] = field(default_factory=list)  # every process seen under this worker, for teardown

    @property
    def pid(self) -> int:
        return self.process.pid


class SparkCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, under ``base_dir``."""

    def __init__(self, base_dir: Path, *, workers: int = 2, cores: int = 2, memory: str = "1g") -> None:
        self.base_dir = base_dir
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.port, self.webui_port = free_port(), free_port()
        self.master: ManagedProcess | None = None
        self.workers: list[Worker] = []
        self._strays: dict[int, str | None] = {}  # pid -> start token: processes of killed workers

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.webui_port}"

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, timeout_s: float = 180) -> SparkCluster:
        self.master = self._jvm(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
        )
        # A UI still starting may answer with no JSON, or cut its answer short.
        wait_until(
            lambda: self._running(self.master) and self.state(),
            timeout_s,
            f"the Spark master UI at {self.ui_url}",
            interval_s=0.5,
            ignore=(OSError, ValueError, http.client.HTTPException),
        )
        for index in range(self.n_workers):
            self.workers.append(self._start_worker(index))
        self.wait_for_workers(timeout_s)
        return self

    def _start_worker(self, index: int) -> Worker:
        port, webui_port = free_port(), free_port()
        work_dir = self.base_dir / f"worker-{index}-{port}"
        work_dir.mkdir(parents=True)
        process = self._jvm(
            f"worker-{index}",
            [
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(webui_port),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(work_dir),
            ],
            local_dir=work_dir / "local",
        )
        return Worker(index, port, webui_port, work_dir, process)

    def _jvm(self, name: str, argv: list[str], local_dir: Path | None = None) -> ManagedProcess:
        home = spark_home()
        java = shutil.which("java")
        java_bin = [str(Path(java).resolve().parent)] if java else []
        path = ":".join([*java_bin, "/usr/local/bin", "/usr/bin", "/bin"])
        env = {
            "PATH": path,
            "HOME": os.environ.get("HOME", str(self.base_dir)),
            "LANG": "C.UTF-8",
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "512m",
            # C1 only (JVM_JIT), for the daemons and the executors they start; the JVM's "Picked up
            # JAVA_TOOL_OPTIONS" line goes to their logs under base_dir.
            "JAVA_TOOL_OPTIONS": JVM_JIT,
            "SPARK_LOCAL_DIRS": str(local_dir or self.base_dir / "local"),
        }
        if os.environ.get("JAVA_HOME"):
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        process = ManagedProcess(
            name,
            [str(home / "bin" / "spark-class"), *argv],
            log_path=self.base_dir / f"{name}.log",
            env=env,
            cwd=str(self.base_dir),
            grace_s=10,
        )
        process.start()
        return process

    @staticmethod
    def _running(process: ManagedProcess | None) -> bool:
        """True while ``process`` runs; fails the test with its log when it has exited."""
        if process is None or not process.running():
            raise AssertionError(
                f"Spark {process.name if process else 'master'} exited:\n{process.log_tail(40) if process else ''}"
            )
        return True

    def wait_for_workers(self, timeout_s: float = 180) -> None:
        """Until every live worker of ours is ALIVE in the master's JSON UI."""

        def registered() -> bool:
            for worker in self.workers:
                self._running(worker.process)
            return {w.port for w in self.workers} <= self.alive_worker_ports()

        wait_until(
            registered,
            timeout_s,
            f"{len(self.workers)} workers registered with {self.url}",
            interval_s=0.5,
            ignore=(OSError, ValueError),
        )

    def ensure_workers(self, timeout_s: float = 180) -> None:
        """Restart the workers that were killed, and wait until all are registered."""
        for i, worker in enumerate(self.workers):
            if not worker.process.running():
                worker.process.stop()
                self.workers[i] = self._start_worker(worker.index)
        self.wait_for_workers(timeout_s)

    def stop(self) -> None:
        """Stop every worker and the master, then SIGKILL whatever they started that is still there."""
        table = process_table()
        for worker in self.workers:
            if worker.process.running():
                self._remember(descendants(worker.pid, table))
        for worker in self.workers:
            worker.process.stop()
        if self.master is not None:
            self.master.stop()
        for pid, token in self._strays.items():
            if token is not None and start_token(pid) == token:
                os.kill(pid, signal.SIGKILL)

    def _remember(self, pids: list[int]) -> None:
        for pid in pids:
            self._strays.setdefault(pid, start_token(pid))

    # ---- state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """The master's JSON UI (``/json/``): workers, applications, cores."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as response:
            return json.load(response)

    def alive_worker_ports(self) -> set[int]:
        return {w["port"] for w in self.state().get("workers", []) if w.get("state") == "ALIVE"}

    def executor_pids(self, worker: Worker, table: dict | None = None) -> list[int]:
        """The executor JVMs the worker started (``CoarseGrainedExecutorBackend`` children)."""
        table = process_table() if table is None else table
        return sorted(
            pid
            for pid, (parent, argv) in table.items()
            if parent == worker.pid and any(EXECUTOR_MAIN in a for a in argv)
        )

    def python_processes(self, worker: Worker, table: dict | None = None) -> list[int]:
        """The Python processes under the worker's executors: PySpark daemons and their workers."""
        table = process_table() if table is None else table
        found = []
        for executor in self.executor_pids(worker, table):
            found += [pid for pid in descendants(executor, table) if _is_python(table[pid][1])]
        return sorted(found)

    def participant_processes(self, worker: Worker, table: dict | None = None) -> list[int]:
        """The PySpark workers forked by a daemon (a task runs in each): same argv as their parent."""
        table = process_table() if table is None else table
        pythons = set(self.python_processes(worker, table))
        return sorted(pid for pid in pythons if table[pid][0] in pythons)

    def kill_worker(self, worker: Worker) -> list[int]:
        """SIGKILL the worker JVM and its executor JVMs (only those); returns their pids."""
        table = process_table()
        self._remember(descendants(worker.pid, table))
        killed = [*self.executor_pids(worker, table), worker.pid]
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not worker.process.running(), 30, f"worker {worker.index} to die")
        return killed


def _is_python(argv: list[str]) -> bool:
    return bool(argv) and Path(argv[0]).name.startswith("python")
