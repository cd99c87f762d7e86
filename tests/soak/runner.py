"""One soak: a live pipeline under a seeded series of faults, then a drain and the exactly-once checks.

Steps:

1. Build a pipeline (``tests.pipelines.make_pipeline``) whose processes reach ClickHouse through a
   ``TcpProxy``; every check reads ClickHouse directly. Start two coordinator replicas, the
   participant job, and the producers. Wait for the first commit with rows (warm-up): the
   duration counts from there.
2. Fault phase, for ``duration_s``: for each planned fault in order, wait its quiet time, wait
   until the pipeline is whole (both replicas, a leader, task workers), inject it, and wait until
   it has recovered (everything acknowledged before the fault ended is committed). A fault whose
   window would end after the duration is not injected; the producers run to the end.
3. Drain: stop the producers and every fault, then wait until every offset up to each partition's
   log end (read to EOF) is committed and every committed txn is published.
4. Check: the oracle (``Pipeline.oracle`` with the dead-letter offsets), ``chtxn verify --deep
   --json``, and dead-letter routing (every good record in the target, every bad one dead-lettered).
   With ``changes`` (the operator's changes among the faults, ``tests.soak.changes``), offsets no
   longer name one record (a topic re-created starts again at 0), so the oracle is the records' own
   ids instead (``tests.soak.ids``), and routing is checked against chtxn's record of its letters.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka.admin import AdminClient

from protocol.messages import TopicPartition
from tests.faults.proxied import Addresses, direct, via
from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import create_topic, unique_name, wait_until
from tests.pipelines import TARGET_DDL, Pipeline, make_pipeline
from tests.soak.changes import OTHER_TABLE
from tests.soak.cluster import COORDINATORS, REPO, Cluster
from tests.soak.faults import FaultRecord, Injector, NotReady
from tests.soak.ids import check_ids, check_letters
from tests.soak.report import SoakResult, recovery_times, stuck_spells
from tests.soak.schedule import draw_schedule
from tests.soak.traffic import Traffic, log_end

SETTINGS = {"transaction.interval_s": 0.5, "participant.chunk_rows": 2_000}
WARMUP_TIMEOUT_S = 300.0
DEAD_LETTERS_TIMEOUT_S = 30.0
#: Fresh consumers tried, 30 s each, to read the source partitions' ends at the drain.
LOG_END_ATTEMPTS = 4


def git_commit() -> str:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return (head or "unknown") + ("-dirty" if dirty else "")


def run_soak(
    stack: Any,
    workdir: Path,
    *,
    seed: int,
    duration_s: float,
    partitions: int = 2,
    rate: float = 200.0,
    stuck_after_s: float = 60.0,
    recovery_timeout_s: float = 90.0,
    drain_timeout_s: float = 240.0,
    commit_point: str = "token",
    changes: bool = False,
    only: tuple[str, ...] = (),
) -> SoakResult:
    """Run one soak on ``stack`` (anything with ``kafka_bootstrap``, ``clickhouse_url``,
    ``clickhouse_host``, ``clickhouse_port``; with ``changes``, a ``keeper`` too); logs and the
    config go under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    schedule = draw_schedule(seed, duration_s, keeper=commit_point == "keeper", changes=changes, only=only)
    name = unique_name(f"soak{seed}")
    side = f"{name}_side"  # a change soak's quiet second topic
    settings: dict[str, Any] = {**SETTINGS, "ledger.commit_point": commit_point}
    if changes:
        settings["pipeline.topics"] = [f"{name}_events", side]
    with TcpProxy(stack.clickhouse_host, stack.clickhouse_port, lifetime_s=duration_s + 7200) as proxy:
        pipeline = make_pipeline(
            Addresses(stack.kafka_bootstrap, via(stack.clickhouse_url, proxy)),
            workdir,
            name,
            partitions=partitions,
            settings=settings,
        )
        check = direct(pipeline, stack.clickhouse_url)
        if changes:
            create_topic(AdminClient({"bootstrap.servers": stack.kafka_bootstrap}), side, 1)
            db = f"`{check.cfg.clickhouse.database}`"
            check.client().command(TARGET_DDL.format(db=db, table=f"`{OTHER_TABLE}`"))
        ledger = check.ledger()
        result = SoakResult(
            seed=seed,
            duration_s=duration_s,
            git_commit=git_commit(),
            pipeline=pipeline.cfg.name,
            logs=str(workdir / "logs"),
            schedule=schedule,
            commit_point=commit_point,
            changes=changes,
        )
        cluster = Cluster(pipeline.config_path, workdir / "logs", slots=partitions + (1 if changes else 0))
        traffic = Traffic(stack.kafka_bootstrap, pipeline.topic, partitions, rate)
        injector = Injector(cluster, traffic, proxy, check, ledger, stack)
        if changes:
            injector.setup_changes(side, stack.clickhouse_url, commit_point)
        try:
            for name in COORDINATORS:
                cluster.start_coordinator(name)
            cluster.start_participant()
            traffic.start()
            result.started_at = time.time()
            try:
                wait_until(
                    lambda: cluster.supervise() or any(ledger.head()[1].values()),
                    WARMUP_TIMEOUT_S,
                    "the first commit with rows",
                    interval_s=0.5,
                )
            except AssertionError as exc:
                result.stuck.append(f"warm-up: {exc}")
            else:
                result.started_at = time.time()
                try:
                    _faults(result, injector, schedule, duration_s, recovery_timeout_s)
                except NotReady as exc:
                    result.stuck.append(f"the pipeline did not become whole again: {exc}")
                except Exception:  # a harness error still gets a drain and the checks
                    result.errors.append("harness error in the fault phase:\n" + traceback.format_exc())
                    print(result.errors[-1], flush=True)
            _drain(result, cluster, traffic, proxy, check, drain_timeout_s)
            ended = time.time()
            _check(result, check, traffic, stack.clickhouse_url, injector if changes else None)
            commits = ledger.commits()
            recovery_times(result.faults, commits, pipeline.topic)
            result.stuck += stuck_spells(commits, result.faults, result.started_at, ended, stuck_after_s)
            result.txns = _txns(check, commits)
        finally:
            traffic.close()
            cluster.stop_all()
            result.exits = [{k: v for k, v in e.items()} for e in cluster.exits]
    return result


def _faults(
    result: SoakResult, injector: Injector, schedule: list, duration_s: float, recovery_timeout_s: float
) -> None:
    end = time.monotonic() + duration_s
    ledger = injector.ledger
    for plan in schedule:
        injector.hold(plan.quiet_s)
        injector.wait_whole()
        if time.monotonic() + plan.hold_s >= end:
            result.next_fault = plan
            break
        record = injector.inject(plan)
        result.faults.append(record)
        print(  # progress: a soak runs for minutes
            f"[+{time.time() - result.started_at:6.1f}s] {plan.describe()}: {record.target} "
            f"({record.ended - record.started:.1f}s) {record.detail[:160]}",
            flush=True,
        )
        if not _recovered(record, injector, ledger, recovery_timeout_s):
            result.stuck.append(
                f"fault {record.plan.describe()}: not recovered within {recovery_timeout_s:g}s "
                f"(acknowledged {record.acked_at_end}, committed {_heads(ledger, injector.check.topic)})"
            )
            return
    injector.hold(max(0.0, end - time.monotonic()))


def _heads(ledger, topic: str) -> dict[int, int]:  # LedgerStore
    return {tp.partition: end for tp, end in ledger.head()[1].items() if tp.topic == topic}


def _recovered(record: FaultRecord, injector: Injector, ledger, timeout_s: float) -> bool:
    target = record.acked_at_end

    def covered() -> bool:
        injector.cluster.supervise()
        heads = _heads(ledger, injector.check.topic)
        return all(heads.get(p, 0) >= end for p, end in target.items())

    try:
        wait_until(covered, timeout_s, "recovery", interval_s=0.2)
    except AssertionError:
        return False
    record.recovered_at = time.time()
    return True


def _drain(
    result: SoakResult, cluster: Cluster, traffic: Traffic, proxy: TcpProxy, check: Pipeline, timeout_s: float
) -> None:
    started = time.monotonic()
    traffic.stop()
    proxy.restore()
    for name in list(cluster.held):
        if cluster.alive(name):
            cluster.resume(name)  # SIGCONT: a no-op unless it was stopped
        cluster.held.discard(name)
    cluster.supervise()
    ends = traffic.acked_ends()
    for attempt in range(LOG_END_ATTEMPTS):  # a consumer of a topic just created again may see nothing at first
        try:
            ends = log_end(check.cfg.kafka.bootstrap_servers, check.topic, len(check.partitions), ends)
            break
        except TimeoutError as exc:
            if attempt == LOG_END_ATTEMPTS - 1:
                result.errors.append(f"the log ends could not be read (the acknowledged ends stand): {exc}")
    ledger = check.ledger()
    behind: dict[int, int] = {}

    def drained() -> bool:
        cluster.supervise()
        heads = _heads(ledger, check.topic)
        behind.clear()
        behind.update({p: max(0, end - heads.get(p, 0)) for p, end in ends.items()})
        return not any(behind.values()) and not ledger.committed_unpublished()

    try:
        wait_until(drained, timeout_s, "every produced offset committed and published", interval_s=0.5)
    except AssertionError as exc:
        result.stuck.append(f"drain did not finish: {exc}")
    result.drain = {
        "seconds": round(time.monotonic() - started, 1),
        "log_end": ends,
        "uncommitted": {str(p): n for p, n in behind.items()},
        "stage_tables_open": check.stage_tables(),
    }  # the open txn's included
    result.produced = traffic.counts()
    if traffic.failed:
        result.errors.append(f"{len(traffic.failed)} records not delivered: {traffic.failed[:3]}")


def _check(
    result: SoakResult, check: Pipeline, traffic: Traffic, clickhouse_url: str, changed: Injector | None
) -> None:
    ledger = check.ledger()
    commits = ledger.commits()
    if changed is not None:
        result.errors += changed.violations
        database = check.cfg.clickhouse.database
        result.oracle = check_ids(check.client(), database, traffic, changed.changes)
        committed = {c.txn for c in commits}
        result.routing = check_letters(check.client(), database, check.cfg.name, committed, traffic, changed.changes)
        result.verify = _verify(check, clickhouse_url)
        return
    expected_dead = sum(c.dead_letters for c in commits)
    ranges: dict[TopicPartition, list[tuple[int, int]]] = {}
    for c in commits:
        for r in c.ranges:
            ranges.setdefault(r.tp, []).append((r.start, r.end))
    dead: dict[TopicPartition, set[int]] = {}

    def dead_letters_read() -> bool:  # the dead-letter topic's high watermark may lag too
        dead.clear()
        dead.update(check.dead_letter_offsets())
        inside = sum(1 for tp, offs in dead.items() for o in offs if any(s <= o < e for s, e in ranges.get(tp, ())))
        return inside >= expected_dead

    try:
        wait_until(dead_letters_read, DEAD_LETTERS_TIMEOUT_S, f"{expected_dead} dead letters readable", interval_s=1)
    except AssertionError as exc:
        result.errors.append(f"dead letters: {exc}")
    report = check.oracle(dead)
    result.oracle = msgspec.to_builtins(report)
    result.verify = _verify(check, clickhouse_url)

    dead_by_p = {tp.partition: offs for tp, offs in dead.items() if tp.topic == check.topic}
    good_dead = {p: sorted(traffic.good[p] & dead_by_p.get(p, set())) for p in traffic.good}
    bad_alive = {p: sorted(traffic.bad[p] - dead_by_p.get(p, set())) for p in traffic.bad}
    result.routing = {
        "dead_lettered": sum(len(v) for v in dead_by_p.values()),
        "bad_produced": sum(len(v) for v in traffic.bad.values()),
        "good_dead_lettered": sum(len(v) for v in good_dead.values()),
        "bad_not_dead_lettered": sum(len(v) for v in bad_alive.values()),
        "examples": {
            "good_dead_lettered": {p: v[:10] for p, v in good_dead.items() if v},
            "bad_not_dead_lettered": {p: v[:10] for p, v in bad_alive.items() if v},
        },
    }


def _verify(check: Pipeline, clickhouse_url: str) -> dict[str, Any]:
    """``chtxn verify --deep --json`` of the pipeline, as an operator runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHTXN_CLICKHOUSE_URL": clickhouse_url}
    verify = subprocess.run(
        [sys.executable, "-m", "cli", "verify", "--config", str(check.config_path), "--deep", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        out = json.loads(verify.stdout)
    except json.JSONDecodeError:
        out = {
            "ok": False,
            "anomalies": [
                f"no JSON from chtxn verify (exit {verify.returncode}): {verify.stdout[-500:]} {verify.stderr[-1500:]}"
            ],
        }
    return {
        "ok": verify.returncode == 0 and bool(out.get("ok")),
        "exit_code": verify.returncode,
        "outcome": out.get("outcome"),
        "anomalies": out.get("anomalies", []),
    }


def _txns(check: Pipeline, commits: list) -> dict[str, Any]:
    ch = check.cfg.clickhouse
    rows = (
        check.client()
        .query(
            f"SELECT txn, reason FROM `{ch.database}`.`chtxn_ledger` WHERE pipeline = {{p:String}} AND event = 'ABORTED'",
            parameters={"p": check.cfg.name},
        )
        .result_rows
    )
    reasons = Counter(re.sub(r"\d+", "N", reason)[:100] for _, reason in rows)
    return {
        "committed": len(commits),
        "with_rows": sum(1 for c in commits if c.total_rows > 0),
        "seals": sum(1 for c in commits if not c.stage_table and not c.ranges),
        "aborted": len({txn for txn, _ in rows}),
        "abort_reasons": dict(reasons.most_common(12)),
    }
