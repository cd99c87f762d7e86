"""The fault schedule of a soak, drawn up front from the seed. Pure: no I/O, no clock.

A schedule is a sequence of faults, each with its kind, its parameters, how long it lasts
(``hold_s``) and the quiet time before it (``quiet_s``, counted from the moment the pipeline has
recovered from the previous fault). Kinds come in rounds: each round is a shuffle of every kind,
so any ``len(KINDS)`` consecutive rounds-worth of faults covers each kind once.

Guarantees:

- ``draw_schedule(seed, d)`` depends on ``seed`` and ``d`` only; the schedule for a longer
  duration starts with the schedule for a shorter one (same seed), so a failing run's faults are
  the prefix of any replay.
- Only the *order and parameters* are fixed. When each fault happens depends on how fast the
  pipeline recovers; faults that would start after the soak's duration are not injected (the
  report lists them as not reached).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from clients.failpoints import POINTS

#: Every fault the soak injects, in a fixed order (the shuffles below depend on it).
KINDS: tuple[str, ...] = (
    "leader-kill",  # SIGKILL the leader coordinator, restart it after hold_s
    "leader-stall",  # SIGSTOP the leader for hold_s (longer than the 2 s lease), then SIGCONT
    "standby-kill",  # SIGKILL the standby coordinator, restart it after hold_s
    "worker-kill",  # SIGKILL one PySpark Python worker (Spark retries the task)
    "participant-kill",  # SIGKILL the whole participant job, restart it after hold_s
    "clickhouse-cut",  # reset every ClickHouse connection for hold_s
    "clickhouse-slow",  # hold every chunk of ClickHouse traffic delay_s, for hold_s
    "failpoint",  # a leader.* failpoint armed in the next leader (crash or stall)
    "bad-records",  # a burst of malformed records and records that are not one row
    "alter-add-column",  # ALTER TABLE target ADD COLUMN ... DEFAULT ...
    "alter-twice",  # two ALTERs of the target in a row (ADD, then ADD or DROP), gap_s apart
)
#: Faults only a soak with ``ledger.commit_point = "keeper"`` injects, after ``KINDS`` in each round.
KEEPER_KINDS: tuple[str, ...] = (
    "keeper-restart",  # stop the ZooKeeper process for hold_s (every session is lost), then start it again
)

#: Changes an operator (or the world around the pipeline) makes, in a soak with ``changes``
#: (``tests.soak.changes``): each ends with the operator's documented answer to it.
CHANGE_KINDS: tuple[str, ...] = (
    "topic-recreate",  # the source topic deleted and created again; chtxn pause, reset --to-earliest, resume
    "route-move",  # the topic's table changed (events <-> events_b); coordinators and job restarted one by one
    "route-remove",  # the topic's route removed for hold_s (rolling restart), then put back the same way
    "reset-race",  # chtxn pause, reset (rewind) and resume, raced against each other and the leader's commits
    "commit-point-switch",  # a rolling switch token <-> keeper: refused beside the old mode, then pause, switch, resume
    "dlq-expire",  # the dead-letter topic's records gone (retention): deleted and created again, empty
)
#: How a ``reset-race`` interleaves the operator's commands.
RESET_RACES: tuple[str, ...] = ("in-order", "resume-beside-reset", "reset-at-once")

#: The failpoints a soak arms: the leader's commit path.
KEEPER_POINTS: tuple[str, ...] = ("leader.after-keeper-claim",)
LEADER_POINTS: tuple[str, ...] = tuple(sorted(p for p in POINTS if p.startswith("leader.") and p not in KEEPER_POINTS))

#: Records that are not exactly one row; each must go to the dead-letter topic.
NOT_ONE_ROW_SHAPES: tuple[str, ...] = ("two-objects", "two-lines", "empty", "blank")

#: Column types for ``alter-add-column``, each with a default.
ALTER_TYPES: tuple[str, ...] = (
    "String DEFAULT 'soak'",
    "UInt32 DEFAULT 7",
    "Float64 DEFAULT 0.5",
    "LowCardinality(String) DEFAULT 'x'",
)

#: The shortest a fault cycle can take (quiet time, and a recovery of at least a commit interval).
MIN_CYCLE_S = 2.0


@dataclass(frozen=True)
class FaultPlan:
    index: int
    kind: str
    quiet_s: float  # after the previous fault recovered, wait this long before injecting
    hold_s: float  # how long the fault lasts; 0 for an instant fault
    params: dict[str, Any] = field(default_factory=dict)

    def params_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items() if k != "pick")

    def describe(self) -> str:
        hold = f" {self.hold_s:.1f}s" if self.hold_s else ""
        extra = self.params_text()
        return f"#{self.index} {self.kind}{hold}{' ' + extra if extra else ''}"

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "quiet_s": self.quiet_s,
            "hold_s": self.hold_s,
            "params": self.params,
        }


def draw_schedule(
    seed: int, duration_s: float, *, keeper: bool = False, changes: bool = False, only: tuple[str, ...] = ()
) -> list[FaultPlan]:
    """Enough faults to fill ``duration_s`` however fast the pipeline recovers; with ``keeper``, the
    faults of the Keeper commit point too (``KEEPER_KINDS``, ``KEEPER_POINTS``); with ``changes``,
    the operator's changes (``CHANGE_KINDS``); with ``only``, those kinds alone (to replay one)."""
    rng = random.Random(seed)
    kinds = KINDS + (KEEPER_KINDS if keeper else ()) + (CHANGE_KINDS if changes else ())
    if only:
        kinds = tuple(k for k in kinds if k in only)
    points = LEADER_POINTS + KEEPER_POINTS if keeper else LEADER_POINTS
    count = max(1, math.ceil(duration_s / MIN_CYCLE_S))
    plans: list[FaultPlan] = []
    while len(plans) < count:
        round_kinds = list(kinds)
        rng.shuffle(round_kinds)
        for kind in round_kinds:
            if len(plans) == count:
                break
            plans.append(_draw(rng, len(plans), kind, points))
    return plans


def _draw(rng: random.Random, index: int, kind: str, points: tuple[str, ...]) -> FaultPlan:
    quiet = round(rng.uniform(1.0, 4.0), 2)
    hold = 0.0
    params: dict[str, Any] = {}
    if kind in ("leader-kill", "standby-kill", "participant-kill"):
        hold = rng.uniform(0.5, 3.0)  # pause before the restart
    elif kind == "leader-stall":
        hold = rng.uniform(3.0, 8.0)
    elif kind == "worker-kill":
        params["pick"] = rng.randrange(1 << 16)  # which of the running workers, modulo their number
    elif kind == "clickhouse-cut":
        hold = rng.uniform(2.0, 8.0)
    elif kind == "clickhouse-slow":
        hold = rng.uniform(5.0, 12.0)
        params["delay_s"] = round(rng.uniform(0.3, 1.5), 2)
    elif kind == "failpoint":
        params["point"] = rng.choice(points)
        if rng.random() < 0.7:
            params["action"] = "crash*1"
        else:
            hold = round(rng.uniform(1.0, 6.0), 1)
            params["action"] = f"stall({hold})*1"
    elif kind == "keeper-restart":
        hold = rng.uniform(2.0, 10.0)
    elif kind == "topic-recreate":
        hold = rng.uniform(0.5, 5.0)  # the topic is gone this long
    elif kind == "route-remove":
        hold = rng.uniform(3.0, 15.0)
    elif kind == "reset-race":
        params["race"] = rng.choice(RESET_RACES)
        params["rewind"] = rng.randint(20, 600)  # records per partition read again
        params["gap_s"] = round(rng.uniform(0.0, 2.0), 2)  # between pause and reset
    elif kind in ("route-move", "commit-point-switch", "dlq-expire"):
        pass
    elif kind == "bad-records":
        params["records"] = rng.randint(50, 300)
        params["bad_every"] = rng.randint(3, 20)
        params["not_one_row"] = [rng.choice(NOT_ONE_ROW_SHAPES) for _ in range(rng.randint(1, 5))]
    elif kind == "alter-add-column":
        params["column"] = f"soak_c{index}"
        params["type"] = rng.choice(ALTER_TYPES)
    elif kind == "alter-twice":
        params["column"] = f"soak_c{index}"
        params["type"] = rng.choice(ALTER_TYPES)
        params["then"] = rng.choice(("add", "drop"))
        params["gap_s"] = round(rng.uniform(0.0, 1.5), 2)
    else:  # pragma: no cover - KINDS and this function change together
        raise ValueError(f"unknown fault kind {kind!r}")
    return FaultPlan(index=index, kind=kind, quiet_s=quiet, hold_s=round(hold, 2), params=params)
