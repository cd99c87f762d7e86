"""Child processes that never outlive their owner: process groups, a watchdog, identity checks.

A :class:`ManagedProcess` runs a command in its own session (so its process group id is its pid,
terminal signals do not reach it, and stopping it stops everything it spawned). Two ownership
modes:

- **attached** (default): a small watchdog process (``python -m procs``, see
  :func:`start_watchdog`) watches the owner; when the owner dies, however it dies (SIGKILL
  included), the watchdog terminates the child's group (SIGTERM, then SIGKILL after the grace
  period). Used by the embedded stack in tests and ``make demo``, and by ``chtxn participant``
  for its spark-submit.
- **detached**: no watchdog; the child outlives the process that started it and is stopped later by
  pid (``chtxn embedded down``). :func:`start_token` identifies a process by pid *and* start time,
  so a recycled pid is never mistaken for ours.

Only the standard library is imported here, so the watchdog starts fast; any package may use it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

#: How often the watchdog and the stop loops look again.
_POLL_S = 0.1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (another process may still take it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when nothing listens on ``host:port`` and a server can bind it right now. Connections of
    a server that stopped (TIME_WAIT) do not count: servers bind with ``SO_REUSEADDR``, as Tansu,
    ZooKeeper and the ClickHouse endpoint do, so a stack brought down and up again keeps its ports."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def start_token(pid: int) -> str | None:
    """An identity for the live process ``pid``: its start time. None when no such live process.

    Zombies (exited, not yet reaped) count as gone. Linux reads ``/proc``; elsewhere ``ps``.
    """
    if Path("/proc/self/stat").exists():
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
        fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
        state, started = fields[0], fields[19]
        return None if state in ("Z", "X") else f"linux:{started}"
    result = subprocess.run(["ps", "-o", "stat=,lstart=", "-p", str(pid)], capture_output=True, text=True, check=False)
    line = result.stdout.strip()
    if result.returncode != 0 or not line or line.startswith("Z"):
        return None
    return "ps:" + line.split(None, 1)[1]


def is_running(pid: int, token: str | None) -> bool:
    """True when ``pid`` is alive and is the same process as when ``token`` was taken."""
    current = start_token(pid)
    return current is not None and (token is None or current == token)


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid``; nothing when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pid: int, token: str | None, grace_s: float = 5.0) -> bool:
    """Stop the process group led by ``pid`` (SIGTERM, then SIGKILL after ``grace_s``).

    Does nothing when ``pid`` no longer runs or is another process than ``token`` names: a
    recycled pid is never signalled. Returns True when something was stopped. For a process that
    is not our child this returns once it is gone (reparented processes are reaped by init).
    """
    if not is_running(pid, token):
        return False
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not is_running(pid, token):
            break
        time.sleep(_POLL_S)
    signal_group(pid, signal.SIGKILL)  # whatever is left of the group, leader gone or not
    deadline = time.monotonic() + grace_s
    while is_running(pid, token) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    return True


class ManagedProcess:
    """One command in its own process group, stopped on :meth:`stop` or when its owner dies.

    ``log_path`` receives stdout and stderr (appended); ``env`` None means ours. Constructing does
    not start anything.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        detached: bool = False,
        grace_s: float = 5.0,
        cwd: str | None = None,
    ) -> None:
        self.name = name
        self.cwd = cwd
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.detached = detached
        self.grace_s = grace_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self.token: str | None = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._proc.pid

    def start(self) -> None:
        """Spawn the command; in attached mode also its watchdog. Returns at once."""
        if self._proc is not None:
            raise RuntimeError(f"{self.name} is already started (pid {self._proc.pid})")
        out: int | IO[bytes] = subprocess.DEVNULL
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")  # noqa: SIM115 -- the child keeps its own copy
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):  # a log file, not DEVNULL
                out.close()
        self.token = start_token(self._proc.pid)
        if not self.detached:
            self._watchdog = start_watchdog(self._proc.pid, self.grace_s)

    def poll(self) -> int | None:
        """The exit code once the command has exited, else None."""
        return None if self._proc is None else self._proc.poll()

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        """The last ``lines`` lines of the log, for error messages."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        """Stop the command and its whole group (SIGTERM, SIGKILL after the grace), then the watchdog.

        Idempotent. When this returns, no process of the group is left running.
        """
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                signal_group(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(self.grace_s)
                except subprocess.TimeoutExpired:
                    pass
            signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group, leader gone or not
            proc.wait()
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()


def start_watchdog(child: int, grace_s: float) -> subprocess.Popen[bytes]:
    """Start a watchdog that stops the process group of ``child`` when this process dies.

    ``child`` should lead its own process group (``start_new_session=True``). The watchdog is our
    child in a session of its own (terminal signals do not reach it); it exits by itself once
    ``child`` is gone. Kill it to stop watching.
    """
    return subprocess.Popen(
        [sys.executable, "-m", "procs", str(os.getpid()), str(child), str(grace_s)],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=_project_root(),
    )


def _project_root() -> str:
    """The directory holding the ``procs`` package, so ``-m procs`` always resolves."""
    return str(Path(__file__).resolve().parent.parent)


def watchdog(owner: int, child: int, grace_s: float) -> None:
    """Kill the group of ``child`` as soon as ``owner`` is gone; return when ``child`` is gone.

    The owner is our parent: when it dies we are reparented, so ``getppid()`` changes. Checking it
    first also covers an owner that died before this watchdog started.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    token = start_token(child)
    while is_running(child, token):
        if os.getppid() != owner:
            signal_group(child, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while is_running(child, token) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
            signal_group(child, signal.SIGKILL)
            return
        time.sleep(_POLL_S)
