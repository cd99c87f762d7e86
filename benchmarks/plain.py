"""The reference loops, one process per group of partitions: what chtxn is compared with.

Three modes, each reading the same pre-produced partitions from the start to a known end offset:

- ``loop``: the plain at-least-once consumer: ``assign`` its partitions, read raw values, cut
  each partition's records into batches of ``batch_rows``, insert each as the participant does
  (``protocol.framing``: the values framed by ``clickhouse.input_format``, as the participant
  frames them, and ClickHouse filling ``_topic/_partition/_offset`` in an
  ``INSERT ... SELECT ... FROM input()``) into ``bench.events_plain``, then commit that
  partition's offset (synchronously);
- ``consume``: reading only (the ceiling of confluent-kafka on the embedded broker);
- ``insert``: inserting only (the ceiling of the embedded ClickHouse): the bodies ``loop`` would
  send are read and built before the clock starts, then inserted into ``bench.events_ceiling``.

Workers are started with ``spawn``, connect and prepare, then wait for one ``go`` so process
start-up is never timed. Rows/s is all rows over (last worker's end - first worker's start).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition as KafkaTP

from benchmarks import cpu
from benchmarks.workload import CEILING, DATABASE, PLAIN, PLAIN_GROUP, TOPIC
from clients.clickhouse import InsertBody, make_client
from protocol.config.parse import PipelineConfig
from protocol.errors import ChtxnError
from protocol.framing import ROW_ORDER_SETTINGS, Column, MetadataInsert, frame

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

    from clickhouse_connect.driver.client import Client

POLL_BATCH = 5_000  # the participant's default ``poll_batch``


@dataclass
class Outcome:
    """One run of a mode over every worker: rows, the timed window, and where workers spent it."""

    mode: str
    workers: int
    rows: int
    window_s: float
    phases_s: dict[str, float] = field(default_factory=dict)  # summed over workers
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds by component in the window
    cpu_window_s: float = 0.0  # the span of those CPU figures (a little longer than the window)
    cpu_since: float = 0.0  # unix time at which that span starts

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.window_s if self.window_s > 0 else 0.0


def run(
    mode: str,
    cfg: PipelineConfig,
    groups: Sequence[Sequence[int]],
    ends: dict[int, int],
    *,
    batch_rows: int,
    timeout_s: float = 600.0,
) -> Outcome:
    """Run ``mode`` with one worker process per group of partitions; every process is gone on return."""
    ctx = mp.get_context("spawn")
    reports: mp.Queue = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(
            target=_worker,
            args=(mode, cfg, list(g), {p: ends[p] for p in g}, batch_rows, go, reports),
            name=f"bench-{mode}-{i}",
            daemon=True,
        )
        for i, g in enumerate(groups)
    ]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout_s
        _collect(reports, procs, "ready", deadline)
        before, since = cpu.snapshot(), time.time()
        go.set()
        done = _collect(reports, procs, "done", deadline)
        usage, cpu_window = cpu.used(before, cpu.snapshot()), time.time() - since
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    phases: dict[str, float] = {}
    for report in done:
        for name, seconds in report["phases"].items():
            phases[name] = phases.get(name, 0.0) + seconds
    window = max(r["end"] for r in done) - min(r["start"] for r in done)
    usage["plain loop"] = sum(r["cpu_s"] for r in done)  # the workers' own count: they may be gone already
    return Outcome(mode, len(groups), sum(r["rows"] for r in done), window, phases, usage, cpu_window, since)


def _collect(reports: mp.Queue, procs: list, kind: str, deadline: float) -> list[dict]:
    got: list[dict] = []
    while len(got) < len(procs):
        try:
            report = reports.get(timeout=0.5)
        except queue.Empty:  # look at the workers, then wait on
            dead = [p.name for p in procs if not p.is_alive() and p.exitcode not in (0, None)]
            if dead:
                raise ChtxnError(f"benchmark workers {dead} died before reporting {kind!r}") from None
            if time.monotonic() > deadline:
                raise ChtxnError(
                    f"benchmark workers did not all report {kind!r} in time ({len(got)}/{len(procs)})"
                ) from None
            continue
        if report["kind"] == "error":
            raise ChtxnError(f"a benchmark worker failed:\n{report['error']}")
        got.append(report)
    return got


def _worker(
    mode: str,
    cfg: PipelineConfig,
    partitions: list[int],
    ends: dict[int, int],
    batch_rows: int,
    go: Event,
    reports: mp.Queue,
) -> None:
    try:
        reports.put(_Worker(mode, cfg, partitions, ends, batch_rows).run(go, reports))
    except BaseException:
        reports.put({"kind": "error", "error": traceback.format_exc()})


class _Worker:
    def __init__(
        self, mode: str, cfg: PipelineConfig, partitions: list[int], ends: dict[int, int], batch_rows: int
    ) -> None:
        self.mode, self.cfg, self.ends, self.batch_rows = mode, cfg, ends, batch_rows
        self.consumer = Consumer(
            {
                "bootstrap.servers": cfg.kafka.bootstrap_servers,
                "group.id": PLAIN_GROUP,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "isolation.level": "read_committed",
                **cfg.kafka.properties,
            }
        )
        self.consumer.assign([KafkaTP(TOPIC, p, OFFSET_BEGINNING) for p in partitions])
        self.client = make_client(cfg.clickhouse) if mode != "consume" else None
        self.inserts = {
            table: MetadataInsert(DATABASE, table, _columns(self.client, table), cfg.clickhouse.input_format)
            for table in (PLAIN, CEILING)
            if self.client is not None
        }
        self.phases = {"consume": 0.0, "body": 0.0, "insert": 0.0, "commit": 0.0}

    def run(self, go: Event, reports: mp.Queue) -> dict:
        prepared = self._prepare_inserts() if self.mode == "insert" else []
        reports.put({"kind": "ready"})
        go.wait()
        start, cpu_start = time.time(), time.process_time()
        if self.mode == "insert":
            rows = self._insert_all(prepared)
        else:
            rows = self._loop()
        end, cpu_s = time.time(), time.process_time() - cpu_start
        self.consumer.close()
        return {"kind": "done", "rows": rows, "start": start, "end": end, "phases": self.phases, "cpu_s": cpu_s}

    def _loop(self) -> int:
        """Consume to the end offsets; in ``loop`` mode insert and commit every full batch."""
        pending: dict[int, list] = {p: [] for p in self.ends}
        left = {p: end for p, end in self.ends.items() if end > 0}
        rows, clock = 0, time.perf_counter
        while left:
            t0 = clock()
            batch = self.consumer.consume(num_messages=POLL_BATCH, timeout=0.05)
            self.phases["consume"] += clock() - t0
            for m in batch:
                if (error := m.error()) is not None:
                    raise ChtxnError(f"reading {m.topic()}/{m.partition()}: {error.str()}")
                pending[m.partition()].append(m)  # type: ignore[index]  # None only on an error record
            for p in list(left):
                records = pending[p]
                while records and (len(records) >= self.batch_rows or records[-1].offset() + 1 >= left[p]):
                    take, records = records[: self.batch_rows], records[self.batch_rows :]
                    if self.mode == "loop":
                        self._insert_and_commit(p, take)
                    rows += len(take)
                    if take[-1].offset() + 1 >= left[p]:
                        del left[p]
                        break
                pending[p] = records
        return rows

    def _insert_and_commit(self, partition: int, records: list) -> None:
        clock = time.perf_counter
        t0 = clock()
        body = frame(records, self.cfg.clickhouse.input_format)
        statement, params = self.inserts[PLAIN].statement(TOPIC, partition, records)
        t1 = clock()
        assert self.client is not None  # mode loop
        self.client.command(statement, parameters=params, data=InsertBody(body), settings=ROW_ORDER_SETTINGS)
        t2 = clock()
        self.consumer.commit(offsets=[KafkaTP(TOPIC, partition, records[-1].offset() + 1)], asynchronous=False)
        t3 = clock()
        self.phases["body"] += t1 - t0
        self.phases["insert"] += t2 - t1
        self.phases["commit"] += t3 - t2

    def _prepare_inserts(self) -> list[tuple[int, bytes, str, dict]]:
        """The bodies ``loop`` would insert, read and built before the clock starts."""
        pending: dict[int, list] = {p: [] for p in self.ends}

        def complete(p: int) -> bool:
            return self.ends[p] == 0 or (bool(pending[p]) and pending[p][-1].offset() + 1 >= self.ends[p])

        while not all(complete(p) for p in pending):
            for m in self.consumer.consume(num_messages=POLL_BATCH, timeout=0.05):
                if m.error() is None:
                    pending[m.partition()].append(m)  # type: ignore[index]  # None only on an error record
        batches = [
            (p, records[i : i + self.batch_rows])
            for p, records in pending.items()
            for i in range(0, len(records), self.batch_rows)
        ]
        return [
            (
                len(batch),
                frame(batch, self.cfg.clickhouse.input_format),
                *self.inserts[CEILING].statement(TOPIC, p, batch),
            )
            for p, batch in batches
        ]

    def _insert_all(self, prepared: list[tuple[int, bytes, str, dict]]) -> int:
        clock = time.perf_counter
        assert self.client is not None  # mode insert
        for _, body, statement, params in prepared:
            t0 = clock()
            self.client.command(statement, parameters=params, data=InsertBody(body), settings=ROW_ORDER_SETTINGS)
            self.phases["insert"] += clock() - t0
        return sum(n for n, *_ in prepared)


def _columns(client: Client, table: str) -> list[Column]:
    rows = client.query(
        "SELECT name, type, default_kind, default_expression FROM system.columns "
        "WHERE database = %(db)s AND table = %(table)s ORDER BY position",
        parameters={"db": DATABASE, "table": table},
    ).result_rows
    return [Column(*row) for row in rows]
