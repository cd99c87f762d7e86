"""Carrying out one planned fault on a running pipeline, and recording when it began and ended.

A fault's **end** is the moment the harness finished undoing it: the killed process restarted
(for the participant job: its Python task workers running again), the stalled leader continued,
the proxy restored. Instant faults (a worker killed, a burst produced, a column added) end when
they begin. Recovery is measured from that end (see ``tests.soak.report``).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from coordinator.ledger.store import LedgerStore
from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import wait_until
from tests.pipelines import Pipeline
from tests.soak.changes import ChangeFaults
from tests.soak.cluster import COORDINATORS, Cluster
from tests.soak.schedule import FaultPlan
from tests.soak.traffic import Traffic

#: How long a pipeline may take to be whole again (both replicas, a leader, task workers) before a fault.
READY_TIMEOUT_S = 180.0
#: How long an armed coordinator may take to lead, and then to reach its failpoint.
FAILPOINT_TIMEOUT_S = 30.0
#: How long a restarted Spark job may take to run its task workers.
JOB_START_TIMEOUT_S = 240.0


class NotReady(AssertionError):
    """The pipeline did not become whole again in time: the soak stops injecting faults."""


@dataclass
class FaultRecord:
    plan: FaultPlan
    started: float = 0.0  # unix time
    ended: float = 0.0
    target: str = ""  # the process or connection the fault hit
    injected: bool = True  # False: it could not be carried out (nothing to hit, failpoint not reached)
    detail: str = ""
    acked_at_end: dict[int, int] = field(default_factory=dict)  # per partition, acknowledged end at `ended`
    recovered_at: float | None = None  # unix time the harness saw the pipeline recovered (live check)
    recovery_s: float | None = None  # from the ledger (report)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.to_json(),
            "started": self.started,
            "ended": self.ended,
            "target": self.target,
            "injected": self.injected,
            "detail": self.detail,
            "acked_at_end": self.acked_at_end,
            "recovered_at": self.recovered_at,
            "recovery_s": self.recovery_s,
        }


class Injector(ChangeFaults):
    def __init__(
        self,
        cluster: Cluster,
        traffic: Traffic,
        proxy: TcpProxy,
        check: Pipeline,
        ledger: LedgerStore,
        stack: Any = None,  # the TestStack, for its keeper
    ) -> None:
        self.stack = stack
        self.cluster = cluster
        self.traffic = traffic
        self.proxy = proxy
        self.check = check  # the pipeline read directly, never through the proxy
        self.ledger = ledger

    # ---- the pipeline's state ------------------------------------------------------------------

    def leader(self) -> str | None:
        """The coordinator owning the highest epoch, if it is one of ours and alive."""
        owner = self.ledger.epoch_owner(self.ledger.max_epoch())
        return owner if owner in COORDINATORS and self.cluster.alive(owner) else None

    def standby(self, leader: str) -> str:
        return next(c for c in COORDINATORS if c != leader)

    def whole(self) -> bool:
        """Both replicas and the job run, one replica leads, and the job's task workers run."""
        self.cluster.supervise()
        return (
            all(self.cluster.alive(c) for c in COORDINATORS)
            and self.leader() is not None
            and bool(self.cluster.python_workers())
        )

    def wait_whole(self) -> None:
        try:
            wait_until(self.whole, READY_TIMEOUT_S, "both coordinators, a leader and the task workers", interval_s=0.2)
        except AssertionError as exc:
            raise NotReady(str(exc)) from None

    def hold(self, seconds: float) -> None:
        """Keep a fault on for ``seconds`` (a timed window drawn from the schedule, not a
        synchronisation), restarting meanwhile any process that dies unheld."""
        end = time.monotonic() + seconds
        wait_until(
            lambda: self.cluster.supervise() or time.monotonic() >= end,
            seconds + 30,
            "the end of the fault window",
            interval_s=0.1,
        )

    # ---- faults ---------------------------------------------------------------------------------

    def inject(self, plan: FaultPlan) -> FaultRecord:
        record = FaultRecord(plan=plan, started=time.time())
        getattr(self, "_" + plan.kind.replace("-", "_"))(plan, record)
        record.ended = record.ended or time.time()
        record.acked_at_end = self.traffic.acked_ends()
        return record

    def _leader_kill(self, plan: FaultPlan, record: FaultRecord) -> None:
        leader = record.target = self._leader()
        self.cluster.kill(leader)
        self.hold(plan.hold_s)
        self.cluster.start_coordinator(leader)

    def _leader_stall(self, plan: FaultPlan, record: FaultRecord) -> None:
        leader = record.target = self._leader()
        self.cluster.pause(leader)
        self.hold(plan.hold_s)
        self.cluster.resume(leader)

    def _standby_kill(self, plan: FaultPlan, record: FaultRecord) -> None:
        standby = record.target = self.standby(self._leader())
        self.cluster.kill(standby)
        self.hold(plan.hold_s)
        self.cluster.start_coordinator(standby)

    def _worker_kill(self, plan: FaultPlan, record: FaultRecord) -> None:
        workers = self.cluster.python_workers()
        if not workers:
            record.injected, record.detail = False, "no PySpark task worker running"
            return
        pid = workers[plan.params["pick"] % len(workers)]
        record.target = f"worker pid {pid} (of {len(workers)})"
        os.kill(pid, signal.SIGKILL)

    def _participant_kill(self, plan: FaultPlan, record: FaultRecord) -> None:
        record.target = "participant job"
        self.cluster.kill("participant")
        self.hold(plan.hold_s)
        self.cluster.start_participant()
        started = time.monotonic()
        try:
            wait_until(
                lambda: self.cluster.supervise() or self.cluster.python_workers(),
                JOB_START_TIMEOUT_S,
                "the restarted job's task workers",
                interval_s=0.2,
            )
        except AssertionError as exc:
            record.detail = str(exc)
        else:
            record.detail = f"task workers running {time.monotonic() - started:.1f}s after the restart"

    def _clickhouse_cut(self, plan: FaultPlan, record: FaultRecord) -> None:
        record.target = f"proxy {self.proxy.address}"
        refused = self.proxy.refused
        self.proxy.cut()
        self.hold(plan.hold_s)
        self.proxy.restore()
        record.detail = f"{self.proxy.refused - refused} connections refused while cut"

    def _clickhouse_slow(self, plan: FaultPlan, record: FaultRecord) -> None:
        record.target = f"proxy {self.proxy.address}"
        self.proxy.delay(plan.params["delay_s"])
        self.hold(plan.hold_s)
        self.proxy.restore()

    def _failpoint(self, plan: FaultPlan, record: FaultRecord) -> None:
        """Arm the point in the standby (restarted with ``CHTXN_FAILPOINTS``), then kill the leader
        so that the armed replica is the only candidate; restart the killed leader plain once the
        armed one has claimed its epoch. A ``crash`` ends when the crashed replica is restarted
        plain, a ``stall`` when the stall is over."""
        point, action = plan.params["point"], plan.params["action"]
        leader = self._leader()
        armed = record.target = self.standby(leader)
        log = self.cluster.logs / f"{armed}.log"
        self.cluster.kill(armed)
        seen_from = log.stat().st_size if log.exists() else 0
        self.cluster.start_coordinator(armed, failpoints=f"{point}@{armed}={action}")
        self.cluster.held.add(armed)  # it may crash on purpose: the harness restarts it, not supervise()

        def fired() -> bool:
            with open(log, "rb") as f:
                f.seek(seen_from)
                return f"failpoint {point} fires".encode() in f.read()

        def leads_or_fired() -> bool:
            self.cluster.supervise()
            return fired() or not self.cluster.alive(armed) or self.ledger.epoch_owner(self.ledger.max_epoch()) == armed

        self.cluster.kill(leader)
        try:
            wait_until(leads_or_fired, FAILPOINT_TIMEOUT_S, f"{armed} to lead", interval_s=0.1)
        except AssertionError as exc:
            record.detail = f"{exc}; "  # the point is waited for below all the same
        self.cluster.start_coordinator(leader)
        try:
            wait_until(
                lambda: self.cluster.supervise() or fired(),
                FAILPOINT_TIMEOUT_S,
                f"failpoint {point} in {armed}",
                interval_s=0.1,
            )
        except AssertionError:
            record.injected = False
            record.detail += f"{point} not reached within {FAILPOINT_TIMEOUT_S:g}s"
            self.cluster.kill(armed)
            self.cluster.start_coordinator(armed)
            return
        if action.startswith("crash"):
            wait_until(lambda: not self.cluster.alive(armed), 15, f"{armed} to crash at {point}")
            self.cluster.procs[armed].wait(5)
            record.detail += f"{armed} crashed at {point}"
            self.cluster.start_coordinator(armed)
        else:
            self.hold(plan.hold_s)
            self.cluster.held.discard(armed)
            record.detail += f"{armed} stalled at {point}"

    def _keeper_restart(self, plan: FaultPlan, record: FaultRecord) -> None:
        keeper = self.stack.keeper
        record.target = f"zookeeper pid {keeper.pid}"
        keeper.stop()
        try:
            self.hold(plan.hold_s)
        finally:
            self.stack.restart_keeper()
        record.detail = f"restarted as pid {self.stack.keeper.pid}"

    def _bad_records(self, plan: FaultPlan, record: FaultRecord) -> None:
        p = plan.params
        counts = self.traffic.burst(p["records"], p["bad_every"], p["not_one_row"])
        record.target = self.check.topic
        record.detail = ", ".join(f"{k} {v}" for k, v in counts.items())

    def _alter_add_column(self, plan: FaultPlan, record: FaultRecord) -> None:
        self._alter(record, f"ADD COLUMN IF NOT EXISTS `{plan.params['column']}` {plan.params['type']}")

    def _alter_twice(self, plan: FaultPlan, record: FaultRecord) -> None:
        """Two statements of one migration, ``gap_s`` apart: txns committed in between are
        published across both (the stage table is aligned once, then again mid-publish)."""
        column = plan.params["column"]
        self._alter(record, f"ADD COLUMN IF NOT EXISTS `{column}` {plan.params['type']}")
        time.sleep(plan.params["gap_s"])  # the fault itself: how far apart the two ALTERs land
        if plan.params["then"] == "drop":
            self._alter(record, f"DROP COLUMN IF EXISTS `{column}`")
        else:
            self._alter(record, f"ADD COLUMN IF NOT EXISTS `{column}_b` UInt8 DEFAULT 1")
        record.detail = f"then {plan.params['then']} after {plan.params['gap_s']} s"

    def _alter(self, record: FaultRecord, clause: str) -> None:
        ch = self.check.cfg.clickhouse
        table = getattr(self, "table", ch.target_table)  # a route move changes it
        self.check.client().command(f"ALTER TABLE `{ch.database}`.`{table}` {clause}")
        record.target = f"{ch.database}.{table}"

    def _leader(self) -> str:
        leader = self.leader()
        if leader is None:
            raise NotReady("no live leader among the coordinators")
        return leader
