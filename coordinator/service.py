"""The coordinator service: a standby that watches the leader's lease, and leads when it lapses.

Run N replicas; exactly one leads at a time. A standby that hears nothing from a leader for
``coordinator.leader_lease_s`` claims epoch ``max + 1`` in the ledger by compare-and-set
(``protocol.coordinator.leadership``). A leader that loses a commit slot or sees a newer epoch steps down
and becomes a standby again. ClickHouse or Kafka failures never end the service: it backs off
and tries again. What it is doing is told to ``readiness`` (``/ready`` on the metrics port).

A standby logs one "standing by" line naming the leader it waits on (again when another one leads),
and checks its target before it may claim a lease (a wrong ``target_table`` exits without fencing
the running leader). It says it stands by with a STANDBY-HEARTBEAT every ``leader_lease_s / 3``
(``coordinator.lease.StandbyBeat``), and a last one saying ``leaving`` when it is stopped, so that
``chtxn status`` lists it; while it leads, its leader's heartbeat says so instead. While it backs
off after a failure, its STANDBY-HEARTBEATs carry the failure and its cause (Keeper, ClickHouse,
Kafka: ``problem_cause``), so that ``chtxn status`` names why no replica leads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from clients import target_table
from clients.clickhouse import make_client, retries_told, shard_client
from clients.kafka import BrokerUnreachable, KafkaClientFactory
from clients.target_table import check_target
from coordinator.control import ControlChannel
from coordinator.leader import Leader
from coordinator.lease import StandbyBeat
from coordinator.ledger import commit_points
from coordinator.ledger.store import LedgerStore
from coordinator.metered_shard import MeteredShard
from coordinator.metrics import CoordinatorMetrics
from coordinator.readiness import Readiness
from coordinator.stage.sets import StageSet
from coordinator.stage.shards import ShardedStages, Stages, clients_of
from coordinator.stage.tables import StageTables
from protocol import secrets, shards as shard_rules
from protocol.config.parse import PipelineConfig
from protocol.coordinator.leadership import LeaseWatch
from protocol.errors import ChtxnError, ClickHouseError, SetupError

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)
#: ClickHouse's codes for a Keeper (ZooKeeper) that does not answer or is not configured.
KEEPER_CODES = frozenset({999, 225, 244})  # KEEPER_EXCEPTION, NO_ZOOKEEPER, UNEXPECTED_ZOOKEEPER_ERROR
#: How often a standby pings ClickHouse for ``/ready`` (the leader's own work tells it otherwise).
STANDBY_PING_S, PING_TIMEOUT_S = 5.0, 2.0


class CoordinatorService:
    """One replica. ``run(stop)`` returns when ``stop`` is set (after a clean shutdown)."""

    def __init__(
        self,
        cfg: PipelineConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: CoordinatorMetrics | None = None,
        leader_class: type[Leader] = Leader,
    ) -> None:
        self.given = self.cfg = cfg  # self.cfg: as learnt from the server at each start (_run_once)
        self.id = cfg.coordinator_id
        self.clock = clock
        self.metrics = metrics or CoordinatorMetrics.of(cfg)
        self.readiness = Readiness()
        self.epoch = 0  # the epoch this replica leads, 0 as standby
        self.leaderships = 0
        self.leader_class = leader_class  # tests inject faults with a subclass
        self.kafka = KafkaClientFactory(cfg)
        self.seen_epoch = 0  # the highest epoch this replica has seen, for its heartbeats
        self.led = 0  # the epoch this replica led last: what it sent then is no leader heard (``LeaseWatch``)
        self._troubled = StandbyBeat(cfg, self.kafka, coordinator=self.id, clock=clock)  # beats while backing off
        self._problem = ("", "")  # the last failure and its cause, said in every beat until a claim is answered

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                self._run_once(stop)
                failures = 0
            except SetupError as exc:
                if not isinstance(exc, BrokerUnreachable):
                    raise  # the operator must act: missing topic/table, wrong partition count, gap
                self._back_off(stop, failures, exc)
                failures += 1
            except (ChtxnError, OSError) as exc:
                self._back_off(stop, failures, exc)
                failures += 1
        self._troubled.close(self.seen_epoch, leaving=False)
        self.readiness.stopping()

    def _back_off(self, stop: threading.Event, failures: int, exc: Exception) -> None:
        """Wait before trying again, saying why in STANDBY-HEARTBEATs meanwhile."""
        delay = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]
        cause = problem_cause(exc)
        self._problem = (str(exc), cause)
        log.error("coordinator failed; restarting", extra={"error": str(exc), "cause": cause, "retry_in_s": delay})
        self.readiness.failed(str(exc))
        until = self.clock() + delay
        while not stop.is_set() and self.clock() < until:
            self._troubled.beat(self.seen_epoch, problem=str(exc), cause=cause)
            stop.wait(min(0.1, max(0.0, until - self.clock())))

    def _telling(self, beat: StandbyBeat) -> Callable[[ClickHouseError], None]:
        """What a standby does before each wait of a retried ClickHouse operation: it says why in its
        beats from the first retry (``chtxn status`` names the cause), not only once it gives up."""

        def tell(error: ClickHouseError) -> None:
            self._problem = (f"{error} (retrying)", problem_cause(error))
            beat.beat(self.seen_epoch, problem=self._problem[0], cause=self._problem[1])

        return tell

    def _run_once(self, stop: threading.Event) -> None:
        with retries_told(self._telling(self._troubled)):
            # a Distributed target: its local table on the shards of its cluster, as the server says now
            self.cfg = target_table.learnt(self.given)
            self.metrics.cover(self.cfg)
            ledger, stages = clickhouse_stores(self.cfg, metrics=self.metrics)
            ledger.ensure_tables()
            commit_points.ensure(ledger, self.id)  # another commit point on this ledger: stop, naming the switch
            # before any lease: a wrong target must not take (and fence) the running leader's epoch on its way out
            for target in self.cfg.tables:
                for shard, client in clients_of(stages):
                    check_target(client, self.cfg, target, shard=shard)
        control = ControlChannel(
            self.cfg,
            client_id=f"chtxn-coordinator-{self.id}",
            who=self.id,
            on_hole=self.metrics.control_holes.labels(self.cfg.name).inc,
            kafka=self.kafka,
        )
        control.open()
        self.readiness.standby()
        beat = StandbyBeat(self.cfg, self.kafka, coordinator=self.id, clock=self.clock)
        watch = self._watch()
        try:
            ping_at = self.clock() + STANDBY_PING_S
            standing_by = ""  # the leader this standby said it stands by for, once
            while not stop.is_set():
                for message in control.poll(timeout=0.05):
                    watch.observe(message, self.clock())
                if watch.leader and not watch.expired(self.clock()):
                    self._problem = ("", "")  # a leader is heard: what this replica failed at stops nobody
                    if watch.leader != standing_by:
                        standing_by = watch.leader
                        log.warning(
                            "standing by",
                            extra={"leader": watch.leader, "epoch": watch.epoch, "coordinator": self.id},
                        )
                self.seen_epoch = max(self.seen_epoch, watch.epoch, self.led)
                beat.beat(self.seen_epoch, problem=self._problem[0], cause=self._problem[1])
                if self.clock() >= ping_at:
                    ping_at = self.clock() + STANDBY_PING_S
                    self._ping_clickhouse(stages)
                if not watch.expired(self.clock()):
                    continue
                with retries_told(self._telling(beat)):  # not while leading: a leader's beats say so
                    epoch = max(watch.epoch, ledger.max_epoch()) + 1
                    claimed = ledger.claim_epoch(epoch, self.id)
                self._problem = ("", "")  # the commit point answered
                if not claimed:
                    watch.claim_lost(self.clock(), ledger.max_epoch())
                    continue
                self._lead(epoch, control, ledger, stages, stop)
                watch = self._watch()
                standing_by = ""
                self.readiness.standby()
        finally:
            beat.close(max(watch.epoch, self.led), leaving=stop.is_set())
            control.close()

    def _watch(self) -> LeaseWatch:
        """A fresh watch: an existing leader has one lease to show itself; this replica's own messages
        of the epoch it led (read after it stepped down, or after a restart) are not one."""
        return LeaseWatch(lease_s=self.cfg.coordinator.leader_lease_s, now=self.clock(), own=(self.id, self.led))

    def _ping_clickhouse(self, stages: Stages) -> None:
        """A standby's check that it could still take over (``/ready``); a failed ping changes nothing else."""
        if stages.client.ping(timeout=PING_TIMEOUT_S):
            self.readiness.clickhouse("")
        else:
            url = secrets.mask_url(self.cfg.clickhouse.url)
            self.readiness.clickhouse(f"no answer from {url} within {PING_TIMEOUT_S:g} s")

    def _lead(
        self, epoch: int, control: ControlChannel, ledger: LedgerStore, stages: Stages, stop: threading.Event
    ) -> None:
        log.warning("leading", extra={"epoch": epoch, "coordinator": self.id})
        self.epoch = self.led = epoch
        self.leaderships += 1
        self.metrics.leading(epoch)
        try:
            leader = self.leader_class(
                self.cfg,
                epoch=epoch,
                coordinator=self.id,
                control=control,
                ledger=ledger,
                stages=stages,
                metrics=self.metrics,
                clock=self.clock,
                kafka=self.kafka,
            )
            self.readiness.leading(epoch, leader.state)
            liveness = leader.state.liveness
            self.metrics.hear_participants(lambda: liveness.figures(self.clock()))
            outcome = leader.run(stop)
            log.warning("no longer leading", extra={"epoch": epoch, "why": outcome})
            if leader.failure is not None:  # a standby's beats say why it stopped leading (``chtxn status``)
                self._problem = (outcome, problem_cause(leader.failure))
        finally:
            self.epoch = 0
            self.metrics.not_leading()


def problem_cause(exc: BaseException) -> str:
    """What ``exc`` is a failure of (``protocol.messages.PROBLEM_CAUSES``), by its type and ClickHouse code."""
    if isinstance(exc, BrokerUnreachable):
        return "kafka"
    if isinstance(exc, ClickHouseError):
        return "keeper" if exc.code in KEEPER_CODES else "clickhouse"
    return "other"


def clickhouse_stores(cfg: PipelineConfig, *, metrics: CoordinatorMetrics | None = None) -> tuple[LedgerStore, Stages]:
    """The ledger and the stage tables (on every shard of ``clickhouse.shards``, each shard's failed publishes
    counted in ``metrics`` when given), on clients whose queries run at
    ``coordinator.clickhouse_nice`` (ClickHouse's ``os_thread_priority``): ahead of the
    participants' inserts, except for ``insert-select`` copies, which are bulk work. A server
    without ``CAP_SYS_NICE`` ignores the setting; at 0 it is not sent (a server may refuse it)."""
    ch, co = cfg.clickhouse, cfg.coordinator
    renice: dict[str, Any] = {"os_thread_priority": co.clickhouse_nice} if co.clickhouse_nice else {}
    client = make_client(ch, **renice)
    ledger = LedgerStore.of(
        cfg,
        client,
        checkpoint_every=co.ledger_checkpoint_every,
        retention_s=co.ledger_retention_days * 86400,
    )
    copy = {"os_thread_priority": 0} if renice else {}
    if not cfg.clickhouse.shards:
        return ledger, stage_set(cfg, client, copy_settings=copy)
    shards: dict[str, StageSet] = {}
    for i, section in enumerate(cfg.shard_sections):
        where = shard_rules.where(i, section.url)
        one = stage_set(cfg, shard_client(i, section, **renice), copy_settings=copy)
        if metrics is not None:
            one = MeteredShard(one.tables, coordinator=one.coordinator, shard=where, metrics=metrics)
        shards[where] = one
    return ledger, ShardedStages(shards, client, coordinator=cfg.coordinator_id)


def stage_set(cfg: PipelineConfig, client: Any, *, copy_settings: dict[str, Any] | None = None) -> StageSet:
    """The stage tables of every target table of ``cfg``, each published its own way
    (``PipelineConfig.publish_mode_of``), on ``client``."""
    ch = cfg.clickhouse
    return StageSet(
        {
            table: StageTables(
                client,
                database=ch.database,
                target=table,
                pipeline=cfg.name,
                publish_mode=cfg.publish_mode_of(table),
                copy_settings=copy_settings,
                cluster=ch.cluster,
            )
            for table in cfg.tables
        },
        coordinator=cfg.coordinator_id,
    )
