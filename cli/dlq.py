"""``chtxn dlq list``, ``chtxn dlq show`` and ``chtxn dlq replay``: what is in the dead-letter topic,
and putting chosen letters back.

``list`` and ``show`` read, ``read_committed``: what a consumer draining the topic sees. ``replay``
re-produces letters (``coordinator.dead_letters.replay``), a dry run unless ``--execute``. Output as
``cli.output`` prints it (``--format table|wide|tsv|json``); in JSON, bytes come as text (invalid
UTF-8 replaced) and, exactly, as base64.
"""

from __future__ import annotations

import argparse
import base64
import os

import msgspec
from rich.markup import escape

from cli.config_option import add_config_option
from cli.dlq_replay import register_replay
from cli.letter_text import position, utc_time
from cli.output import Cell, Column, Output, Sheet, Styled, add_format_option
from coordinator.dead_letters.view import DeadLetterReader
from protocol.config.parse import load_config
from protocol.dead_letters.letters import PublishedLetter
from protocol.errors import SetupError

#: The columns of a letter in ``list`` (and of ``show --format tsv``, which adds its contents).
LETTER_COLUMNS = (
    Column("#", "position"),
    Column("topic", "topic"),
    Column("partition", "partition", right=True),
    Column("offset", "offset", right=True),
    Column("record time (UTC)", "record_time_utc", wide=True, fold=12),
    Column("txn", "txn"),
    Column("slot", "commit_seq", right=True),
    Column("code", "error_code", right=True),
    Column("error", "error", fold=10),
)
CONTENT_COLUMNS = (
    Column("key", "key", fold=10),
    Column("value", "value", fold=10),
    Column("tombstone", "tombstone"),
    Column("headers", "headers", fold=10),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dlq",
        help="list, show or replay the letters in the dead-letter topic",
        description="Read the pipeline's dead-letter topic as a consumer does (read_committed): each letter is a "
        "record chtxn could not insert, with its source topic/partition/offset, the txn and commit slot that "
        "published it, and why. replay puts chosen letters back into their source topic (or another), each once.",
        epilog="Examples:\n  chtxn dlq list --config pipeline.toml --from-end --limit 20\n"
        "  chtxn dlq list --config pipeline.toml --format tsv\n"
        "  chtxn dlq show --config pipeline.toml orders 3 1841\n  chtxn dlq show --config pipeline.toml 0:57 --json\n"
        "  chtxn dlq replay --config pipeline.toml --txn e3_t41 --execute",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND", required=True)

    lister = commands.add_parser(
        "list",
        help="one line per letter, oldest first",
        description="One line per letter, in publish order: where it sits in the dead-letter topic (#, "
        "partition:offset, for show), its source record, txn, commit slot, error code and error (whole: a "
        "terminal folds it onto more lines).",
        epilog="Examples:\n  chtxn dlq list --config pipeline.toml --from-end --limit 50\n"
        "  chtxn dlq list --config pipeline.toml --format wide\n"
        "  chtxn dlq list --config pipeline.toml --from-end --limit 50 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(lister)
    lister.add_argument("--limit", type=int, default=50, help="how many letters (default 50)")
    lister.add_argument("--from-end", action="store_true", help="the latest letters instead of the oldest")
    add_format_option(lister, rows="one line per letter")
    lister.set_defaults(func=run_list)

    shower = commands.add_parser(
        "show",
        help="one letter in full, with key and value",
        description="One letter in full: by its source record (TOPIC PARTITION OFFSET), or by its place in the "
        "dead-letter topic as list shows it in column # (PARTITION:OFFSET, or OFFSET for partition 0). "
        "With --format tsv, the columns of list --format tsv and the letter's key, value and headers.",
        epilog="Examples:\n  chtxn dlq show --config pipeline.toml orders 3 1841\n"
        "  chtxn dlq show --config pipeline.toml 0:57 --format tsv\n"
        "  chtxn dlq show --config pipeline.toml 0:57 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shower.add_argument("where", nargs="+", metavar="WHERE", help="TOPIC PARTITION OFFSET, or # as listed")
    add_config_option(shower)
    add_format_option(shower, rows="one line per letter")
    shower.set_defaults(func=run_show)
    register_replay(commands)


def run_list(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise SetupError(f"--limit {args.limit}: give a number greater than 0")
    cfg = load_config(args.config, os.environ)
    with DeadLetterReader(cfg) as reader:
        letters = reader.letters(limit=args.limit, from_end=args.from_end)
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode([_summary(x) for x in letters])).decode())
        return 0
    out = Output(args.format)
    if not letters and args.format != "tsv":
        out.note(f"no letters in {cfg.dead_letter_topic}, the dead-letter topic of pipeline {cfg.name}")
        return 0
    which = "latest" if args.from_end else "oldest"
    table = Sheet(f"{which} {len(letters)} letters in {cfg.dead_letter_topic}", LETTER_COLUMNS)
    for x in letters:
        table.add(*_letter_cells(x))
    out.sheet(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    with DeadLetterReader(cfg) as reader:
        if len(args.where) == 3:
            topic, partition, offset = args.where[0], _int(args.where[1], "PARTITION"), _int(args.where[2], "OFFSET")
            letters = reader.find(topic, partition, offset)
            what = f"source record {topic}/{partition}/{offset}"
        elif len(args.where) == 1:
            dlq_partition, dlq_offset = _position(args.where[0])
            found = reader.at(dlq_partition, dlq_offset)
            letters = [found] if found else []
            what = f"position {dlq_partition}:{dlq_offset} of {cfg.dead_letter_topic}"
        else:
            raise SetupError(f"show takes TOPIC PARTITION OFFSET or one # as listed, not {' '.join(args.where)!r}")
    if not letters:
        raise SetupError(f"no letter for {what} in {cfg.dead_letter_topic}: list them with chtxn dlq list")
    if args.format == "json":
        whole = [_summary(x) | _contents(x) for x in letters]
        print(msgspec.json.format(msgspec.json.encode(whole if len(whole) > 1 else whole[0])).decode())
        return 0
    out = Output(args.format)
    if len(letters) > 1:
        out.note(
            f"[yellow]{len(letters)} letters for {escape(what)}[/] (a publish cut short on a broker that shows "
            "aborted records, or the source topic was read again from scratch)"
        )
    if args.format == "tsv":
        table = Sheet("", LETTER_COLUMNS + CONTENT_COLUMNS)
        for x in letters:
            table.add(*_letter_cells(x), *_content_cells(x))
        out.sheet(table)
        return 0
    for x in letters:
        _print_letter(out, x)
    return 0


# ---- output -----------------------------------------------------------------------------------


def _summary(x: PublishedLetter) -> dict[str, object]:
    return {
        "position": position(x),
        "dlq_partition": x.dlq_partition,
        "dlq_offset": x.dlq_offset,
        "topic": x.topic,
        "partition": x.partition,
        "offset": x.offset,
        "txn": x.txn,
        "commit_seq": x.commit_seq,
        "error_code": x.error_code,
        "error": x.error,
        "timestamp_ms": x.timestamp_ms or None,
    }


def _contents(x: PublishedLetter) -> dict[str, object]:
    return {
        "pipeline": x.pipeline,
        **_bytes("key", x.key),
        **_bytes("value", x.value),
        "tombstone": x.value is None,
        "headers": [{"name": name, **_bytes("value", raw)} for name, raw in x.headers],
    }


def _bytes(name: str, raw: bytes | None) -> dict[str, str | None]:
    if raw is None:
        return {name: None, f"{name}_base64": None}
    return {name: raw.decode("utf-8", "replace"), f"{name}_base64": base64.b64encode(raw).decode()}


def _letter_cells(x: PublishedLetter) -> tuple[Cell, ...]:
    """The cells of ``x`` under ``LETTER_COLUMNS``, the error whole (a terminal folds it onto more lines)."""
    return (
        position(x),
        x.topic,
        str(x.partition),
        str(x.offset),
        utc_time(x.timestamp_ms).removesuffix(" UTC"),
        x.txn,
        str(x.commit_seq or ""),
        str(x.error_code),
        x.error,
    )


def _content_cells(x: PublishedLetter) -> tuple[Cell, ...]:
    """The cells of ``x`` under ``CONTENT_COLUMNS``: bytes as text, invalid UTF-8 replaced."""
    headers = "; ".join(f"{name}={_text(raw)}" for name, raw in x.headers)
    return _text(x.key), _text(x.value), "yes" if x.value is None else "no", headers


def _text(raw: bytes | None) -> str:
    return "" if raw is None else raw.decode("utf-8", "replace")


def _shown(raw: bytes | None) -> Cell:
    if raw is None:
        return Styled("null", "dim")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"(not UTF-8, base64) {base64.b64encode(raw).decode()}"


def _print_letter(out: Output, x: PublishedLetter) -> None:
    value = _shown(x.value)
    pairs: list[tuple[str, Cell]] = [
        ("position", f"{position(x)} of the dead-letter topic"),
        ("source", f"{x.topic} partition {x.partition} offset {x.offset}"),
        ("record time", utc_time(x.timestamp_ms)),
        ("pipeline", x.pipeline),
        ("txn", x.txn),
        ("commit slot", str(x.commit_seq or "-")),
        ("error code", str(x.error_code) + (" (found by chtxn)" if not x.error_code else "")),
        ("error", x.error),
        ("key", _shown(x.key)),
        ("value", Styled("null (a tombstone)", value.style) if isinstance(value, Styled) else value),
    ]
    pairs += [(f"header {name}", _shown(raw)) for name, raw in x.headers]
    out.facts(pairs)


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SetupError(f"{what} {text!r} is not a number") from None


def _position(text: str) -> tuple[int, int]:
    partition, _, offset = text.rpartition(":")
    return _int(partition or "0", "PARTITION"), _int(offset, "OFFSET")
