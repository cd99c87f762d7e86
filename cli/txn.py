"""``chtxn txn list`` and ``chtxn txn show``: read transactions from the ledger.

Read-only. Output as ``cli.output`` prints it (``--format table|wide|tsv|json``); JSON has times
in unix seconds, durations in milliseconds, null when unknown. ``txn list`` folds the empty commits
(idle intervals) and seals into one line of its tables unless ``--all``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from datetime import datetime, timezone

import msgspec
from rich.markup import escape

from cli.config_option import add_config_option
from cli.output import Cell, Column, Output, Sheet, Styled, add_format_option
from cli.shard_reads import stages_on_shards
from clients import target_table
from clients.clickhouse import make_client
from coordinator.ledger.history import LedgerHistory
from protocol import naming, routing
from protocol.chcodes import UNKNOWN_IDENTIFIER, UNKNOWN_TABLE
from protocol.config.parse import PipelineConfig, load_config
from protocol.errors import ClickHouseError, SetupError
from protocol.ledger import rows as ledger, sql as ledger_sql
from protocol.ledger.view import TxnSummary

#: The columns of a txn in ``txn list`` (and of ``txn show --format tsv``).
TXN_COLUMNS = (
    Column("txn", "txn"),
    Column("state", "state"),
    Column("epoch", "epoch", right=True),
    Column("slot", "commit_seq", right=True),
    Column("rows", "total_rows", right=True),
    Column("bytes", "total_bytes", right=True, wide=True),
    Column("partitions", "partitions", right=True, wide=True),
    Column("dead letters", "dead_letters", right=True),
    Column("started (UTC)", "started_utc", fold=12),
    Column("consume ms", "consume_ms", right=True, wide=True),
    Column("commit ms", "commit_ms", right=True, wide=True),
    Column("publish ms", "publish_ms", right=True, wide=True),
    Column("total ms", "total_ms", right=True),
    Column("coordinator", "coordinator", wide=True),
    Column("reason", "reason", fold=10),
)
#: The columns of the shards in ``txn show`` (with ``clickhouse.shards``).
STAGE_COLUMNS = (
    Column("shard", "shard"),
    Column("server", "address"),
    Column("stage tables", "stage_tables", fold=20),
    Column("rows", "rows", right=True),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "txn",
        help="list transactions, or show one, from the ledger",
        description="Inspect the ledger: transactions with their state, epoch, rows, per-partition "
        "offsets, durations and abort reasons.",
        epilog="Examples:\n  chtxn txn list --config pipeline.toml --limit 50 --state ABORTED\n"
        "  chtxn txn list --config pipeline.toml --since 2h --format tsv\n"
        "  chtxn txn show e3_t17 --config pipeline.toml --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="txn_command", metavar="SUBCOMMAND", required=True)

    lister = commands.add_parser(
        "list",
        help="the latest transactions, newest first",
        description="The latest transactions of the pipeline, newest first. The tables (table, wide) fold "
        "the empty commits (committed with neither rows nor dead letters: idle intervals) and the seals "
        "(e<epoch>_t0, a new leader's empty commit) into one line that counts them; --all lists them. "
        "tsv and json list every transaction the filters keep.",
        epilog="Examples:\n  chtxn txn list --config pipeline.toml --since 10m\n"
        "  chtxn txn list --config pipeline.toml --limit 50 --state ABORTED --format wide\n"
        "  chtxn txn list --config pipeline.toml --non-empty --since 2026-11-25T10:00:00Z --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(lister)
    lister.add_argument(
        "--limit", type=int, default=20, help="how many transactions (default 20; folded ones do not count)"
    )
    lister.add_argument(
        "--state", type=str.upper, choices=ledger.STATE_PRECEDENCE, help="only transactions in this state"
    )
    lister.add_argument("--non-empty", action="store_true", help="only transactions with rows or dead letters")
    lister.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only transactions begun since WHEN: a duration back from now (30s, 10m, 2h, 1d, 1h30m) "
        "or a time (2026-11-25T10:00:00Z; UTC unless it names a zone)",
    )
    lister.add_argument("--all", action="store_true", help="tables list the empty commits and seals too")
    add_format_option(lister, rows="one line per transaction")
    lister.set_defaults(func=run_list)

    shower = commands.add_parser(
        "show",
        help="one transaction in full",
        description="Everything the ledger holds of one transaction: state, epoch, commit slot, "
        "offsets and rows per partition, durations, abort reason. With clickhouse.shards, also the "
        "txn's stage tables each shard holds now and their rows (none once it is published or aborted). "
        "With --format tsv, the transaction as txn list --format tsv gives it.",
        epilog="Examples:\n  chtxn txn show e3_t17 --config pipeline.toml\n"
        "  chtxn txn show e3_t17 --config pipeline.toml --format tsv",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shower.add_argument("txn", metavar="TXN", help="transaction id, e.g. e3_t17")
    add_config_option(shower)
    add_format_option(shower, rows="one line for the transaction")
    shower.set_defaults(func=run_show)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """The unix time ``text`` names: a duration back from ``now`` (``10m``, ``2h``, ``1h30m``; units
    s, m, h, d, w) or an ISO 8601 time or date (UTC unless it names a zone; ``Z`` allowed)."""
    spec = text.strip().lower()
    if re.fullmatch(f"(?:{_DURATION.pattern})+", spec):
        seconds = sum(float(n) * _SECONDS[unit] for n, unit in _DURATION.findall(spec))
        return (time.time() if now is None else now) - seconds
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (30s, 10m, 2h, 1d, 1h30m) nor a time (2026-11-25T10:00:00Z)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


def open_ledger(cfg: PipelineConfig, retries: int = 3) -> LedgerHistory:
    """The ledger of ``cfg``'s pipeline, with few retries (a person is waiting)."""
    return LedgerHistory(make_client(cfg.clickhouse), cfg.clickhouse.database, cfg.name, retries=retries)


def _missing_ledger(exc: ClickHouseError, cfg: PipelineConfig, config_path: str) -> SetupError | ClickHouseError:
    if exc.code == UNKNOWN_TABLE:
        return SetupError(
            f"the ledger table {cfg.clickhouse.database}.{ledger.TABLE} does not exist: "
            f"run chtxn init --config {config_path}"
        )
    if exc.code == UNKNOWN_IDENTIFIER:  # a ledger read names a column an earlier version's ledger lacks
        added = ", ".join(name for name, _ in ledger.ADDED_COLUMNS)
        return SetupError(
            f"the ledger table {cfg.clickhouse.database}.{ledger.TABLE} was made by an earlier chtxn and lacks "
            f"columns this version reads ({added}): run chtxn init --config {config_path} to add them"
        )
    return exc


def run_list(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    fold = args.format in ("table", "wide") and not args.all and not args.non_empty
    if args.non_empty:
        content = ledger_sql.WITH_CONTENT
    else:
        content = ledger_sql.NO_EMPTY_COMMITS if fold else ledger_sql.ANY_CONTENT
    since = args.since or 0.0
    history = open_ledger(cfg)
    try:
        summaries = history.latest_txns(limit=args.limit, state=args.state, since=since, content=content)
        folded = (0, 0)
        if fold:
            # the empty commits among the txns listed: from the oldest listed on, or all when fewer came
            full = len(summaries) >= args.limit
            span = min((s.started_at for s in summaries if s.started_at), default=since) if full else since
            folded = history.count_txns(args.state, since=span, content=ledger_sql.EMPTY_COMMITS)
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, args.config) from None
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(summaries)).decode())
        return 0
    out = Output(args.format)
    if not summaries and not folded[0] and args.format != "tsv":
        out.note(escape(f"no transactions in the ledger of pipeline {cfg.name}{_filters(args)}"))
        return 0
    if summaries or args.format == "tsv":
        sheet = Sheet(f"transactions of {cfg.name}, newest first{_filters(args)}", TXN_COLUMNS)
        for s in summaries:
            sheet.add(*txn_cells(s))
        out.sheet(sheet)
    if folded[0]:
        out.note(escape(_folded_line(*folded, listed=bool(summaries), pipeline=cfg.name, filters=_filters(args))))
    return 0


def _filters(args: argparse.Namespace) -> str:
    said = [
        f" in state {args.state}" if args.state else "",
        " with rows or dead letters" if args.non_empty else "",
        f" begun since {_time(args.since)} UTC" if args.since else "",
    ]
    return "".join(said)


def _folded_line(txns: int, seals: int, *, listed: bool, pipeline: str, filters: str) -> str:
    empty = txns - seals
    counts = [f"{n} {what}{'s' * (n != 1)}" for n, what in ((empty, "empty txn"), (seals, "seal")) if n]
    what = " and ".join(counts)
    if listed:
        return f"+ {what} (show them: --all)"
    return f"only {what} in the ledger of pipeline {pipeline}{filters} (show them: --all)"


def run_show(args: argparse.Namespace) -> int:
    cfg = target_table.learnt(load_config(args.config, os.environ))
    try:
        summary = open_ledger(cfg).txn(args.txn)
    except ClickHouseError as exc:
        raise _missing_ledger(exc, cfg, args.config) from None
    if summary is None:
        raise SetupError(f"no ledger rows for txn {args.txn!r} in pipeline {cfg.name}: list txns with chtxn txn list")
    by_table = rows_by_table(cfg, summary)
    shards = stages_on_shards(cfg, naming.split_stages(summary.stage_table)) if cfg.clickhouse.shards else ()
    if args.format == "json":
        document = {**msgspec.to_builtins(summary), "rows_by_table": by_table, "shards": msgspec.to_builtins(shards)}
        print(msgspec.json.format(msgspec.json.encode(document)).decode())
        return 0
    out = Output(args.format)
    if args.format == "tsv":
        sheet = Sheet("", TXN_COLUMNS)
        sheet.add(*txn_cells(summary))
        out.sheet(sheet)
        return 0
    _print_summary(out, summary, by_table if len(cfg.tables) > 1 else None)
    if shards:
        on = Sheet("the txn's stage tables on each shard, now", STAGE_COLUMNS)
        for s in shards:
            held = Styled(f"no answer: {s.error}", "red") if s.error else ", ".join(s.stage_tables) or "none"
            on.add(s.shard, s.address, held, "-" if s.rows is None else str(s.rows))
        out.sheet(on)
    return 0


def rows_by_table(cfg: PipelineConfig, summary: TxnSummary) -> dict[str, int]:
    """The rows ``summary``'s txn staged, per target table of the pipeline (by the routes of its topics)."""
    by_topic = routing.table_map(sorted({r.topic for r in summary.ranges}), cfg.routes)
    return {table: sum(r.rows for r in summary.ranges if by_topic.get(r.topic) == table) for table in cfg.tables}


def txn_cells(s: TxnSummary) -> tuple[Cell, ...]:
    """The cells of ``s`` under ``TXN_COLUMNS``."""
    return (
        s.txn,
        _state(s.state),
        str(s.epoch),
        str(s.commit_seq or ""),
        str(s.total_rows),
        str(s.total_bytes),
        str(len(s.ranges)),
        str(s.dead_letters),
        _time(s.started_at),
        _num(s.consume_ms),
        _num(s.commit_ms),
        _num(s.publish_ms),
        _num(s.total_ms),
        s.coordinator,
        s.reason,
    )


def _print_summary(out: Output, s: TxnSummary, by_table: dict[str, int] | None = None) -> None:
    """``by_table``: the rows per table, shown for a pipeline of several tables."""
    tables = ", ".join(f"{table} {rows}" for table, rows in (by_table or {}).items())
    out.facts(
        [
            ("txn", s.txn),
            ("state", _state(s.state)),
            ("epoch", str(s.epoch)),
            ("commit slot", str(s.commit_seq or "-")),
            ("coordinator", s.coordinator),
            ("target", s.target),
            ("stage table", s.stage_table),
            ("rows", str(s.total_rows) + (f" ({tables})" if tables else "")),
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
        ]
    )
    if s.ranges:
        parts = Sheet(
            "partitions (offsets are next-to-read)",
            [Column("topic", "topic")]
            + [Column(c, c.replace(" ", "_"), right=True) for c in ("partition", "start", "end", "records")]
            + [Column("rows staged", "rows_staged", right=True)],
        )
        for r in s.ranges:
            parts.add(r.topic, str(r.partition), str(r.start), str(r.end), str(max(0, r.end - r.start)), str(r.rows))
        out.sheet(parts)
    for gap in s.gaps:
        out.note(
            f"[yellow]gap[/]: {gap.topic}/{gap.partition} offsets {gap.start}..{gap.end - 1} were gone and skipped"
        )


def _state(state: str) -> Styled:
    return Styled(state, {"PUBLISHED": "green", "COMMITTED": "cyan", "ABORTED": "red"}.get(state, "yellow"))


def _time(ts: float) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}".removesuffix(".0")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{_num(value)} ms"
