"""Helpers for every integration test: unique names, waiting on a condition, topics that exist,
the ``chtxn`` command run as a process, and whether a process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from procs import start_token
from protocol import naming

T = TypeVar("T")

#: The root of this checkout.
REPO = Path(__file__).resolve().parents[1]


def unique_name(prefix: str) -> str:
    """``<prefix>_<10 hex digits>``: unique per call, valid as a Kafka topic, ClickHouse table or
    database, and pipeline name (when ``prefix`` is)."""
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    *,
    interval_s: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    Fails the test with ``timed out after N s waiting for <what>`` (with the last value seen) when
    ``timeout_s`` passes first. Exceptions raised by ``predicate`` propagate at once, except those
    listed in ``ignore``, which count as "not yet" and are shown in the failure message.
    """
    deadline = time.monotonic() + timeout_s
    last: object = None
    last_error: BaseException | None = None
    while True:
        try:
            last = predicate()
            last_error = None
        except ignore as exc:
            last, last_error = None, exc
        if last:
            return last  # type: ignore[return-value]  # what predicate returned
        if time.monotonic() >= deadline:
            detail = f"last error: {last_error!r}" if last_error is not None else f"last value: {last!r}"
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} ({detail})")
        time.sleep(interval_s)


def create_topic(admin, name: str, partitions: int, timeout_s: float = 30.0) -> str:  # AdminClient
    """Create a topic and return once its metadata lists every partition. Returns ``name``."""
    from confluent_kafka.admin import NewTopic

    for future in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=timeout_s).values():
        future.result(timeout_s)

    def described() -> bool:
        topic = admin.list_topics(name, timeout=5).topics.get(name)
        return topic is not None and topic.error is None and len(topic.partitions) == partitions

    wait_until(described, timeout_s, f"topic {name} to list {partitions} partitions")
    return name


def run_chtxn(
    *args: str,
    timeout_s: float | None = 180,
    env: Mapping[str, str] | None = None,
    inherit_chtxn_vars: bool = True,
    installed: bool = False,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``chtxn ARGS`` in the repository root and return what it did (stdout and stderr as text).

    By default it runs this checkout's CLI as ``python -m cli``, the ``main`` the installed script
    calls (an installed script may belong to another checkout); ``installed=True`` runs the
    ``chtxn`` script beside this interpreter instead, as an operator does. The command's
    environment is this process's, without its ``CHTXN_*`` variables when ``inherit_chtxn_vars``
    is false, updated with ``env``. It is killed after ``timeout_s`` (None: never). With ``check``,
    a non-zero exit fails the test, showing the output.
    """
    argv = [str(Path(sys.executable).with_name("chtxn"))] if installed else [sys.executable, "-m", "cli"]
    environ = {k: v for k, v in os.environ.items() if inherit_chtxn_vars or not k.startswith("CHTXN_")}
    result = subprocess.run(
        [*argv, *args], cwd=REPO, capture_output=True, text=True, env={**environ, **(env or {})}, timeout=timeout_s
    )
    if check and result.returncode != 0:
        raise AssertionError(f"chtxn {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def gone(pid: int) -> bool:
    """No live process has ``pid`` (one that exited and waits to be reaped counts as gone); ps agrees."""
    stat = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return start_token(pid) is None and (stat == "" or stat.startswith("Z"))


def last_txn(ledger):
    """The newest txn of ``ledger`` (a ``LedgerHistory``) that is not an operator's commit (a
    reset, a pause or a resume: ``protocol.naming.is_control_txn``)."""
    return next(s for s in ledger.history(limit=10) if not naming.is_control_txn(s.txn))


def crash_a_coordinator_at(config_path: Path, point: str, timeout_s: float) -> None:
    """Run ``chtxn coordinator`` (id ``doomed``) with failpoint ``point`` armed to crash once, and
    return once it has SIGKILLed itself there (failing the test with its output otherwise)."""
    doomed = subprocess.Popen(
        [sys.executable, "-m", "cli", "coordinator", "--config", str(config_path)],
        env={
            **os.environ,
            "CHTXN_FAILPOINTS": f"{point}=crash*1",
            "PYTHONPATH": str(REPO),
            "CHTXN_COORDINATOR_ID": "doomed",
        },
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert doomed.wait(timeout_s) == -signal.SIGKILL, doomed.stdout.read() if doomed.stdout else ""
