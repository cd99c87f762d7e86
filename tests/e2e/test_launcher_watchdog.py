"""``chtxn participant`` killed with SIGKILL takes its Spark job with it: no second copy of every
participant when a supervisor restarts the launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.processes import Proc, descendants, live_processes
from tests.helpers import unique_name, wait_until
from tests.pipelines import make_pipeline

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def python_workers_running(launcher: int) -> list[Proc]:
    """The launcher's whole tree once PySpark's daemon has forked task workers, else nothing."""
    tree = descendants(launcher)
    daemons = {p.pid for p in tree if "pyspark.daemon" in p.args}
    return tree if any(p.ppid in daemons for p in tree) else []


class Launcher:
    """``chtxn participant`` in its own session, and the process groups of the job it started."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli", "participant", "--config", str(config_path), "--master", "local[2,4]"],
                cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups: set[int] = set()

    def wait_for_tasks(self) -> list[Proc]:
        """The launcher's process tree once the tasks run; records the tree's process groups."""

        def started() -> list[Proc]:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the launcher exited with {self.proc.returncode}: {self.log_path.read_text()[-3000:]}"
                )
            return python_workers_running(self.proc.pid)

        tree = wait_until(started, 240, "PySpark task workers under the launcher")
        self.groups = {p.pgid for p in tree} - {os.getpgrp()}
        return tree

    def wait_until_the_job_is_gone(self) -> None:
        left: list[Proc] = []

        def all_gone() -> bool:
            left[:] = [p for p in live_processes() if p.pgid in self.groups]
            return not left

        try:
            wait_until(all_gone, 60, f"no process left in the job's process groups {sorted(self.groups)}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; still running: {left}") from None

    def kill_everything(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for pgid in self.groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def launcher(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("launcher"), partitions=2)
    started = Launcher(pipeline.config_path, tmp_path / "participant.log")
    try:
        yield started
    finally:
        started.kill_everything()


def test_sigkill_of_the_launcher_stops_the_spark_job(launcher):
    tree = launcher.wait_for_tasks()
    assert len(launcher.groups) > 1, f"expected spark-submit and PySpark's daemon in groups of their own: {tree}"
    os.kill(launcher.proc.pid, signal.SIGKILL)
    launcher.proc.wait(30)
    launcher.wait_until_the_job_is_gone()


def test_sigterm_of_the_launcher_stops_the_job_and_its_watchdog(launcher):
    tree = launcher.wait_for_tasks()
    assert any("-m procs" in p.args for p in tree), f"no watchdog under the launcher: {tree}"
    os.kill(launcher.proc.pid, signal.SIGTERM)
    launcher.proc.wait(120)
    launcher.wait_until_the_job_is_gone()
