"""``chtxn verify``: audit the ledger's commit chain, and with ``--deep`` the target table itself."""

from __future__ import annotations

import argparse
import os

import msgspec
from clickhouse_connect.driver.client import Client
from rich.markup import escape

from cli.config_option import add_config_option
from cli.output import Column, Output, Sheet, Styled, add_format_option
from cli.txn import _missing_ledger, open_ledger
from clients import target_table
from clients.clickhouse import make_client, retrying
from coordinator.verify import DeepReport, merged, verify_pipeline
from protocol.config.parse import load_config
from protocol.errors import ClickHouseError, SetupError
from protocol.verify import check as deep_check


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify",
        help="check exactly-once: the commit chain, and with --deep every offset in the target",
        description="Without --deep: per partition, consecutive commits in the ledger must neither overlap, "
        "go backward nor leave a gap, and every checkpoint must agree with the chain; once the first commits "
        "have expired (coordinator.ledger_retention_days), the chain is checked from the oldest checkpoint left. "
        "With --deep (needs the tables' _topic, _partition, _offset columns): every table the ledger sent rows "
        "to (whatever today's routes say) holds each offset of them as often as committed ranges cover it "
        "(twice after a rewinding reset), less the dead letters chtxn recorded, and no other row of the "
        "pipeline's topics. The outcome per table is OK, FAILED, or EXPIRED: nothing wrong found, but some "
        "evidence is gone (commits past the ledger's retention, dead letters past their TTL). "
        "Exit code 1 when FAILED, else 0.",
        epilog="Examples:\n  chtxn verify --config pipeline.toml --deep\n"
        "  chtxn verify --config pipeline.toml --deep --format tsv\n  chtxn verify --config pipeline.toml --deep --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument("--deep", action="store_true", help="also check every offset in the target table")
    add_format_option(parser, rows="one line per partition with --deep, else one per anomaly (the verdict on stderr)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = target_table.learnt(load_config(args.config, os.environ))
    ledger = open_ledger(cfg)
    report = None
    reports: dict[str, DeepReport] = {}
    client = make_client(cfg.clickhouse)
    for target in cfg.tables if args.deep else ():
        _check_metadata_columns(client, cfg.clickhouse.database, target)
    try:
        if args.deep:
            reports = verify_pipeline(client, cfg, ledger)  # the chain's audit included
            report = merged(reports)
            anomalies = list(report.anomalies)
        else:
            anomalies = ledger.audit()
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, args.config) from None
    ok = not anomalies
    outcome = report.outcome if report is not None else deep_check.outcome(not ok, False)
    if args.format == "json":
        tables = reports if report is not None else None
        print(
            msgspec.json.encode(
                {"ok": ok, "outcome": outcome, "anomalies": anomalies, "deep": report, "tables": tables}
            ).decode()
        )
        return 0 if ok else 1
    out = Output(args.format)
    noted = anomalies
    if report is not None:
        for target, one in reports.items():
            table = Sheet(f"exactly-once check of {cfg.clickhouse.database}.{target}", CHECK_COLUMNS)
            for c in one.partitions:
                table.add(
                    c.topic,
                    str(c.partition),
                    str(c.committed_from),
                    str(c.committed_to),
                    str(c.expected_rows),
                    str(c.rows),
                    str(c.distinct_offsets),
                    str(c.duplicates),
                    str(c.missing),
                    str(c.replayed),
                    str(c.outside),
                    str(c.dead_letters),
                    str(c.unsure),
                    str(c.expired),
                    Styled("yes", "green") if c.ok else Styled("NO", "red"),
                )
            out.sheet(table)
            out.note(f"{escape(target)}: {_styled(one.outcome)}, {escape(one.reason)}")
    elif args.format == "tsv":
        listed = Sheet("", [Column("anomaly", "anomaly")])
        for anomaly in anomalies:
            listed.add(anomaly)
        out.sheet(listed)
        noted = []  # listed on stdout
    for anomaly in noted:
        out.note(f"[red]anomaly:[/] {escape(anomaly)}")
    for gone in report.expired if report is not None else ():
        out.note(f"[yellow]expired:[/] {escape(gone)}")
    if outcome == deep_check.FAILED:
        out.note(f"[red]exactly-once: FAILED ({len(anomalies)} anomalies)[/]")
    elif outcome == deep_check.EXPIRED:
        out.note("[yellow]exactly-once: EXPIRED evidence (nothing wrong in what could be checked)[/]")
    else:
        out.note("[green]exactly-once: OK[/]")
    return 0 if ok else 1


def _styled(outcome: str) -> str:
    color = {deep_check.PASSED: "green", deep_check.FAILED: "red"}.get(outcome, "yellow")
    return f"[{color}]{outcome}[/]"


#: The columns ``--deep`` reads in the target.
METADATA_COLUMNS = ("_topic", "_partition", "_offset")


def _check_metadata_columns(client: Client, database: str, table: str) -> None:
    """Raise ``SetupError`` unless the target exists with the metadata columns ``--deep`` reads."""
    rows = retrying(3, "read the target table's columns")(
        client.query,
        "SELECT name FROM system.columns WHERE database = {d:String} AND table = {t:String}",
        parameters={"d": database, "t": table},
    ).result_rows
    names = {row[0] for row in rows}
    if not names:
        raise SetupError(f"target table {database}.{table} does not exist: check clickhouse.target_table")
    if missing := [c for c in METADATA_COLUMNS if c not in names]:
        raise SetupError(
            f"verify --deep needs the columns _topic, _partition and _offset in {database}.{table}, which has no "
            f"{', '.join(missing)}: add them (_topic LowCardinality(String), _partition Int32, _offset Int64; "
            "rows ingested before have none) or run chtxn verify without --deep"
        )


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
    Column("missing", "missing", right=True),
    Column("replayed", "replayed", right=True),  # committed again after a rewinding offset reset
    Column("outside", "outside", right=True),
    Column("dead letters", "dead_letters", right=True),
    Column("unsure", "unsure", right=True, wide=True),  # missing where a dead letter's record has expired
    Column("expired", "expired", right=True, wide=True),  # below the retained ledger's first commit: not checked
    Column("ok", "ok"),
)
