"""``chtxn dlq replay``: re-produce chosen dead letters to their source topic or another, each once
(``coordinator.dead_letters.replay``), a dry run unless ``--execute``."""

from __future__ import annotations

import argparse
import getpass
import os
import socket

import msgspec
from rich.markup import escape

from cli.config_option import add_config_option
from cli.letter_text import position, utc_time
from cli.output import Cell, Column, Output, Sheet, Styled, add_format_option
from coordinator.dead_letters.replay import DeadLetterReplay
from protocol.config.parse import load_config
from protocol.dead_letters import replay as dlq_replay
from protocol.dead_letters.replay import Planned, Selection
from protocol.errors import SetupError


def register_replay(commands: argparse._SubParsersAction) -> None:
    replay = commands.add_parser(
        "replay",
        help="re-produce chosen letters to their source topic or another, each once (a dry run without --execute)",
        description="Re-produce the letters chosen (--all, or any of --txn, --topic, --partition, --offsets, "
        "which must all hold) as their records: the same key, value and headers, plus chtxn.replay.of "
        "(<dead-letter topic>/<partition>/<offset> of the letter), chtxn.replay.source (<topic>/<partition>/"
        "<offset> of the record) and chtxn.replay.by. Without --to, each goes back to its own source "
        "partition, where the pipeline reads it again; with --to TOPIC, to the partition the key gives "
        "(murmur2, as Java producers and Kafka Connect pick). "
        "Each letter goes out once, however often the replay is run: in the same Kafka transaction as the "
        "records, one record per letter goes to the replay log, <dead-letter topic>.replays (compacted, "
        "created on the first replay), and letters the log holds, or second letters of a record already "
        "replayed, are skipped. A replay killed or failed mid-batch and run again first looks in the batch's "
        "destinations (from the log ends its intent, committed before the batch, recorded) for what it sent, "
        "so no letter goes twice, on the embedded broker too. A replay started while another runs fences it "
        "(one transactional.id per pipeline). "
        "Without --execute, nothing is produced: the plan is printed (what would go where, what was "
        "replayed before, when and by whom), as kafka-consumer-groups.sh --reset-offsets does without "
        "--execute; re-producing cannot be undone, so it is never the default.",
        epilog="Examples:\n  chtxn dlq replay --config pipeline.toml --txn e3_t41\n"
        "  chtxn dlq replay --config pipeline.toml --txn e3_t41 --execute\n"
        "  chtxn dlq replay --config pipeline.toml --topic orders --partition 3 --offsets 1800-1900 --execute\n"
        "  chtxn dlq replay --config pipeline.toml --all --to orders-retry --execute --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(replay)
    replay.add_argument("--all", action="store_true", help="every letter of the pipeline")
    replay.add_argument("--txn", action="append", default=[], metavar="TXN", help="letters of this txn (repeatable)")
    replay.add_argument("--topic", help="letters of records of this source topic")
    replay.add_argument("--partition", type=int, help="letters of records of this source partition")
    replay.add_argument(
        "--offsets", metavar="N-M", help="letters of records at source offsets N to M, both included (N-, -M: open)"
    )
    replay.add_argument("--to", metavar="TOPIC", help="replay into TOPIC (it must exist), not the source")
    replay.add_argument("--by", default="", metavar="NAME", help="who replays, in chtxn.replay.by (default: user@host)")
    replay.add_argument("--execute", action="store_true", help="produce them; without it, only print the plan")
    add_format_option(replay, rows="one line per letter chosen")
    replay.set_defaults(func=run_replay)


#: The columns of ``replay``'s table.
REPLAY_COLUMNS = (
    Column("#", "position"),
    Column("source", "source"),
    Column("txn", "txn"),
    Column("to", "to"),
    Column("result", "result"),
    Column("replayed", "replayed", fold=20),
)
_RESULT_STYLES = {
    dlq_replay.REPLAY: "cyan",
    dlq_replay.REPLAYED: "green",
    dlq_replay.DONE_BEFORE: "yellow",
    dlq_replay.SAME_RECORD: "yellow",
}


def run_replay(args: argparse.Namespace) -> int:
    selection = _selection(args)
    cfg = load_config(args.config, os.environ)
    by = args.by or f"{_user()}@{socket.gethostname()}"
    with DeadLetterReplay(cfg, by=by) as replay:
        to = args.to or ""
        planned = replay.execute(selection, to) if args.execute else replay.plan(selection, to)
    if not planned:
        raise SetupError(
            f"no letter in {cfg.dead_letter_topic} matches {selection.describe()}: list them with chtxn dlq list"
        )
    counts = {a: sum(p.action == a for p in planned) for a in _RESULT_STYLES}
    if args.format == "json":
        report = {
            "dry_run": not args.execute,
            "dead_letter_topic": cfg.dead_letter_topic,
            "replay_log": dlq_replay.replay_log_topic(cfg.dead_letter_topic),
            "by": by,
            "counts": counts,
            "letters": [_replay_summary(p) for p in planned],
        }
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
        return 0
    out = Output(args.format)
    title = "executed" if args.execute else "dry run, nothing produced (add --execute to replay)"
    table = Sheet(f"letters of {cfg.dead_letter_topic}: {selection.describe()}; {title}", REPLAY_COLUMNS)
    for p in planned:
        table.add(*_replay_cells(p))
    out.sheet(table)
    said = ", ".join(f"{n} {action}" for action, n in counts.items() if n)
    out.note(f"{'' if args.execute else '[bold]dry run[/]: '}{escape(said)}")
    return 0


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return f"uid{os.getuid()}"


def _selection(args: argparse.Namespace) -> Selection:
    first = last = None
    if args.offsets is not None:
        if args.partition is None:
            raise SetupError("--offsets needs --partition (and --topic when the pipeline reads several topics)")
        try:
            first, last = dlq_replay.parse_offsets(args.offsets)
        except ValueError as exc:
            raise SetupError(str(exc)) from None
    selection = Selection(
        txns=tuple(args.txn),
        topic=args.topic or "",
        partition=args.partition,
        first=first,
        last=last,
        everything=args.all,
    )
    chosen = bool(args.txn or args.topic or args.partition is not None)
    if chosen == args.all:
        raise SetupError(
            "choose the letters: --all, or any of --txn, --topic, --partition and --offsets (not both)"
            if args.all
            else "choose the letters to replay: --all, or any of --txn, --topic, --partition and --offsets"
        )
    return selection


def _to(p: Planned) -> str:
    if p.action == dlq_replay.REPLAYED and p.record is not None:
        return p.record.to
    return f"{p.to_topic}/{'by key' if p.to_partition < 0 else p.to_partition}"


def _replayed(p: Planned) -> str:
    if p.record is None:
        return ""
    when = utc_time(p.record.at_ms).removesuffix(" UTC")
    where = "" if p.action == dlq_replay.REPLAYED else f"to {p.record.to} "
    return f"{where}by {p.record.by} at {when}"


def _replay_cells(p: Planned) -> tuple[Cell, ...]:
    x = p.letter
    return (
        position(x),
        dlq_replay.source_key(x),
        x.txn,
        _to(p),
        Styled(p.action, _RESULT_STYLES[p.action]),
        _replayed(p) or "-",
    )


def _replay_summary(p: Planned) -> dict[str, object]:
    x = p.letter
    return {
        "position": position(x),
        "of": p.key,
        "topic": x.topic,
        "partition": x.partition,
        "offset": x.offset,
        "txn": x.txn,
        "to_topic": p.to_topic,
        "to_partition": None if p.to_partition < 0 else p.to_partition,
        "result": p.action,
        "replay": None if p.record is None else msgspec.to_builtins(p.record),
    }
