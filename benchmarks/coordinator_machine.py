"""The coordinator's state machine alone, replayed at 16 to 1024 partitions: CPU per txn, no I/O.

    .venv/bin/python -m benchmarks.coordinator_machine [--partitions 16,64,256,1024] [--tasks 16,32,32,32]
        [--seconds 20] [--profile 1024]

``CoordinatorState`` gets the event stream a leader loop feeds it in steady state, on a simulated
clock: ``tasks`` heartbeats every 0.5 s (the partitions round-robin over the tasks), a ``Tick``
every 20 ms (the loop's poll timeout), a 1 s interval, one WRITE-STATUS of 8 rows per partition
after each END, and every I/O action answered at once (stage created, counted, committed,
published). What it prints is the machine's own CPU per txn (``time.process_time``), which the
end-to-end benchmark (``benchmarks.partitions``) cannot separate from the loop's I/O. Quick (a few
seconds) and deterministic: run it before and after a change to the machine.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from protocol.coordinator.events import (
    Broadcast,
    Commit,
    CommitResult,
    Counted,
    CountStage,
    CreateStage,
    Event,
    PartitionStats,
    Publish,
    PublishResult,
    Ready,
    Received,
    StageCreated,
    Tick,
)
from protocol.coordinator.flight import Timing
from protocol.coordinator.state import CoordinatorState
from protocol.messages import EndCommit, Heartbeat, PartitionPosition, TopicPartition, WriteStatus

TICK_S = 0.02
HEARTBEAT_S = 0.5
ROWS = 8


class Replay:
    """One machine of ``partitions`` partitions over ``tasks`` heartbeating tasks, on a simulated clock."""

    def __init__(self, partitions: int, tasks: int) -> None:
        self.tps = [TopicPartition(topic="events", partition=p) for p in range(partitions)]
        self.groups = [self.tps[i::tasks] for i in range(min(tasks, partitions))]
        self.state = CoordinatorState(
            pipeline="bench",
            epoch=1,
            coordinator="c",
            target="events",
            timing=Timing(interval_s=1.0, heartbeat_timeout_s=3.0),
        )
        self.now = 0.0
        self.ended: list[str] = []
        self.events = 0

    def feed(self, event: Event) -> None:
        """``event`` and every I/O outcome its actions lead to, answered at once."""
        pending = [event]
        while pending:
            self.events += 1
            for action in self.state.handle(pending.pop(0), self.now):
                if isinstance(action, CreateStage):
                    pending.append(StageCreated(action.txn))
                elif isinstance(action, Broadcast) and isinstance(action.message, EndCommit):
                    self.ended.append(action.message.txn)
                elif isinstance(action, CountStage):
                    txn = self.state.txn(action.txn)
                    assert txn is not None, action.txn  # a txn being counted is open
                    stats = {
                        tp: PartitionStats(ws.rows, ws.start_offset, ws.end_offset - 1)
                        for tp, ws in txn.statuses.items()
                        if ws.rows
                    }
                    pending.append(Counted(action.txn, txn.rows, partitions=stats))
                elif isinstance(action, Commit):
                    pending.append(CommitResult(action.txn.id, True))
                elif isinstance(action, Publish):
                    pending.append(PublishResult(action.txn.id, True))

    def heartbeat(self, task: int) -> Received:
        return Received(
            Heartbeat(
                pipeline="bench",
                epoch=1,
                txn="",
                sender=f"task-{task}",
                partitions=tuple(
                    PartitionPosition(
                        topic=tp.topic, partition=tp.partition, position=0, log_end=-1, buffered_rows=ROWS
                    )
                    for tp in self.groups[task]
                ),
            )
        )

    def run(self, seconds: float) -> tuple[int, float]:
        """Steady state for ``seconds`` of simulated time: (txns committed, CPU seconds)."""
        self.feed(Ready(0, {}, {tp: 0 for tp in self.tps}))
        for task in range(len(self.groups)):
            self.feed(self.heartbeat(task))
        next_beat, beats, step = 0.0, 0, HEARTBEAT_S / len(self.groups)
        committed, cpu = self.state.head_seq, time.process_time()
        while self.now < seconds:
            self.now += TICK_S
            while next_beat <= self.now:
                self.feed(self.heartbeat(beats % len(self.groups)))
                beats, next_beat = beats + 1, next_beat + step
            while self.ended:
                txn = self.state.txn(self.ended.pop(0))
                if txn is None:
                    continue
                for tp in self.tps:
                    begin = txn.start[tp]
                    self.feed(
                        Received(
                            WriteStatus(
                                pipeline="bench",
                                epoch=1,
                                txn=txn.id,
                                sender=txn.holders[tp],
                                topic=tp.topic,
                                partition=tp.partition,
                                start_offset=begin,
                                end_offset=begin + ROWS,
                                rows=ROWS,
                                chunks=1,
                            )
                        )
                    )
            self.feed(Tick())
        return self.state.head_seq - committed, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.coordinator_machine", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--partitions", default="16,64,256,1024")
    parser.add_argument("--tasks", default="16,32,32,32", help="tasks per partition count, in the same order")
    parser.add_argument("--seconds", type=float, default=20.0, help="simulated seconds per run (default 20)")
    parser.add_argument("--profile", type=int, default=0, help="also profile this partition count (cProfile)")
    args = parser.parse_args(argv)
    counts = [int(p) for p in args.partitions.split(",")]
    tasks = [int(t) for t in args.tasks.split(",")]
    if len(counts) != len(tasks):
        parser.error("--tasks needs one count per --partitions entry")
    print(f"{'partitions':>10} {'tasks':>5} {'txns':>5} {'events/txn':>10} {'CPU ms/txn':>10} {'us/event':>8}")
    for n, t in zip(counts, tasks):
        replay = Replay(n, t)
        txns, cpu = replay.run(args.seconds)
        print(
            f"{n:>10} {t:>5} {txns:>5} {replay.events / txns:>10.0f} {cpu * 1000 / txns:>10.2f} "
            f"{cpu * 1e6 / replay.events:>8.1f}"
        )
    if args.profile:
        profiler = cProfile.Profile()
        replay = Replay(args.profile, tasks[counts.index(args.profile)] if args.profile in counts else 32)
        profiler.runcall(replay.run, args.seconds)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
