"""Real ``Leader``s of chosen epochs in threads, for tests that script take-overs with failpoints."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from clients import failpoints
from coordinator.control import ControlChannel
from coordinator.leader import Leader
from coordinator.metrics import CoordinatorMetrics
from coordinator.service import clickhouse_stores, stage_set
from coordinator.stage.shards import Stages
from tests.pipelines import Pipeline


class LeaderThread:
    """One ``Leader`` of ``epoch`` (claimed in the ledger first) in a thread; ``outcome`` once it ends."""

    def __init__(
        self,
        pipeline: Pipeline,
        epoch: int,
        name: str,
        *,
        stages: Stages | None = None,
        leader_class: type[Leader] = Leader,
    ) -> None:
        self.pipeline, self.epoch, self.name, self.leader_class = pipeline, epoch, name, leader_class
        self.stages = stages or stage_tables(pipeline, name)
        self.stop = threading.Event()
        self.outcome: str | BaseException | None = None
        self.metrics = CoordinatorMetrics(pipeline.cfg.name)
        self.thread = threading.Thread(target=self._run, name=f"leader-{name}", daemon=True)

    def _run(self) -> None:
        ledger = self.pipeline.ledger()
        control = ControlChannel(self.pipeline.cfg, client_id=self.name)
        try:
            assert ledger.claim_epoch(self.epoch, self.name), f"{self.name} could not claim epoch {self.epoch}"
            control.open()
            self.outcome = self.leader_class(
                self.pipeline.cfg,
                epoch=self.epoch,
                coordinator=self.name,
                control=control,
                ledger=ledger,
                stages=self.stages,
                metrics=self.metrics,
            ).run(self.stop)
        except BaseException as exc:  # surfaced by the test
            self.outcome = exc
        finally:
            control.close()

    def aborts(self, kind: str) -> float:
        """This leader's ``chtxn_aborts_total{reason=kind}``."""
        value = self.metrics.registry.get_sample_value(
            "chtxn_aborts_total", {"pipeline": self.pipeline.cfg.name, "reason": kind}
        )
        return value or 0.0

    def start(self) -> LeaderThread:
        self.thread.start()
        return self

    def ended(self, timeout_s: float) -> str | BaseException:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"{self.name} did not end within {timeout_s:g} s"
        assert self.outcome is not None
        return self.outcome


def stage_tables(pipeline: Pipeline, coordinator: str = "") -> Stages:
    """The stage tables of every target table of the pipeline (on every shard of ``clickhouse.shards``),
    as the coordinator service makes them."""
    cfg = msgspec.structs.replace(
        pipeline.cfg, coordinator=msgspec.structs.replace(pipeline.cfg.coordinator, id=coordinator)
    )
    if cfg.clickhouse.shards:
        return clickhouse_stores(cfg)[1]
    return stage_set(cfg, pipeline.client())


@contextmanager
def leaders(*threads: LeaderThread) -> Iterator[None]:
    try:
        yield
    finally:
        failpoints.disarm()
        for t in threads:
            t.stop.set()
        for t in threads:
            if t.thread.is_alive():
                t.thread.join(60)
