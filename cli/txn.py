"""``chtxn txn list`` and ``chtxn txn show``: read transactions from the ledger.

Read-only. People get rich tables; scripts get ``--json`` (times in unix seconds, durations
in milliseconds, null when unknown).
"""

from __future__ import annotations

import argparse
import os
from datetime import datetime, timezone

import msgspec
from rich.console import Console
from rich.table import Table

from clients.clickhouse import make_client
from coordinator.ledger_history import LedgerHistory
from protocol import ledger
from protocol.chcodes import UNKNOWN_TABLE
from protocol.config import PipelineConfig, load_config
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger_view import TxnSummary


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "txn",
        help="list transactions, or show one, from the ledger",
        description="Inspect the ledger: transactions with their state, epoch, rows, per-partition "
        "offsets, durations and abort reasons.",
        epilog="Examples:\n  chtxn txn list --config pipeline.toml --limit 50 --state ABORTED\n"
        "  chtxn txn show e3_t17 --config pipeline.toml --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="txn_command", metavar="SUBCOMMAND", required=True)

    lister = commands.add_parser(
        "list",
        help="the latest transactions, newest first",
        description="The latest transactions of the pipeline, newest first.",
        epilog="Example: chtxn txn list --config pipeline.toml --limit 50 --state ABORTED --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    lister.add_argument("--config", required=True, help="pipeline TOML file")
    lister.add_argument("--limit", type=int, default=20, help="how many transactions (default 20)")
    lister.add_argument(
        "--state", type=str.upper, choices=ledger.STATE_PRECEDENCE, help="only transactions in this state"
    )
    lister.add_argument("--json", action="store_true", help="print JSON instead of a table")
    lister.set_defaults(func=run_list)

    shower = commands.add_parser(
        "show",
        help="one transaction in full",
        description="Everything the ledger holds of one transaction: state, epoch, commit slot, "
        "offsets and rows per partition, durations, abort reason.",
        epilog="Example: chtxn txn show e3_t17 --config pipeline.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shower.add_argument("txn", metavar="TXN", help="transaction id, e.g. e3_t17")
    shower.add_argument("--config", required=True, help="pipeline TOML file")
    shower.add_argument("--json", action="store_true", help="print JSON instead of tables")
    shower.set_defaults(func=run_show)


def open_ledger(cfg: PipelineConfig, retries: int = 3) -> LedgerHistory:
    """The ledger of ``cfg``'s pipeline, with few retries (a person is waiting)."""
    return LedgerHistory(make_client(cfg.clickhouse), cfg.clickhouse.database, cfg.name, retries=retries)


def _missing_ledger(exc: ClickHouseError, cfg: PipelineConfig, config_path: str) -> SetupError | ClickHouseError:
    if exc.code == UNKNOWN_TABLE:
        return SetupError(
            f"the ledger table {cfg.clickhouse.database}.{ledger.TABLE} does not exist: "
            f"run chtxn init --config {config_path}"
        )
    return exc


def run_list(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    try:
        summaries = open_ledger(cfg).history(limit=args.limit, state=args.state)
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, args.config) from None
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(summaries)).decode())
        return 0
    console = Console()
    if not summaries:
        console.print(
            f"no transactions in the ledger of pipeline {cfg.name}" + (f" in state {args.state}" if args.state else "")
        )
        return 0
    table = Table(title=f"transactions of {cfg.name}, newest first")
    for column in (
        "txn",
        "state",
        "epoch",
        "slot",
        "rows",
        "partitions",
        "dead letters",
        "started (UTC)",
        "consume ms",
        "commit ms",
        "publish ms",
        "reason",
    ):
        table.add_column(column, justify="right" if column.endswith(("ms", "rows", "epoch", "slot")) else "left")
    for s in summaries:
        table.add_row(
            s.txn,
            _state(s.state),
            str(s.epoch),
            str(s.commit_seq or ""),
            str(s.total_rows),
            str(len(s.ranges)),
            str(s.dead_letters or ""),
            _time(s.started_at),
            _num(s.consume_ms),
            _num(s.commit_ms),
            _num(s.publish_ms),
            s.reason,
        )
    console.print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    try:
        summary = open_ledger(cfg).txn(args.txn)
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, args.config) from None
    if summary is None:
        raise SetupError(f"no ledger rows for txn {args.txn!r} in pipeline {cfg.name}: list txns with chtxn txn list")
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(summary)).decode())
        return 0
    _print_summary(Console(), summary)
    return 0


def _print_summary(console: Console, s: TxnSummary) -> None:
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    for name, value in (
        ("txn", s.txn),
        ("state", _state(s.state)),
        ("epoch", str(s.epoch)),
        ("commit slot", str(s.commit_seq or "-")),
        ("coordinator", s.coordinator),
        ("target", s.target),
        ("stage table", s.stage_table),
        ("rows", str(s.total_rows)),
        ("bytes", str(s.total_bytes)),
        ("dead letters", str(s.dead_letters)),
        ("started", _time(s.started_at)),
        ("ended", _time(s.ended_at)),
        ("committed", _time(s.committed_at)),
        ("published", _time(s.published_at)),
        ("aborted", _time(s.aborted_at)),
        ("consume", _ms(s.consume_ms)),
        ("commit", _ms(s.commit_ms)),
        ("publish", _ms(s.publish_ms)),
        ("total", _ms(s.total_ms)),
        ("reason", s.reason or "-"),
        ("events", " -> ".join(s.events)),
    ):
        facts.add_row(name, value)
    console.print(facts)
    if s.ranges:
        parts = Table(title="partitions (offsets are next-to-read)")
        for column in ("topic", "partition", "start", "end", "records", "rows staged"):
            parts.add_column(column, justify="left" if column == "topic" else "right")
        for r in s.ranges:
            parts.add_row(
                r.topic, str(r.partition), str(r.start), str(r.end), str(max(0, r.end - r.start)), str(r.rows)
            )
        console.print(parts)
    for gap in s.gaps:
        console.print(
            f"[yellow]gap[/]: {gap.topic}/{gap.partition} offsets {gap.start}..{gap.end - 1} were gone and skipped"
        )


def _state(state: str) -> str:
    colour = {"PUBLISHED": "green", "COMMITTED": "cyan", "ABORTED": "red"}.get(state, "yellow")
    return f"[{colour}]{state}[/]"


def _time(ts: float) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}".removesuffix(".0")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{_num(value)} ms"
