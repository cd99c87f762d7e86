"""``chtxn doctor``: a preflight against the live ClickHouse server and Kafka broker that says, check by
check, whether exactly-once holds there and what to change.

The facts come from ``coordinator.doctor``, the verdicts from ``protocol.doctor.rules`` (over the shards
of ``clickhouse.shards``: ``protocol.doctor.shards``). Exit code 0 when no check failed (warnings do not
fail), 1 when one did, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor

import msgspec
from rich.markup import escape

from cli.broker_timeout import add_broker_timeout_option
from cli.config_option import add_config_option, learnt
from cli.output import Column, Output, Sheet, Styled, add_format_option
from cli.txn import open_ledger
from coordinator.doctor import clickhouse_facts, for_shards, kafka_facts
from coordinator.offsets import partition_logs
from protocol import chcodes
from protocol.checks import Check
from protocol.config.parse import PipelineConfig, load_config
from protocol.doctor.facts import Report
from protocol.doctor.rules import clickhouse_checks, failed, kafka_checks
from protocol.doctor.shards import sharded_checks
from protocol.errors import ChtxnError, SetupError
from protocol.offsets.partition_logs import stops_check
from protocol.tables import distributed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the live ClickHouse server and Kafka broker: does exactly-once hold there, and what to change",
        description="A preflight, read-only but for two probes that leave nothing behind (a KeeperMap table "
        "on a path of its own, and an aborted Kafka transaction). Checks: the server version; the target "
        "table's engine family and replication (system.replicas); the macros of a replicated target; the "
        "deduplication windows of the ledger, the stage tables and the target; the commit point; Keeper (a "
        'KeeperMap probe with ledger.commit_point = "keeper" or a replicated target); insert_quorum and '
        "select_sequential_consistency; async_insert; materialized views against transaction.publish_mode; "
        "the metadata columns chtxn verify --deep needs, against clickhouse.input_format; the control and "
        "source topics; the broker's transactions, which dead letters are published in; partitions stopped because their "
        "log no longer matches the ledger (a topic deleted and created again), with why and how to decide "
        "where they go on. With clickhouse.shards, the server and target checks are made on every shard "
        "(one row where the shards agree, else a row naming each shard), the ledger's on clickhouse.url, and "
        "shard tables compares the target's columns and types, sorting key and partition key across the "
        "shards. Each row says ok, "
        "warn or fail, what was found and what to do; what the coordinator, the participants and chtxn init "
        "refuse of the target fails its row with the line they print as the fix. Exit code 0 when no check "
        "failed (warnings do not fail), 1 when one did.",
        epilog="Examples:\n  chtxn doctor --config pipeline.toml\n  chtxn doctor --config pipeline.toml --format tsv\n"
        "  chtxn doctor --config pipeline.toml --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    add_broker_timeout_option(parser)
    add_format_option(parser, rows="one line per check (the verdict on stderr)")
    parser.set_defaults(func=run)


#: The columns of ``doctor``'s table.
COLUMNS = (
    Column("check", "check"),
    Column("result", "result"),
    Column("found", "found", fold=30),
    Column("what to do", "fix", fold=30),
)
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


def _partition_logs(cfg: PipelineConfig) -> Check:
    """Whether a partition is stopped because its log no longer matches the ledger, and what to do."""
    try:
        return stops_check(partition_logs.stops(open_ledger(cfg, retries=1)))
    except ChtxnError as exc:  # no ledger yet, or ClickHouse unreachable (the checks above say which)
        if getattr(exc, "code", 0) == chcodes.UNKNOWN_TABLE:
            return Check(name="partition logs", status="warn", found="no ledger yet", fix="run chtxn init")
        return Check(name="partition logs", status="warn", found=f"could not read the ledger: {exc}")


def run(args: argparse.Namespace) -> int:
    given = load_config(args.config, os.environ)
    cfg, unlearnt = learnt(given, timeout_s=args.timeout)  # a server that does not answer fails its own rows
    problem = str(unlearnt) if isinstance(unlearnt, SetupError) else ""
    checks: list[Check] = [c for c in [distributed.learnt_check(given, cfg, problem)] if c is not None]
    # The servers are probed at once, each probe bounded: a server that is down costs its timeout, once.
    ones = [cfg.for_table(target) if cfg.route else cfg for target in cfg.tables]  # [[route]]: per table
    servers = 1 + len(cfg.clickhouse.shards)  # the ledger's, and every shard's
    with ThreadPoolExecutor(max_workers=len(ones) * servers + 1, thread_name_prefix="doctor") as pool:
        kafka = pool.submit(kafka_facts, cfg, args.timeout)
        facts = [
            (
                one,
                pool.submit(clickhouse_facts, one),
                [pool.submit(clickhouse_facts, s, keeper=False) for s in for_shards(one)],
            )
            for one in ones
        ]
        for one, found, shards in facts:  # each table's checks, those another table made already once
            made = (
                sharded_checks(one, found.result(), [s.result() for s in shards])
                if shards
                else clickhouse_checks(one, found.result())
            )
            checks += [c for c in made if c not in checks]
        checks += kafka_checks(cfg, kafka.result())
    checks.append(_partition_logs(cfg))
    report = Report(pipeline=cfg.name, ok=not failed(checks), checks=tuple(checks))
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
        return 0 if report.ok else 1
    out = Output(args.format)
    table = Sheet(f"chtxn doctor: pipeline {cfg.name}", COLUMNS)
    for c in checks:
        table.add(c.name, Styled(c.status, _STYLES[c.status]), c.found, c.fix or "-")
    out.sheet(table)
    warnings = sum(c.status == "warn" for c in checks)
    if report.ok:
        out.note(f"[green]exactly-once: no check failed[/] ({warnings} warning{'s' if warnings != 1 else ''})")
    else:
        names = ", ".join(escape(c.name) for c in failed(checks))
        out.note(f"[red]exactly-once: {len(failed(checks))} check(s) failed: {names}[/]")
    return 0 if report.ok else 1
