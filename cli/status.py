"""``chtxn status``: the pipeline at a glance — coordinators, last commit and rate, checks, lag.

What it finds is ``cli.status_report.collect``'s; this module is the command and how it prints.
"""

from __future__ import annotations

import argparse
import os

import msgspec
from rich.markup import escape

from cli import status_report
from cli.broker_timeout import add_broker_timeout_option
from cli.config_option import add_config_option, learnt
from cli.output import Column, Output, Sheet, Styled, add_format_option
from protocol.config.parse import load_config
from protocol.errors import SetupError
from protocol.status import health as pipeline_health
from protocol.status.health import Replica
from protocol.status.shards import ShardStatus
from protocol.status.standbys import STANDBY


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="the pipeline at a glance: coordinators, last commit and rate, checks, lag",
        description="Reads the ledger (epochs, the last commits), the tail of the control topic (the leaders', "
        "the standbys' and the participants' heartbeats) and each source partition's log end. Shows every "
        "coordinator replica with its role (leader, standby; left or silent once stopped) and when it was last "
        "heard (each heartbeats every third of coordinator.leader_lease_s), the age of the last commit and the "
        "rows/s of the latest commits, and four checks: leader (one heard within "
        "coordinator.leader_lease_s), participants (every partition held by one heard within the heartbeat "
        "timeout), commits (one within 2 x (idle_interval_s, or interval_s if longer, + write_status_timeout_s)) and routes (no topic that the "
        "routes of several tables match: the leader holds it and reads none of it) and partition logs (no "
        "partition stopped because its log no longer matches the ledger: a topic deleted and created again, "
        "a log that ends before the committed offset). With clickhouse.shards, each shard: whether it "
        "answered (within --timeout), the rows in the target table(s) there and the txns whose stage tables "
        "it holds, and a shards check (every shard answered). Exit code 0 when no check "
        "failed, 1 otherwise; the failed checks are named.",
        epilog="Examples:\n  chtxn status --config pipeline.toml\n  chtxn status --config pipeline.toml --format tsv\n"
        "  chtxn status --config pipeline.toml --json | jq '{leader, epoch: .leader_epoch, failed}'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--rate-commits",
        type=int,
        default=status_report.RATE_COMMITS,
        metavar="N",
        help=f"take rows/s over the latest N commits (default {status_report.RATE_COMMITS})",
    )
    add_broker_timeout_option(parser)
    add_format_option(parser, rows="one line per source partition (the rest on stderr)")
    parser.set_defaults(func=run)


#: The columns of ``status``'s tables.
PARTITION_COLUMNS = (
    Column("topic", "topic"),
    Column("partition", "partition", right=True),
    Column("committed", "committed", right=True),
    Column("log end", "log_end", right=True),
    Column("lag", "lag", right=True),
    Column("participant", "participant"),
    Column("table", "table"),
)
TABLE_COLUMNS = (
    Column("table", "table"),
    Column("partitions", "partitions", right=True),
    Column("lag", "lag", right=True),
    Column("rows/s", "rows_per_s", right=True),
)
REPLICA_COLUMNS = (
    Column("coordinator", "id"),
    Column("role", "role"),
    Column("epoch", "epoch", right=True),
    Column("last heartbeat", "heard_s", right=True),
)
SHARD_COLUMNS = (
    Column("shard", "shard"),
    Column("server", "address"),
    Column("answered", "answered"),
    Column("rows in target", "target_rows", right=True),
    Column("stage tables of", "staged_txns"),
)
CHECK_COLUMNS = (
    Column("check", "check"),
    Column("result", "result"),
    Column("found", "found", fold=30),
    Column("what to do", "fix", fold=30),
)
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}
_ROLE_STYLES = {pipeline_health.LEADER: "green", STANDBY: "cyan"}


def run(args: argparse.Namespace) -> int:
    if args.rate_commits < 2:
        raise SetupError(f"--rate-commits {args.rate_commits}: a rate needs at least 2 commits")
    cfg, _ = learnt(load_config(args.config, os.environ), timeout_s=args.timeout)  # unlearnt: its checks say why
    status = status_report.collect(cfg, args.config, rate_commits=args.rate_commits, timeout_s=args.timeout)
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(status)).decode())
        return 0 if status.healthy else 1
    out = Output(args.format)
    verdict = "[green]healthy[/]" if status.healthy else f"[red]failed: {', '.join(status.failed)}[/]"
    out.note(f"pipeline [bold]{escape(status.pipeline)}[/]: {verdict}")
    leader = f"{escape(status.leader)}, epoch {status.leader_epoch}" if status.leader else "[red]none heard[/]"
    out.note(f"leader: {leader}; highest epoch claimed {status.epoch}")
    if status.paused:
        why = f": {escape(status.paused_reason)}" if status.paused_reason else ""
        out.note(f"[yellow]paused[/] by {escape(status.paused_by)}{why} (chtxn resume starts txns again)")
    out.note(f"last commit: {_commit_line(status)}")
    out.note(f"latest txn: {status.last_txn or '-'} {status.last_txn_state}")
    if status.last_abort_reason:
        out.note(f"last abort: {escape(status.last_abort_reason)}")
    if args.format == "tsv":  # stdout holds the partition table alone; the rest is said on stderr
        for r in status.replicas:
            out.note(f"coordinator {escape(r.id)}: {r.role}, {_led(r)}, {_heard(r)}")
        for c in status.checks:
            out.note(f"check {c.name}: {c.status}: {escape(c.found)}" + (f"; {escape(c.fix)}" if c.fix else ""))
        for s in status.shards:
            out.note(f"{s.shard} ({s.address}): {_shard_line(s)}")
    else:
        replicas = Sheet("coordinators (leaders and standbys heartbeat on the control topic)", REPLICA_COLUMNS)
        for r in status.replicas:
            role = Styled(r.role, _ROLE_STYLES.get(r.role, "yellow"))
            replicas.add(r.id, role, str(r.epoch) if r.epoch else "-", _heard(r))
        if status.replicas:
            out.sheet(replicas)
        checks = Sheet("checks", CHECK_COLUMNS)
        for c in status.checks:
            checks.add(c.name, Styled(c.status, _STYLES[c.status]), c.found, c.fix or "-")
        out.sheet(checks)
        if status.shards:
            shards = Sheet("shards (clickhouse.shards; rows: every writer's, from system.tables)", SHARD_COLUMNS)
            for s in status.shards:
                answered = Styled("no", "red") if s.error else Styled("yes", "green")
                rows = "-" if s.target_rows is None else str(s.target_rows)
                shards.add(s.shard, s.address, answered, rows, _txns(s.staged_txns))
            out.sheet(shards)
        if len(status.tables) > 1:  # [[route]]: each table of the pipeline, its partitions only
            tables = Sheet("target tables (this pipeline's partitions and commits)", TABLE_COLUMNS)
            for t in status.tables:
                lag = "-" if t.lag is None else str(t.lag)
                tables.add(t.table, str(t.partitions), lag, "-" if t.rows_per_s is None else f"{t.rows_per_s:g}")
            out.sheet(tables)
    table = Sheet("source partitions", PARTITION_COLUMNS)
    for p in status.partitions:
        table.add(
            p.topic,
            str(p.partition),
            "-" if p.committed is None else str(p.committed),
            str(p.log_end),
            "-" if p.lag is None else str(p.lag),
            p.participant or Styled("none live", "red"),
            p.table,
        )
    out.sheet(table)
    return 0 if status.healthy else 1


def _commit_line(status: status_report.Status) -> str:
    if not status.last_commit_seq:
        return "none yet"
    line = f"slot {status.last_commit_seq} ({escape(status.last_commit_txn) or '?'})"
    if status.commit_age_s is not None:
        line += f", {status.commit_age_s:g} s ago"
    if status.rows_per_s is not None:
        line += (
            f"; {status.rows_per_s:,.1f} rows/s over the latest {status.rate_commits} commits "
            f"({status.rate_window_s:g} s)"
        )
    return line


def _shard_line(s: ShardStatus) -> str:
    if s.error:
        return f"no answer: {escape(s.error)}"
    return f"{s.target_rows} rows in the target; stage tables of {_txns(s.staged_txns, none='none')}"


def _txns(txns: tuple[str, ...], none: str = "-") -> str:
    """Up to three txn ids, else how many from the first to the last (``--json`` lists them all)."""
    if len(txns) <= 3:
        return ", ".join(txns) or none
    return f"{len(txns)} txns, {txns[0]} .. {txns[-1]}"


def _led(r: Replica) -> str:
    return f"epoch {r.epoch}" if r.epoch else "never led"


def _heard(r: Replica) -> str:
    return "not in the control topic's tail" if r.heard_s is None else f"{r.heard_s:g} s ago"
