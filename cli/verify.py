"""``chtxn verify``: audit the ledger's commit chain, and with ``--deep`` the target table itself."""

from __future__ import annotations

import argparse
import os

import msgspec
from rich.console import Console
from rich.table import Table

from cli.txn import open_ledger
from clients.clickhouse import make_client
from coordinator.verify import dead_letter_offsets, verify_deep
from protocol.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check exactly-once: the commit chain, and with --deep every offset in the target",
        description="Without --deep: per partition, consecutive commits in the ledger must neither overlap, "
        "go backward nor leave a gap, and every checkpoint must agree with the chain; once the first commits "
        "have expired (coordinator.ledger_retention_days), the chain is checked from the oldest checkpoint left. "
        "With --deep (needs the target's _topic, _partition, _offset columns): "
        "the target holds every committed offset exactly once, less those sent to the dead-letter topic, "
        "and nothing else. Exit code 0 when sound, 1 otherwise.",
        epilog="Example: chtxn verify --config pipeline.toml --deep --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="pipeline TOML file")
    parser.add_argument("--deep", action="store_true", help="also check every offset in the target table")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    ledger = open_ledger(cfg)
    anomalies = ledger.audit()
    report = None
    if args.deep:
        start, commits, _ = ledger.retained_chain()
        report = verify_deep(
            make_client(cfg.clickhouse),
            cfg.clickhouse.database,
            cfg.clickhouse.target_table,
            commits,
            dead_letter_offsets(cfg),
            anomalies,
            checked_from={r.tp: r.end for r in start.ranges} if start else None,
        )
        anomalies = list(report.anomalies)
    ok = not anomalies
    if args.json:
        print(msgspec.json.encode({"ok": ok, "anomalies": anomalies, "deep": report}).decode())
        return 0 if ok else 1
    console = Console()
    if report is not None:
        table = Table(title=f"exactly-once check of {cfg.clickhouse.database}.{cfg.clickhouse.target_table}")
        for column in ("partition", "committed", "expected", "rows", "duplicates", "outside", "dead letters", "ok"):
            table.add_column(column, justify="right" if column not in ("partition", "committed") else "left")
        for c in report.partitions:
            table.add_row(
                f"{c.topic}-{c.partition}",
                f"[{c.committed_from}, {c.committed_to})",
                str(c.expected_rows),
                str(c.rows),
                str(c.duplicates),
                str(c.outside),
                str(c.dead_letters),
                "[green]yes[/]" if c.ok else "[red]NO[/]",
            )
        console.print(table)
    for anomaly in anomalies:
        console.print(f"[red]anomaly:[/] {anomaly}")
    console.print("[green]exactly-once: OK[/]" if ok else f"[red]exactly-once: FAILED ({len(anomalies)} anomalies)[/]")
    return 0 if ok else 1
