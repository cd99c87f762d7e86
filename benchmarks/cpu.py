"""CPU seconds by component, from ``/proc`` (Linux): where a run's CPU time goes.

``snapshot()`` reads user + system time of every live process and files it under a component
by its command line; the difference of two snapshots is the CPU each component used between
them. Processes that start and exit between two snapshots are missed (the benchmark's own
workers report their CPU themselves). Only the benchmark's own process tree is filed under a
component: ``other`` is everything else on the machine (another engineer's embedded stack or
Spark job included), the load the benchmark competed with.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")

#: Component -> substrings of the command line that identify it (first match wins).
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("paced producer", ("benchmarks.producer",)),
    ("clickhouse", ("embedded.clickhouse_server",)),
    ("broker", ("tansu",)),
    ("coordinator", ("cli coordinator",)),
    ("spark jvm", ("org.apache.spark.deploy.SparkSubmit",)),
    ("participant python", ("pyspark.daemon", "pyspark.worker", "participant/job.py --config")),
    ("plain loop", ("multiprocessing.spawn",)),
    ("participant supervisor", ("cli participant", "-m procs")),  # chtxn participant and its watchdog
    ("benchmark driver", ("benchmarks.",)),
)

#: The component of a process that has exited and is not yet reaped: its command line is gone.
EXITED = "(exited)"


def snapshot(root: int | None = None) -> dict[int, tuple[str, float]]:
    """pid -> (component, CPU seconds so far) for every process readable now.

    Processes outside the tree of ``root`` (default: this process) are ``other``.
    """
    found: dict[int, tuple[str, float]] = {}
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        seconds = (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        found[pid] = (EXITED if fields[0] == "Z" or not cmdline else _component(cmdline), seconds)
    ours = _tree(parents, os.getpid() if root is None else root)
    return {pid: (component if pid in ours else "other", seconds) for pid, (component, seconds) in found.items()}


def _tree(parents: dict[int, int], root: int) -> set[int]:
    """``root`` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, ()))
    return tree


def used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per component between two snapshots (processes alive at ``after``).

    A process that has exited but is not yet reaped (a zombie, with no command line left) is still
    the process of ``before``: it keeps that component and counts only its CPU since then.
    """
    totals: dict[str, float] = {}
    for pid, (component, seconds) in after.items():
        start = before.get(pid)
        if component == EXITED:
            component = start[0] if start else "other"
        delta = seconds - (start[1] if start and start[0] == component else 0.0)
        if delta > 0:
            totals[component] = totals.get(component, 0.0) + delta
    return totals


def _component(cmdline: str) -> str:
    for name, needles in COMPONENTS:
        if any(n in cmdline for n in needles):
            return name
    return "other"
