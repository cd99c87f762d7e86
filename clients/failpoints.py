"""Failpoints: named places in the commit path where a test makes a process crash, fail or stall.

Every point is listed in ``POINTS``; ``hit(name)`` anywhere else is a bug (``KeyError``). With
nothing armed, ``hit`` is one dictionary truth test: free enough for the hot path.

Arming:

- from the environment, for processes a test starts (the CLI and the Spark job call
  ``arm_from_env``): ``CHTXN_FAILPOINTS="leader.before-commit=crash;stage.after-insert@t1=stall(3)"``.
  Each item is ``<point>[@<who>]=<action>``; ``who`` limits the point to the process part whose
  id is ``who`` (a coordinator id, a participant id).
- in-process, for tests that run leaders or participants in threads: ``arm(point, action, who=...)``
  and ``disarm()``; ``pause`` holds the caller until ``release(point)``.

Actions: ``crash`` (SIGKILL of this process: no clean-up, like a power cut), ``raise``
(``FailpointError``), ``stall(S)`` (sleep S seconds), ``pause`` (in-process only), and any of them
followed by ``*N`` to fire only the first N times (``crash*1``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.errors import ChtxnError

log = logging.getLogger(__name__)

ENV = "CHTXN_FAILPOINTS"

#: Every failpoint, with the moment it stands for.
POINTS: dict[str, str] = {
    "leader.before-take-over": "a replica won its epoch; before it reads the ledger head",
    "leader.after-take-over": "a new leader sealed its first slot and cleaned up; before its first START",
    "leader.before-seal": "a new leader read the head and is about to seal slot head+1",
    "leader.before-count": "the WRITE-STATUS set of a txn is complete; before step 5 counts the stage table",
    "leader.before-commit": "step 5 passed; before the COMMITTED row is claimed (the commit point)",
    "keeper.after-key-insert": "keeper commit point: a claim's key insert has answered (taken or refused); before the "
    "claimer acts on the answer. `raise` loses the answer, as a connection dropped after Keeper took the key does",
    "leader.after-keeper-claim": "keeper commit point: a txn's commit key is ours; before its COMMITTED row goes into the ledger",
    "leader.stepping-down": "the leader decided to step down (its lease still beats); before it drops what it staged "
    "and stops heartbeating",
    "leader.after-commit": "the COMMITTED row is ours; before ACK-COMMIT goes out",
    "leader.before-publish": "ACK-COMMIT sent; before the stage table is moved into the target",
    "leader.mid-publish": "some partitions of the stage table are moved, not all",
    "leader.between-table-publishes": "a txn across several tables: one table's stage table is published, the next is not",
    "leader.between-shard-publishes": "a txn on a sharded ClickHouse: one shard's stage tables are published, the next shard's are not",
    "leader.before-dead-letters": "the rows are in the target; before the txn's dead letters are published",
    "leader.before-published-row": "the rows are in the target; before the PUBLISHED row",
    "dead-letters.before-produce": "the dead-letter publisher read the letters of the committed slots it owes; "
    "before their Kafka transaction begins",
    "stage.mid-drop": "a published txn's tables are being dropped: the first is gone, the others are not",
    "participant.before-write-status": "a partition's chunks are staged; before its WRITE-STATUS is sent",
    "control.hide-record": "a control-topic record reaches a reader (who: <reader>/<kind>); `raise` hides it, as the "
    "embedded broker can, and the reader must read it again",
    "stage.before-insert": "a chunk is about to be inserted into the stage table",
    "stage.after-insert": "a chunk is in the stage table; before the participant learns it",
    "reset.before-claim": "an offset reset read the head, the pause and the log; before it claims the next commit slot",
    "pause.before-claim": "chtxn pause / resume read the ledger head; before its marker claims the next commit slot",
    "switch.before-claim": "a commit-point switch read the ledger head; before its marker claims the next commit slot",
    "replay.after-intent": "dlq replay: a batch's intent is committed to the replay log; before its records are produced",
    "replay.after-flush": "dlq replay: a batch's records are delivered in its open Kafka transaction; before its log records",
    "replay.before-commit": "dlq replay: a batch's records and log records are produced; before the Kafka transaction commits",
    "replay.before-settle": "dlq replay: records of a batch in doubt were found in their topics; before their log records commit",
    "switch.before-record": "a commit-point switch's marker won its slot; before the COMMIT_POINT row is written",
}


class FailpointError(ChtxnError):
    """Raised by a failpoint armed with ``raise``."""


@dataclass
class _Armed:
    action: str  # crash | raise | stall | pause
    seconds: float = 0.0
    who: str = ""
    times: int = -1  # fires left; -1: always
    released: threading.Event = field(default_factory=threading.Event)
    fired: int = 0
    reached: threading.Event = field(default_factory=threading.Event)


_armed: dict[str, list[_Armed]] = {}
_lock = threading.Lock()
_SPEC = re.compile(r"^(crash|raise|pause|stall\((?P<s>[0-9.]+)\))(\*(?P<n>\d+))?$")


def hit(name: str, who: str = "") -> None:
    """The process passes failpoint ``name`` (as part ``who``); does nothing unless armed."""
    if not _armed:
        return
    if name not in POINTS:
        raise KeyError(f"unknown failpoint {name!r}: add it to clients.failpoints.POINTS")
    with _lock:
        armed = next((a for a in _armed.get(name, ()) if (not a.who or a.who == who) and a.times != 0), None)
        if armed is None:
            return
        if armed.times > 0:
            armed.times -= 1
        armed.fired += 1
    armed.reached.set()
    log.warning("failpoint %s fires: %s", name, armed.action, extra={"who": who})
    if armed.action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    elif armed.action == "raise":
        raise FailpointError(f"failpoint {name} raised")
    elif armed.action == "stall":
        time.sleep(armed.seconds)
    elif armed.action == "pause":
        armed.released.wait()


def arm(name: str, action: str, *, who: str = "") -> _Armed:
    """Arm ``name`` with ``action`` (see the module docstring); returns a handle whose
    ``reached`` event is set when the point first fires."""
    if name not in POINTS:
        raise KeyError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")
    match = _SPEC.match(action.strip())
    if not match:
        raise ValueError(f"failpoint {name}: cannot read action {action!r} (crash, raise, pause, stall(S), with *N)")
    kind = match.group(1).split("(")[0]
    armed = _Armed(kind, float(match.group("s") or 0), who, int(match.group("n")) if match.group("n") else -1)
    with _lock:
        _armed.setdefault(name, []).append(armed)
    return armed


def release(name: str) -> None:
    """Let every caller paused at ``name`` go on, and disarm it."""
    with _lock:
        armed = _armed.pop(name, [])
    for a in armed:
        a.released.set()


def disarm() -> None:
    """Disarm every point and release every paused caller."""
    for name in list(_armed):
        release(name)


_from_env: set[str] = set()


def arm_from_env(environ: Mapping[str, str] | None = None) -> list[str]:
    """Arm what ``CHTXN_FAILPOINTS`` names (each item once per process, however often this is
    called); returns the items armed now."""
    spec = (environ if environ is not None else os.environ).get(ENV, "").strip()
    items = [item.strip() for item in spec.split(";") if item.strip() and item.strip() not in _from_env]
    _from_env.update(items)
    for item in items:
        point, _, action = item.partition("=")
        name, _, who = point.strip().partition("@")
        arm(name, action, who=who)
    return items
