"""The leader's lease: its heartbeat, sent from a thread and a producer of its own; and a standby's
heartbeat (``StandbyBeat``), by which ``chtxn status`` lists the replicas that do not lead.

So a leader blocked in ClickHouse retries or a Kafka flush keeps its lease; a loop, or a lane
action, stuck for longer than ``LOOP_STALL_LIMIT_S`` stops heartbeating and lets a standby take
over (the seal keeps that safe). A leader stopped cleanly hands the lease over: its last heartbeat
says ``leaving`` (``Lease.stop(leaving=True)``), and a standby claims the next epoch at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import Producer

from clients.kafka import KafkaClientFactory
from protocol import codec, secrets
from protocol.config.parse import PipelineConfig
from protocol.messages import LeaderHeartbeat, StandbyHeartbeat

log = logging.getLogger(__name__)

#: A leader loop that made no progress for this long stops heartbeating (a standby takes over).
LOOP_STALL_LIMIT_S = 120.0
#: How long a leaving leader waits for the broker to take its hand-over.
HAND_OVER_FLUSH_S = 5.0


class Lease:
    """Heartbeats of the leader of ``epoch`` every third of ``coordinator.leader_lease_s``, between
    ``start`` and ``stop``, while ``last_progress()`` (when the loop, or its oldest lane action,
    last made progress) is recent; ``stop(leaving=True)`` ends with a leaving heartbeat. The
    constructor does no I/O."""

    def __init__(
        self,
        cfg: PipelineConfig,
        kafka: KafkaClientFactory,
        *,
        epoch: int,
        coordinator: str,
        clock: Callable[[], float],
        last_progress: Callable[[], float],
    ) -> None:
        self.cfg, self.kafka, self.epoch, self.coordinator = cfg, kafka, epoch, coordinator
        self.clock, self.last_progress = clock, last_progress
        self._done = threading.Event()
        self._leaving = False
        self._thread = threading.Thread(target=self._heartbeats, name=f"leader-heartbeat-e{epoch}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, *, leaving: bool = False) -> None:
        """Stop heartbeating; with ``leaving``, after one last heartbeat saying so: the lease ends now
        (call it once the leader's shutdown is done: a standby takes over as soon as it reads it)."""
        self._leaving = leaving
        self._done.set()
        self._thread.join(10)

    def _heartbeats(self) -> None:
        """The lease, on its own thread and producer: never waits on the loop's ClickHouse or Kafka I/O."""
        producer = self.kafka.producer(**{"client.id": f"chtxn-coordinator-{self.coordinator}-lease", "linger.ms": 0})
        beat = codec.encode(LeaderHeartbeat(pipeline=self.cfg.name, epoch=self.epoch, txn="", sender=self.coordinator))
        interval = self.cfg.coordinator.leader_lease_s / 3
        try:
            while not self._done.is_set():
                progress_at = self.last_progress()
                if self.clock() - progress_at <= LOOP_STALL_LIMIT_S:
                    try:
                        producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=beat)
                    except BufferError:
                        pass  # the broker is unreachable: the lease lapses, as it should
                else:
                    log.error(
                        "the leader loop is stuck; no longer heartbeating",
                        extra={"stuck_s": round(self.clock() - progress_at, 1)},
                    )
                producer.poll(0)
                self._done.wait(interval)
            if self._leaving:
                self._hand_over(producer)
        finally:
            producer.flush(1)

    def _hand_over(self, producer: Producer) -> None:
        """The last heartbeat of a leader that stopped cleanly: a standby claims the next epoch at once."""
        beat = LeaderHeartbeat(pipeline=self.cfg.name, epoch=self.epoch, txn="", sender=self.coordinator, leaving=True)
        try:
            producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=codec.encode(beat))
        except BufferError:
            return  # the broker is unreachable: a standby takes over when the lease lapses
        if producer.flush(HAND_OVER_FLUSH_S) > 0:
            log.warning(
                "could not hand the lease over: a standby takes over when it lapses", extra={"epoch": self.epoch}
            )
        else:
            log.warning("handed the lease over", extra={"epoch": self.epoch})


class StandbyBeat:
    """A standby's STANDBY-HEARTBEAT every third of ``coordinator.leader_lease_s``, sent from the standby's
    loop (``beat`` each turn) on a producer of its own that is never waited for: a beat the broker cannot
    take now is dropped. It tells only who stands by (``chtxn status``); no replica's lease depends on it.
    ``close(leaving=True)`` sends a last beat saying the replica stops. The constructor does no I/O."""

    def __init__(
        self, cfg: PipelineConfig, kafka: KafkaClientFactory, *, coordinator: str, clock: Callable[[], float]
    ) -> None:
        self.cfg, self.kafka, self.coordinator, self.clock = cfg, kafka, coordinator, clock
        self.interval_s = cfg.coordinator.leader_lease_s / 3
        self._due = float("-inf")
        self._producer: Producer | None = None

    def beat(self, epoch: int, *, problem: str = "", cause: str = "") -> None:
        """Send a beat naming ``epoch`` (the highest this replica has seen) when one is due; ``problem``
        and ``cause`` say why the replica cannot lead now (``StandbyHeartbeat``)."""
        now = self.clock()
        if now < self._due:
            return
        self._due = now + self.interval_s
        self._send(epoch, leaving=False, problem=problem, cause=cause)

    def close(self, epoch: int, *, leaving: bool) -> None:
        """Stop beating; with ``leaving``, after a last beat saying so (waits up to ``HAND_OVER_FLUSH_S``
        for the broker to take it)."""
        if leaving:
            self._send(epoch, leaving=True)
        if self._producer is not None:
            self._producer.flush(HAND_OVER_FLUSH_S if leaving else 1)
            self._producer = None

    def _send(self, epoch: int, *, leaving: bool, problem: str = "", cause: str = "") -> None:
        if self._producer is None:
            lease_ms = int(3000 * self.interval_s)  # a beat not delivered within a lease says nothing: drop it
            self._producer = self.kafka.producer(
                **{
                    "client.id": f"chtxn-coordinator-{self.coordinator}-standby",
                    "linger.ms": 0,
                    "message.timeout.ms": max(1000, lease_ms),
                }
            )
        beat = StandbyHeartbeat(
            pipeline=self.cfg.name,
            epoch=epoch,
            txn="",
            sender=self.coordinator,
            leaving=leaving,
            problem=secrets.redact(problem) if problem else "",
            cause=cause,
        )
        try:
            self._producer.produce(self.cfg.control_topic, key=self.cfg.name.encode(), value=codec.encode(beat))
        except BufferError:
            pass  # the broker is unreachable: the beats resume when it is back
        self._producer.poll(0)
