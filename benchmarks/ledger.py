"""Ledger reads against a long ledger: take-over, ``chtxn status`` and ``chtxn txn list``, old and new.

    python -m benchmarks.ledger [--commits 1000000] [--partitions 64] [--runs 3] [--main OLD_CHECKOUT]

Starts its own embedded stack (ClickHouse endpoint and Kafka broker) in a temporary directory,
fills one ledger table server-side (``INSERT ... SELECT FROM numbers()``) with two pipelines:
``big`` (``--commits`` commits, one per second of synthetic time, each over 8 of 64 partitions,
with their STARTED and PUBLISHED rows, as main writes them) and ``small`` (ten commits), then times:

- take-over: the ledger calls of ``Leader.take_over`` (head, seal, commit_at, PUBLISHED of the
  seal, committed_unpublished, txn) with the SQL main used before checkpoints ("old") and with
  this code: the first take-over of a ledger without a checkpoint (it writes the first one), then,
  with the checkpoints every 1000 slots the new code would have written added, a later one;
- the ledger reads of ``chtxn status`` and ``chtxn txn list``, in-process, old SQL and new;
- ``chtxn status --json`` and ``chtxn txn list --json`` as processes (wall time, interpreter start
  and Kafka included), run from the ``--main`` checkout ("old") and from this one ("new"), on the
  same table.

Prints a Markdown table (median of ``--runs``). Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from coordinator.ledger.store import LedgerStore
from protocol import naming
from protocol.config.sections import ClickHouseSection
from protocol.ledger import rows as ledger, sql as ledger_sql
from protocol.ledger.rows import LedgerEvent, LedgerRow
from protocol.ledger.sql import ALL_SLOTS
from protocol.ledger.view import TxnSummary, summarize

REPO = Path(__file__).resolve().parent.parent
DATABASE = "chtxn_bench_ledger"
TOPIC = "src"
PER_COMMIT = 8  # partitions each synthetic commit covers
CHUNK = 250_000

#: main's SQL before checkpoints, verbatim but for the qualified table name.
OLD_UNPUBLISHED = (
    "SELECT * FROM ({commits}) WHERE stage_table != '' AND txn NOT IN "
    "(SELECT txn FROM {t} WHERE pipeline = {{pipeline:String}} AND event IN ('PUBLISHED', 'LOST')) ORDER BY commit_seq"
)
OLD_HISTORY = (
    "SELECT txn, {state} AS state FROM {t} WHERE pipeline = {{pipeline:String}} AND txn != '' "
    "GROUP BY txn HAVING {{state:String}} = '' OR state = {{state:String}} "
    "ORDER BY min(event_time) DESC, txn DESC LIMIT {{limit:UInt32}}"
)
OLD_MAX_EPOCH = "SELECT max(epoch) FROM {t} WHERE pipeline = {{pipeline:String}}"


class OldLedgerStore(LedgerHistory):
    """The reads of main before checkpoints: the whole chain, a NOT IN over every PUBLISHED row,
    every row grouped by txn. Writes no checkpoint."""

    def checkpoint(self, *, epoch: int, coordinator: str) -> int:
        return 0

    def expire(self) -> int:
        return 0

    def head(self) -> tuple[int, dict]:
        rows = self._query("read the ledger head", ledger_sql.head_sql(self._database), **ALL_SLOTS)
        seq = max((int(r[3]) for r in rows), default=0)
        return seq, {(t, int(p)): int(e) for t, p, e, _ in rows if t}

    def committed_unpublished(self, *, after: int | None = None) -> list[LedgerRow]:
        sql = OLD_UNPUBLISHED.format(commits=ledger_sql.resolved_commits_sql(self._database), t=self.table)
        return [ledger.from_result_row(r) for r in self._query("read unpublished commits", sql, **ALL_SLOTS)]

    def history(self, limit: int = 20, state: str | None = None) -> list[TxnSummary]:
        sql = OLD_HISTORY.format(state=ledger.state_sql(), t=self.table)
        order = [r[0] for r in self._query("list txns", sql, limit=limit, state=(state or "").upper())]
        grouped = self._rows_of(order)
        return [summarize(grouped[t]) for t in order if t in grouped]

    def max_epoch(self) -> int:
        return int(self._query("read the highest epoch", OLD_MAX_EPOCH.format(t=self.table))[0][0])


def fill_sql(pipeline: str, first: int, count: int, base_ms: int) -> str:
    """Commits ``first``..``first+count-1`` of ``pipeline``: STARTED, COMMITTED and PUBLISHED rows."""
    columns = ", ".join((*ledger.INSERT_COLUMNS, "event_time"))
    per = PER_COMMIT
    return f"""
INSERT INTO {ledger.qualified(DATABASE)} ({columns})
SELECT '{pipeline}', concat('e1_t', toString(n)), ev, 1, if(ev = 'STARTED', 0, n), 'bench',
       if(ev = 'COMMITTED', concat('claim', toString(n)), ''), 'events',
       concat('events__chtxn_{pipeline}__e1_t', toString(n)),
       arrayMap(i -> '{TOPIC}', range({per})),
       arrayMap(i -> toInt32(((n - 1) % intDiv(64, {per})) * {per} + i), range({per})),
       arrayMap(i -> toInt64(intDiv(n - 1, intDiv(64, {per})) * 100), range({per})),
       arrayMap(i -> toInt64(intDiv(n - 1, intDiv(64, {per})) * 100 + 100), range({per})),
       arrayMap(i -> toUInt64(100), range({per})),
       {per * 100}, {per * 100 * 80}, 0, t, t, t, t, '',
       t + toIntervalMillisecond(multiIf(ev = 'STARTED', 0, ev = 'COMMITTED', 100, 200))
FROM (SELECT number + {first} AS n, fromUnixTimestamp64Milli(toInt64({base_ms} + n * 1000), 'UTC') AS t
      FROM numbers({count}))
ARRAY JOIN ['STARTED', 'COMMITTED', 'PUBLISHED'] AS ev
SETTINGS insert_deduplicate = 0
"""


def checkpoints_sql(pipeline: str, commits: int, every: int, base_ms: int) -> str:
    """The CHECKPOINT rows the new code leaves behind: every ``every`` slots, 300 ms after the commit."""
    columns = ", ".join((*ledger.INSERT_COLUMNS, "event_time"))
    groups = 64 // PER_COMMIT
    ends = f"arrayMap(p -> toInt64(if(s - 1 >= intDiv(p, {PER_COMMIT}), intDiv(s - 1 - intDiv(p, {PER_COMMIT}), {groups}) + 1, 0) * 100), range(64))"
    return f"""
INSERT INTO {ledger.qualified(DATABASE)} ({columns})
SELECT '{pipeline}', '', 'CHECKPOINT', 1, s, 'bench', '', '', '',
       arrayMap(p -> '{TOPIC}', range(64)), arrayMap(p -> toInt32(p), range(64)), {ends}, {ends},
       arrayMap(p -> toUInt64(0), range(64)), 0, 0, 0, t, t, t, t, '', t + toIntervalMillisecond(300)
FROM (SELECT (number + 1) * {every} AS s, fromUnixTimestamp64Milli(toInt64({base_ms} + s * 1000), 'UTC') AS t
      FROM numbers({commits // every}))
SETTINGS insert_deduplicate = 0
"""


def fill(client: Any, pipeline: str, commits: int) -> float:
    started = time.monotonic()
    base_ms = int((time.time() - commits - 3600) * 1000)
    for first in range(1, commits + 1, CHUNK):
        client.command(fill_sql(pipeline, first, min(CHUNK, commits + 1 - first), base_ms))
    return time.monotonic() - started


def add_checkpoints(client: Any, pipeline: str, commits: int) -> None:
    """What ``ledger_checkpoint_every = 1000`` would have left in a ledger the new code wrote."""
    base_ms = int(
        client.command(
            f"SELECT toUnixTimestamp64Milli(min(event_time)) - 1000 FROM {ledger.qualified(DATABASE)} "
            f"WHERE pipeline = '{pipeline}' AND event = 'STARTED'"
        )
    )
    client.command(checkpoints_sql(pipeline, commits, 1000, base_ms))


def take_over(store: LedgerStore, epoch: int) -> None:
    """The ledger calls of ``coordinator.takeover.take_over`` (steps 2-4, one stage table found)."""
    head_seq, _ = store.head()
    assert store.seal(epoch, "bench", head_seq), "the benchmark's seal lost its slot"
    store.after_won_slot(head_seq + 1, epoch=epoch, coordinator="bench", seal=True)
    seal = store.commit_at(head_seq + 1)
    assert seal is not None
    store.append(
        LedgerRow(
            pipeline=store.pipeline,
            txn=seal.txn,
            event=LedgerEvent.PUBLISHED,
            epoch=epoch,
            commit_seq=seal.commit_seq,
            coordinator="bench",
        )
    )
    store.committed_unpublished()
    store.txn(naming.txn_id(1, max(1, head_seq - 1)))


def status_reads(store: LedgerHistory) -> None:
    """The ledger reads of ``chtxn status`` (main's: the last abort by ``history(1, "ABORTED")``)."""
    store.head()
    store.max_epoch()
    store.history(limit=1)
    if isinstance(store, OldLedgerStore):
        store.history(limit=1, state="ABORTED")
    else:
        store.last_abort()


def timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def cli(checkout: Path, python: str, config: Path, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.monotonic()
    done = subprocess.run(
        [python, "-m", "cli", *args, "--config", str(config), "--json"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    if done.returncode not in (0, 1) or not done.stdout.strip():
        raise RuntimeError(f"chtxn {' '.join(args)} from {checkout} failed: {done.stderr[-2000:]}")
    return elapsed


def config_file(directory: Path, pipeline: str, bootstrap: str, clickhouse_url: str) -> Path:
    path = directory / f"{pipeline}.toml"
    path.write_text(
        f'[pipeline]\nname = "{pipeline}"\ntopics = ["{TOPIC}"]\ncontrol_topic = "{pipeline}.control"\n'
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\n'
        f'[clickhouse]\nurl = "{clickhouse_url}"\ndatabase = "{DATABASE}"\ntarget_table = "events"\n'
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ledger", description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--main",
        type=Path,
        default=None,
        help="a checkout of the code before checkpoints (e.g. `git worktree add /tmp/old 1ba253c`), "
        "to time its CLI processes too; without it only this checkout's are timed",
    )
    args = parser.parse_args(argv)
    from confluent_kafka.admin import AdminClient

    from clients import kafka as kafka_clients
    from embedded.stack import EmbeddedStack

    with tempfile.TemporaryDirectory(prefix="chtxn-bench-ledger-") as tmp:
        stack = EmbeddedStack(Path(tmp))
        try:
            url = stack.start_clickhouse().url
            bootstrap = stack.start_kafka().bootstrap
            kafka_clients.create_topics(
                AdminClient({"bootstrap.servers": bootstrap}), {TOPIC: 64, "big.control": 1, "small.control": 1}
            )
            make_client(ClickHouseSection(url=url)).command(f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`")
            client = make_client(ClickHouseSection(url=url, database=DATABASE, target_table="events"))
            LedgerStore(client, DATABASE, "big").ensure_tables()
            fill_s = fill(client, "big", args.commits)
            fill(client, "small", 10)
            print(f"filled {args.commits:,} commits ({3 * args.commits:,} rows) in {fill_s:.1f} s", file=sys.stderr)
            results = measure(args, client, Path(tmp), bootstrap, url)
        finally:
            stack.stop()
    print(table(results, args.commits))
    return 0


def measure(args: argparse.Namespace, client: Any, tmp: Path, bootstrap: str, url: str) -> dict[str, dict[str, float]]:
    runs = args.runs
    results: dict[str, dict[str, float]] = {}

    def median(values: list[float]) -> float:
        return statistics.median(values)

    for pipeline in ("big", "small"):
        old = OldLedgerStore(client, DATABASE, pipeline)
        new = LedgerHistory(client, DATABASE, pipeline)
        epochs = iter(range(2, 1000))
        row = results.setdefault(pipeline, {})
        row["take-over old"] = median([timed(lambda: take_over(old, next(epochs))) for _ in range(runs)])  # noqa: B023 -- run at once
        before = old.head()
        row["take-over new, first (writes the first checkpoint)"] = timed(lambda: take_over(new, next(epochs)))  # noqa: B023 -- run at once
        add_checkpoints(client, pipeline, args.commits if pipeline == "big" else 10)
        after = new.head()
        if (after[0], {(tp.topic, tp.partition): end for tp, end in after[1].items()}) != (before[0] + 1, before[1]):
            raise RuntimeError(f"{pipeline}: the head read from checkpoints {after} is not the chain's {before}")
        row["take-over new"] = median([timed(lambda: take_over(new, next(epochs))) for _ in range(runs)])  # noqa: B023 -- run at once
        for name, store in (("old", old), ("new", new)):
            row[f"status ledger reads {name} (in-process)"] = median(
                [
                    timed(lambda: status_reads(store))  # noqa: B023 -- run at once
                    for _ in range(runs)
                ]
            )
            row[f"txn list ledger reads {name} (in-process)"] = median(
                [
                    timed(lambda: store.history(limit=20))  # noqa: B023 -- run at once
                    for _ in range(runs)
                ]
            )
        config = config_file(tmp, pipeline, bootstrap, url)
        python = sys.executable
        for name, checkout in ((("old", args.main),) if args.main else ()) + (("new", REPO),):
            row[f"chtxn status --json {name} (process)"] = median(
                [cli(checkout, python, config, "status") for _ in range(runs)]
            )
            row[f"chtxn txn list --json {name} (process)"] = median(
                [cli(checkout, python, config, "txn", "list") for _ in range(runs)]
            )
        head = LedgerStore(client, DATABASE, pipeline).head()
        print(f"{pipeline}: head slot {head[0]}, {len(head[1])} partitions", file=sys.stderr)
    return results


def table(results: dict[str, dict[str, float]], commits: int) -> str:
    keys = list(next(iter(results.values())))
    lines = [
        f"| measurement (s, median) | {commits:,} commits | 10 commits |",
        "|---|---:|---:|",
    ]
    for key in keys:
        lines.append(f"| {key} | {results['big'][key]:.3f} | {results['small'][key]:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
