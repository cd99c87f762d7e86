"""``chtxn verify``: audit the ledger's commit chain, and with ``--deep`` the target table itself."""

from __future__ import annotations

import argparse
import os

import msgspec
from rich.markup import escape

from cli.output import Column, Output, Sheet, Styled, add_format_option
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
        epilog="Examples:\n  chtxn verify --config pipeline.toml --deep\n"
        "  chtxn verify --config pipeline.toml --deep --format tsv\n  chtxn verify --config pipeline.toml --deep --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="pipeline TOML file")
    parser.add_argument("--deep", action="store_true", help="also check every offset in the target table")
    add_format_option(parser, rows="one line per partition with --deep, else one per anomaly (the verdict on stderr)")
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
    if args.format == "json":
        print(msgspec.json.encode({"ok": ok, "anomalies": anomalies, "deep": report}).decode())
        return 0 if ok else 1
    out = Output(args.format)
    noted = anomalies
    if report is not None:
        table = Sheet(f"exactly-once check of {cfg.clickhouse.database}.{cfg.clickhouse.target_table}", CHECK_COLUMNS)
        for c in report.partitions:
            table.add(
                c.topic,
                str(c.partition),
                str(c.committed_from),
                str(c.committed_to),
                str(c.expected_rows),
                str(c.rows),
                str(c.distinct_offsets),
                str(c.duplicates),
                str(c.outside),
                str(c.dead_letters),
                Styled("yes", "green") if c.ok else Styled("NO", "red"),
            )
        out.sheet(table)
    elif args.format == "tsv":
        listed = Sheet("", [Column("anomaly", "anomaly")])
        for anomaly in anomalies:
            listed.add(anomaly)
        out.sheet(listed)
        noted = []  # listed on stdout
    for anomaly in noted:
        out.note(f"[red]anomaly:[/] {escape(anomaly)}")
    out.note("[green]exactly-once: OK[/]" if ok else f"[red]exactly-once: FAILED ({len(anomalies)} anomalies)[/]")
    return 0 if ok else 1


#: The columns of ``verify --deep``'s table: committed offsets are [from, to).
CHECK_COLUMNS = (
    Column("topic", "topic"),
    Column("partition", "partition", right=True),
    Column("committed from", "committed_from", right=True),
    Column("committed to", "committed_to", right=True),
    Column("expected", "expected_rows", right=True),
    Column("rows", "rows", right=True),
    Column("distinct offsets", "distinct_offsets", right=True, wide=True),
    Column("duplicates", "duplicates", right=True),
    Column("outside", "outside", right=True),
    Column("dead letters", "dead_letters", right=True),
    Column("ok", "ok"),
)
