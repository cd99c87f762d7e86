"""What a soak found: recovery per fault kind, exactly-once, stuck spells; as a table and as JSON.

Definitions (all times are unix seconds; the ledger's ``event_time`` is stamped by ClickHouse,
on this machine for the embedded stack):

- **recovery** of a fault: from the fault's end (see ``tests.soak.faults``) until the
  ``event_time`` of the first COMMITTED row of the commit chain after which the committed end
  offset of every partition is at or past the end the broker had acknowledged to the producers
  when the fault ended; that is, until everything produced before the fault ended is committed
  (or dead-lettered: dead-lettered offsets are inside committed ranges). Negative values (a commit
  already covering it when the delivery reports were read) count as 0. ``None``: never.
- **stuck**: a spell of more than ``stuck_after_s`` without any new commit slot, counting only the
  time outside fault windows; also a fault the pipeline did not recover from within the
  recovery timeout, a pipeline that did not become whole again, and a drain that did not finish.
- **losses** per partition: the oracle's expected rows minus the distinct offsets in the target
  (when positive), plus acknowledged offsets never committed by the end of the drain;
  **duplicates**: the oracle's rows minus distinct offsets.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from protocol.ledger.rows import LedgerRow
from tests.soak.faults import FaultRecord
from tests.soak.schedule import CHANGE_KINDS, KEEPER_KINDS, KINDS, FaultPlan


def recovery_times(records: list[FaultRecord], commits: list[LedgerRow], topic: str) -> None:
    """Fill ``recovery_s`` of each record from the commit chain (slot order)."""
    timeline: list[tuple[float, dict[int, int]]] = []
    head: dict[int, int] = {}
    for commit in commits:
        for r in commit.ranges:
            if r.topic == topic:
                head[r.partition] = r.end
        timeline.append((commit.event_time, dict(head)))
    for record in records:
        target = {p: end for p, end in record.acked_at_end.items() if end > 0}
        at = next((t for t, h in timeline if all(h.get(p, 0) >= end for p, end in target.items())), None)
        record.recovery_s = None if at is None else round(max(0.0, at - record.ended), 3)


def stuck_spells(
    commits: list[LedgerRow], faults: list[FaultRecord], start: float, end: float, stuck_after_s: float
) -> list[str]:
    """Spells without a new commit longer than ``stuck_after_s`` outside fault windows."""
    times = sorted(c.event_time for c in commits if start <= c.event_time <= end)
    windows = [(f.started, f.ended) for f in faults]
    spells = []
    for a, b in zip([start, *times], [*times, end]):
        overlap = sum(max(0.0, min(b, we) - max(a, ws)) for ws, we in windows)
        quiet = (b - a) - overlap
        if quiet > stuck_after_s:
            spells.append(
                f"no commit for {b - a:.1f}s ({quiet:.1f}s outside faults) from +{a - start:.1f}s to +{b - start:.1f}s"
            )
    return spells


@dataclass
class SoakResult:
    seed: int
    duration_s: float
    git_commit: str
    pipeline: str
    logs: str
    commit_point: str = "token"  # ledger.commit_point of the soaked pipeline (at its start)
    changes: bool = False  # the operator's changes among the faults (the oracle counts ids)
    started_at: float = 0.0  # unix time the fault phase began (after warm-up)
    schedule: list[FaultPlan] = field(default_factory=list)
    faults: list[FaultRecord] = field(default_factory=list)
    next_fault: FaultPlan | None = None  # the first planned fault that would have ended after the duration
    produced: dict[str, int] = field(default_factory=dict)
    drain: dict[str, Any] = field(default_factory=dict)
    oracle: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] = field(default_factory=dict)
    routing: dict[str, Any] = field(default_factory=dict)
    txns: dict[str, Any] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)
    exits: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        if "duplicates" in self.oracle:  # the id oracle
            return int(self.oracle["duplicates"])
        return sum(p["duplicates"] for p in self.oracle.get("partitions", []))

    @property
    def losses(self) -> int:
        if "losses" in self.oracle:
            return int(self.oracle["losses"]) + sum(self.drain.get("uncommitted", {}).values())
        unseen = sum(max(0, p["expected_rows"] - p["distinct_offsets"]) for p in self.oracle.get("partitions", []))
        return unseen + sum(self.drain.get("uncommitted", {}).values())

    def failures(self) -> list[str]:
        """Why the soak failed; empty when it passed."""
        failed = list(self.errors)
        if not self.oracle.get("ok"):
            failed.append("the exactly-once oracle failed: " + "; ".join(self.oracle.get("anomalies", [])))
        if not self.verify.get("ok"):
            failed.append("chtxn verify --deep failed: " + "; ".join(self.verify.get("anomalies", [])))
        if self.routing.get("good_dead_lettered") or self.routing.get("bad_not_dead_lettered"):
            failed.append(f"dead-letter routing: {self.routing}")
        failed += [f"stuck: {s}" for s in self.stuck]
        return failed

    @property
    def ok(self) -> bool:
        return not self.failures()

    def by_kind(self) -> dict[str, dict[str, Any]]:
        rows: dict[str, dict[str, Any]] = {}
        for kind in (
            KINDS + (KEEPER_KINDS if self.commit_point == "keeper" else ()) + (CHANGE_KINDS if self.changes else ())
        ):
            done = [f for f in self.faults if f.plan.kind == kind]
            injected = [f for f in done if f.injected]
            times = [f.recovery_s for f in injected if f.recovery_s is not None]
            rows[kind] = {
                "injected": len(injected),
                "not_injected": len(done) - len(injected),
                "recovery_p50_s": round(statistics.median(times), 2) if times else None,
                "recovery_max_s": round(max(times), 2) if times else None,
                "unrecovered": len(injected) - len(times),
            }
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "failures": self.failures(),
            "seed": self.seed,
            "duration_s": self.duration_s,
            "git_commit": self.git_commit,
            "pipeline": self.pipeline,
            "commit_point": self.commit_point,
            "changes": self.changes,
            "logs": self.logs,
            "started_at": self.started_at,
            "duplicates": self.duplicates,
            "losses": self.losses,
            "by_kind": self.by_kind(),
            "faults": [f.to_json() for f in self.faults],
            "produced": self.produced,
            "drain": self.drain,
            "txns": self.txns,
            "oracle": self.oracle,
            "verify": self.verify,
            "routing": self.routing,
            "stuck": self.stuck,
            "exits": self.exits,
            "next_fault": self.next_fault.to_json() if self.next_fault else None,
        }

    def write(self, directory: Path) -> Path:
        from datetime import datetime, timezone

        stamp = datetime.fromtimestamp(self.started_at or 0, tz=timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        directory.mkdir(parents=True, exist_ok=True)
        mode = ("" if self.commit_point == "token" else f"-{self.commit_point}") + ("-changes" if self.changes else "")
        path = directory / f"{stamp}-seed{self.seed}{mode}.json"
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")
        return path

    def print(self, console: Console | None = None) -> None:
        console = console or Console(width=200)
        faults = Table(title=f"soak seed {self.seed}, {self.duration_s:g}s, {self.git_commit[:12]}: faults")
        for column in ("#", "kind", "params", "target", "hold s", "injected", "recovery s", "detail"):
            faults.add_column(column, justify="right" if column in ("#", "hold s", "recovery s") else "left")
        for f in self.faults:
            faults.add_row(
                str(f.plan.index),
                f.plan.kind,
                f.plan.params_text()[:60],
                f.target,
                f"{f.plan.hold_s:.1f}",
                "yes" if f.injected else "[yellow]no[/]",
                "-" if f.recovery_s is None else f"{f.recovery_s:.2f}",
                f.detail[:90],
            )
        console.print(faults)
        kinds = Table(title="per fault kind (recovery: fault end -> everything acknowledged before it committed)")
        for column in ("kind", "injected", "not injected", "recovery p50 s", "recovery max s", "unrecovered"):
            kinds.add_column(column, justify="left" if column == "kind" else "right")
        for kind, row in self.by_kind().items():
            kinds.add_row(
                kind,
                str(row["injected"]),
                str(row["not_injected"]),
                _num(row["recovery_p50_s"]),
                _num(row["recovery_max_s"]),
                str(row["unrecovered"]),
            )
        console.print(kinds)
        summary = Table(title="outcome", show_header=False)
        summary.add_column("what")
        summary.add_column("value")
        t = self.txns
        for what, value in (
            ("produced", ", ".join(f"{k} {v}" for k, v in self.produced.items())),
            (
                "txns",
                f"committed {t.get('committed', 0)} ({t.get('with_rows', 0)} with rows, {t.get('seals', 0)} seals), "
                f"aborted {t.get('aborted', 0)}",
            ),
            ("rows in target", str(self.oracle.get("rows_in_target", "?"))),
            ("dead letters", str(self.routing.get("dead_lettered", "?"))),
            ("duplicates", _flag(self.duplicates)),
            ("losses", _flag(self.losses)),
            (
                "drain",
                f"{self.drain.get('seconds', '?')}s, uncommitted {sum(self.drain.get('uncommitted', {}).values())}",
            ),
            ("oracle", "[green]ok[/]" if self.oracle.get("ok") else "[red]FAILED[/]"),
            ("verify --deep", "[green]ok[/]" if self.verify.get("ok") else "[red]FAILED[/]"),
            ("stuck", _flag(len(self.stuck))),
            ("process exits", ", ".join(f"{e['process']}={e['returncode']}" for e in self.exits) or "none"),
            ("next fault (not reached)", self.next_fault.describe() if self.next_fault else "-"),
        ):
            summary.add_row(what, value)
        console.print(summary)
        for failure in self.failures():
            console.print(f"[red]FAIL:[/] {failure}", soft_wrap=True)
        console.print("[green]soak passed[/]" if self.ok else "[red]soak FAILED[/]")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _flag(n: int) -> str:
    return "[green]0[/]" if n == 0 else f"[red]{n}[/]"
