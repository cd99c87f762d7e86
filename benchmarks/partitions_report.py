"""What ``benchmarks.partitions`` reads back after a run, and how it prints it.

- ``threads_cpu``: a process's CPU seconds by thread kind, from ``/proc/<pid>/task/*/stat``;
- ``figures``: one run's ``RunFigures`` over its window, from the ledger (txns, START -> END,
  END -> commit point) and the control topic, read from its start (messages by kind, END ->
  ACK-COMMIT, last WRITE-STATUS -> ACK-COMMIT);
- ``table``, ``summary_line``, ``top_functions``: the console output.
"""

from __future__ import annotations

import io
import os
import pstats
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition as KafkaTP
from rich.table import Table

from benchmarks import summary
from benchmarks.chtxn_run import REPO
from benchmarks.fleet import FleetCounts
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from protocol import codec
from protocol.config.parse import PipelineConfig
from protocol.messages import AckCommit, EndCommit, WriteStatus

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class RunFigures:
    """One (partitions, load) run, over its measured window."""

    partitions: int
    tasks: int
    load: str
    window_s: float
    txns: int  # committed in the window
    aborts: int
    abort_reasons: dict[str, int]
    rows: int
    cpu_s: float  # the coordinator process, every thread
    cpu_s_by_thread: dict[str, float]
    control_messages: dict[str, int]  # by kind, in the window
    commit_ms: list[float]  # END -> commit point (ledger), committed txns of the window
    consume_ms: list[float]  # START -> END (ledger): interval_s, unless the leader loop was held up
    end_to_ack_ms: list[float]  # END -> ACK-COMMIT (control topic timestamps)
    verify_to_ack_ms: list[float]  # last WRITE-STATUS -> ACK-COMMIT: the coordinator's own part of it
    fleet: dict[str, int] = field(default_factory=dict)
    profile: str = ""  # the .prof file of a profiled run

    @property
    def txns_per_s(self) -> float:
        return self.txns / self.window_s

    @property
    def cpu_ms_per_txn(self) -> float | None:
        return self.cpu_s / self.txns * 1000 if self.txns else None

    @property
    def messages_per_s(self) -> float:
        return sum(self.control_messages.values()) / self.window_s

    def flat(self) -> dict[str, object]:
        found = asdict(self)
        found.update(
            {
                "txns_per_s": self.txns_per_s,
                "cpu_ms_per_txn": self.cpu_ms_per_txn,
                "cpu_share": self.cpu_s / self.window_s,
                "messages_per_s": self.messages_per_s,
                "consume_p50_ms": summary.percentile(self.consume_ms, 0.5),
                "consume_max_ms": max(self.consume_ms, default=None),
                "commit_p50_ms": summary.percentile(sorted(self.commit_ms), 0.5),
                "commit_p95_ms": summary.percentile(sorted(self.commit_ms), 0.95),
                "end_to_ack_p50_ms": summary.percentile(sorted(self.end_to_ack_ms), 0.5),
                "end_to_ack_p95_ms": summary.percentile(sorted(self.end_to_ack_ms), 0.95),
                "verify_to_ack_p50_ms": summary.percentile(sorted(self.verify_to_ack_ms), 0.5),
                "verify_to_ack_p95_ms": summary.percentile(sorted(self.verify_to_ack_ms), 0.95),
            }
        )
        return found


def threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of ``pid``'s threads: ``leader loop`` (the main thread), ``librdkafka``
    (threads named ``rdk:*``), ``other`` (the lease thread, prometheus, ...)."""
    found: defaultdict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / _TICK
        kind = "leader loop" if int(task.name) == pid else "librdkafka" if comm.startswith("rdk:") else "other"
        found[kind] += seconds
    return dict(found)


def figures(
    cfg: PipelineConfig,
    n: int,
    tasks: int,
    load: str,
    t0: float,
    t1: float,
    by_thread: dict[str, float],
    counts: FleetCounts,
    profile: str,
) -> RunFigures:
    """The run's figures over ``[t0, t1]`` (unix seconds), from the ledger and the control topic."""
    client = make_client(cfg.clickhouse)
    try:
        txns = LedgerHistory(client, cfg.clickhouse.database, cfg.name).history(limit=100_000)
    finally:
        client.close()
    committed = [t for t in txns if t.state in ("COMMITTED", "PUBLISHED") and t0 <= t.committed_at <= t1 and t.ended_at]
    aborted = [t for t in txns if t.state == "ABORTED" and t0 <= t.aborted_at <= t1]
    kinds, end_to_ack, verify_to_ack = read_control(cfg, t0, t1)
    return RunFigures(
        partitions=n,
        tasks=tasks,
        load=load,
        window_s=t1 - t0,
        txns=len(committed),
        aborts=len(aborted),
        abort_reasons=dict(Counter(t.reason.split(":", 1)[0][:60] for t in aborted)),
        rows=sum(t.total_rows for t in committed),
        cpu_s=sum(by_thread.values()),
        cpu_s_by_thread={k: round(v, 3) for k, v in by_thread.items()},
        control_messages=kinds,
        commit_ms=[t.commit_ms for t in committed if t.commit_ms is not None],
        consume_ms=[t.consume_ms for t in committed if t.consume_ms is not None],
        end_to_ack_ms=end_to_ack,
        verify_to_ack_ms=verify_to_ack,
        fleet=asdict(counts),
        profile=profile,
    )


def read_control(cfg: PipelineConfig, t0: float, t1: float) -> tuple[dict[str, int], list[float], list[float]]:
    """Messages by kind with a timestamp in ``[t0, t1]``, and, of the txns acked then, END -> ACK-COMMIT
    and last WRITE-STATUS -> ACK-COMMIT (ms)."""
    consumer = Consumer(
        {
            "bootstrap.servers": cfg.kafka.bootstrap_servers,
            "group.id": f"{cfg.name}.bench-count",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([KafkaTP(cfg.control_topic, 0, OFFSET_BEGINNING)])
    kinds: Counter[str] = Counter()
    ends: dict[str, float] = {}
    last_status: dict[str, float] = {}
    end_to_ack: list[float] = []
    verify_to_ack: list[float] = []
    try:
        at_end = False
        while not at_end:
            batch = consumer.consume(2000, 30)
            if not batch:
                raise TimeoutError(f"the control topic {cfg.control_topic} gave nothing for 30 s")
            for m in batch:
                if (error := m.error()) is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(f"reading {cfg.control_topic}: {error.str()}")
                    at_end = True
                    continue
                ts, message = m.timestamp()[1] / 1000, codec.decode(m.value())
                kind = str(type(message).__struct_config__.tag) if message is not None else "unknown"
                if isinstance(message, EndCommit):
                    ends[message.txn] = ts
                elif isinstance(message, WriteStatus):
                    last_status[message.txn] = max(ts, last_status.get(message.txn, 0.0))
                if not t0 <= ts <= t1:
                    continue
                kinds[kind] += 1
                if isinstance(message, AckCommit) and message.txn in ends:
                    end_to_ack.append((ts - ends[message.txn]) * 1000)
                if isinstance(message, AckCommit) and message.txn in last_status:
                    verify_to_ack.append((ts - last_status[message.txn]) * 1000)
    finally:
        consumer.close()
    return dict(sorted(kinds.items())), end_to_ack, verify_to_ack


# ---- reporting ------------------------------------------------------------------------------


def _ms(value: object) -> str:
    return "-" if value is None else f"{value:,.0f}"


def summary_line(run: RunFigures) -> str:
    f = run.flat()
    return (
        f"{run.partitions} partitions / {run.tasks} tasks, {run.load}{' (cProfile)' if run.profile else ''}: "
        f"{run.txns} txns in {run.window_s:.0f} s, {run.aborts} aborts, coordinator CPU {run.cpu_s:.1f} s "
        f"({_ms(run.cpu_ms_per_txn)} ms/txn), {run.messages_per_s:,.0f} control msgs/s, "
        f"END->commit p50 {_ms(f['commit_p50_ms'])} ms"
    )


def table(runs: list[RunFigures], title: str) -> Table:
    t = Table(title=title)
    for column in (
        "partitions",
        "tasks",
        "load",
        "txns/s",
        "aborts",
        "CPU ms/txn",
        "CPU %",
        "of which loop %",
        "ctl msgs/s",
        "START→END p50/max ms",
        "END→commit p50/p95 ms",
        "END→ACK p50/p95 ms",
        "last WS→ACK p50/p95 ms",
        "rows/txn",
    ):
        t.add_column(column, justify="left" if column == "load" else "right")
    for r in runs:
        f = r.flat()
        loop = r.cpu_s_by_thread.get("leader loop", 0.0)
        t.add_row(
            str(r.partitions),
            str(r.tasks),
            r.load,
            f"{r.txns_per_s:.2f}",
            str(r.aborts),
            _ms(r.cpu_ms_per_txn),
            f"{100 * r.cpu_s / r.window_s:.0f}",
            f"{100 * loop / r.window_s:.0f}",
            f"{r.messages_per_s:,.0f}",
            f"{_ms(f['consume_p50_ms'])} / {_ms(f['consume_max_ms'])}",
            f"{_ms(f['commit_p50_ms'])} / {_ms(f['commit_p95_ms'])}",
            f"{_ms(f['end_to_ack_p50_ms'])} / {_ms(f['end_to_ack_p95_ms'])}",
            f"{_ms(f['verify_to_ack_p50_ms'])} / {_ms(f['verify_to_ack_p95_ms'])}",
            f"{r.rows / r.txns:,.0f}" if r.txns else "-",
        )
    return t


def top_functions(path: str, limit: int) -> str:
    """The ``limit`` functions with the most own time, and the ``limit`` with the most cumulative time."""
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    text = out.getvalue()
    return text.replace(str(REPO) + "/", "")
