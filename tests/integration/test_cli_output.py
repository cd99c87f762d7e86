"""The read commands' output as scripts and logs get it: whole lines into a pipe, ``--format``, and
``txn list``'s folding and filters, against the session's broker and ClickHouse."""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from datetime import datetime, timezone
from functools import partial

import pytest

from cli.output import Output, Sheet
from cli.txn import TXN_COLUMNS, parse_since, txn_cells
from participant.bad_records import Letter
from protocol.ledger import rows as ledger
from protocol.ledger.rows import LedgerEvent, LedgerRow, PartitionRange
from protocol.ledger.view import TxnSummary
from tests.helpers import REPO, run_chtxn, unique_name, wait_until
from tests.integration.ledger_writes import publish_letters
from tests.integration.live_pipeline import coordinator
from tests.integration.scripted_participants import ScriptedParticipants
from tests.pipelines import Pipeline, make_pipeline
from tests.records import Rec

#: ``python -m cli`` of this checkout on an 80-column setting, without the session's ``CHTXN_*`` settings;
#: its stdout is a pipe.
chtxn = partial(
    run_chtxn, timeout_s=120, inherit_chtxn_vars=False, env={"PYTHONPATH": str(REPO), "COLUMNS": "80"}, check=True
)

LONG_ERROR = "Cannot parse input: expected '\"' before: " + "x" * 300


# ---- the ledgers read ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def live(stack, tmp_path_factory) -> Pipeline:
    """A pipeline that published rows, then idled: seals and empty commits among its txns."""
    pipeline = make_pipeline(
        stack,
        tmp_path_factory.mktemp("live"),
        unique_name("cliout"),
        settings={"transaction.idle_interval_s": 0.5},  # idle txns end at the interval: empty commits
    )
    produced = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), coordinator(pipeline, coordinator_id="out-c1"):
        wait_until(lambda: pipeline.target_count() == produced, 60, "rows published")
        time.sleep(4)  # idle intervals: empty commits
    return pipeline


@pytest.fixture(scope="module")
def letters(stack, tmp_path_factory) -> Pipeline:
    """A pipeline whose dead-letter topic holds three letters of txn e1_t1, one with a long error."""
    pipeline = make_pipeline(stack, tmp_path_factory.mktemp("dlq"), unique_name("cliout_dlq"), partitions=1)
    records = [Rec(pipeline.topic, 0, o, b"{bad" + bytes([48 + o]), b"k%d" % o) for o in (3, 5, 8)]
    publish_letters(
        pipeline,
        [Letter(records[0], "not a JSON object"), Letter(records[1], LONG_ERROR, 27), Letter(records[2], "bad", 1)],
    )
    return pipeline


#: The hand-written ledger: (txn, events, total rows, dead letters, reason, minutes ago of its first row).
HANDMADE = (
    ("e1_t0", ("COMMITTED", "PUBLISHED"), 0, 0, "", 180),
    ("e1_t1", ("STARTED", "COMMITTED", "PUBLISHED"), 40, 0, "", 179),
    *((f"e1_t{n}", ("STARTED", "COMMITTED", "PUBLISHED"), 0, 0, "", 178 - n) for n in range(2, 6)),
    ("e2_t0", ("COMMITTED", "PUBLISHED"), 0, 0, "", 30),
    ("e2_t1", ("STARTED", "COMMITTED", "PUBLISHED"), 7, 0, "", 29),
    ("e2_t2", ("STARTED", "ABORTED"), 0, 0, "write-status timeout", 28),
    ("e2_t3", ("STARTED", "COMMITTED", "PUBLISHED"), 0, 2, "", 27),
    *((f"e2_t{n}", ("STARTED", "COMMITTED", "PUBLISHED"), 0, 0, "", 30 - n) for n in range(4, 7)),
    ("e2_t7", ("STARTED",), 0, 0, "", 1),
)


@pytest.fixture(scope="module")
def handmade(stack, tmp_path_factory) -> Pipeline:
    """A pipeline whose ledger holds ``HANDMADE``, each txn's rows stored at the times it says."""
    pipeline = make_pipeline(stack, tmp_path_factory.mktemp("handmade"), unique_name("cliout_hand"))
    now = time.time()
    rows, slot = [], 0
    for txn, events, total_rows, dead, reason, minutes_ago in HANDMADE:
        for i, event in enumerate(events):
            slot += event == "COMMITTED"
            ranges = (PartitionRange(topic=pipeline.topic, partition=0, start=0, end=total_rows, rows=total_rows),)
            row = LedgerRow(
                pipeline=pipeline.cfg.name,
                txn=txn,
                event=LedgerEvent(event),
                epoch=int(txn[1]),
                commit_seq=slot if event in ("COMMITTED", "PUBLISHED") else 0,
                coordinator="hand",
                ranges=ranges if total_rows else (),
                total_rows=total_rows if event != "STARTED" else 0,
                dead_letters=dead if event != "STARTED" else 0,
                started_at=now - minutes_ago * 60,
                reason=reason,
            )
            at = datetime.fromtimestamp(now - minutes_ago * 60 + i, tz=timezone.utc)
            rows.append([*ledger.to_insert_values(row), at])
    pipeline.client().insert(
        ledger.TABLE,
        rows,
        column_names=[*ledger.INSERT_COLUMNS, "event_time"],
        database=pipeline.cfg.clickhouse.database,
    )
    return pipeline


# ---- helpers ------------------------------------------------------------------------------------


def whole_lines(stdout: str) -> list[str]:
    """The lines of ``stdout``, after checking that none was cut or padded."""
    lines = stdout.splitlines()
    assert lines, "no output"
    for line in lines:
        assert "\u2026" not in line, f"a cut cell: {line!r}"
        assert line == line.rstrip(), f"a line padded with spaces: {line!r}"
        assert not set(line) & set("\u2502\u2503\u2501\u2500"), f"box drawing in a pipe: {line!r}"
    return lines


def rows_of(lines: list[str], first: set[str]) -> dict[str, list[str]]:
    """The whitespace-split lines whose first word is in ``first``, by that word."""
    return {words[0]: words for words in (line.split() for line in lines) if words and words[0] in first}


def tsv(stdout: str) -> list[dict[str, str]]:
    """TSV as dicts by the header line's keys, after checking every line has a cell per key."""
    header, *lines = stdout.splitlines()
    keys = header.split("\t")
    for line in lines:
        assert len(line.split("\t")) == len(keys), f"{line!r} has not {len(keys)} cells"
    return [dict(zip(keys, line.split("\t"))) for line in lines]


def listed(pipeline: Pipeline, *args: str) -> list[str]:
    """The txn ids ``txn list`` prints in its table, in order, and checks the lines are whole."""
    out = chtxn("txn", "list", "--config", str(pipeline.config_path), *args).stdout
    lines = whole_lines(out)
    assert lines[0].startswith(f"transactions of {pipeline.cfg.name}, newest first"), lines[0]
    assert lines[1].split()[:2] == ["txn", "state"], lines[1]
    return [line.split()[0] for line in lines[2:] if line.startswith("e")]


def folded_line(pipeline: Pipeline, *args: str) -> str:
    return chtxn("txn", "list", "--config", str(pipeline.config_path), *args).stdout.splitlines()[-1]


# ---- whole lines into a pipe ------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "wide"])
def test_txn_list_and_show_print_whole_ids_and_states(live: Pipeline, fmt: str) -> None:
    config = str(live.config_path)
    every = json.loads(chtxn("txn", "list", "--config", config, "--json").stdout)
    assert {t["txn"] for t in every} >= {"e1_t0", "e1_t1"}, every
    out = chtxn("txn", "list", "--config", config, "--all", "--format", fmt).stdout
    rows = rows_of(whole_lines(out), {t["txn"] for t in every})
    assert {txn: words[1] for txn, words in rows.items()} == {t["txn"]: t["state"] for t in every}
    published = next(t for t in every if t["total_rows"])
    assert rows[published["txn"]][4] == str(published["total_rows"])
    if fmt == "wide":
        assert rows[published["txn"]][-1] == "out-c1", "wide shows the coordinator"

    shown = whole_lines(chtxn("txn", "show", published["txn"], "--config", config, "--format", fmt).stdout)
    facts = {line.split()[0]: line.split()[1:] for line in shown}
    assert facts["txn"] == [published["txn"]] and facts["state"] == [published["state"]]
    assert "partitions (offsets are next-to-read)" in shown
    ranges = {(r["partition"], r["start"], r["end"]) for r in published["ranges"]}
    found = {tuple(int(w) for w in line.split()[1:4]) for line in shown if line.startswith(live.topic + " ")}
    assert found == ranges


def test_status_and_verify_print_whole_partitions_and_offsets(live: Pipeline) -> None:
    config = str(live.config_path)
    status = run_chtxn("status", "--config", config, timeout_s=120, inherit_chtxn_vars=False, env={"COLUMNS": "80"})
    assert status.returncode == 1, status.stderr  # no coordinator runs any more
    lines = whole_lines(status.stdout)
    assert lines[0] == f"pipeline {live.cfg.name}: failed: leader, participants"
    assert "coordinators (leaders and standbys heartbeat on the control topic)" in lines
    [replica] = rows_of(lines, {"out-c1"}).values()
    assert replica[1:3] == ["left", "1"] and replica[-2:] == ["s", "ago"], "stopped: it said it left"
    heads = {(tp.partition, 150) for tp in live.partitions}
    rows = [line.split() for line in lines if line.startswith(live.topic + " ")]
    assert {(int(r[1]), int(r[2])) for r in rows} == heads
    assert all(r[-3:] == ["none", "live", live.cfg.clickhouse.target_table] for r in rows), rows

    verified = whole_lines(chtxn("verify", "--config", config, "--deep").stdout)
    assert verified[0] == f"exactly-once check of {live.cfg.clickhouse.database}.events"
    checks = [line.split() for line in verified if line.startswith(live.topic + " ")]
    assert sorted(c[1:6] for c in checks) == [[str(p), "0", "150", "150", "150"] for p, _ in sorted(heads)]
    assert all(c[-1] == "yes" for c in checks) and verified[-1] == "exactly-once: OK"


def test_dlq_list_and_show_print_whole_lines(letters: Pipeline) -> None:
    config = str(letters.config_path)
    table = whole_lines(chtxn("dlq", "list", "--config", config).stdout)
    rows = rows_of(table, {"0:0", "0:1", "0:2"})
    assert [rows[p][1:6] for p in ("0:0", "0:1", "0:2")] == [
        [letters.topic, "0", str(offset), "e1_t1", "1"] for offset in (3, 5, 8)
    ]
    assert any(line.endswith(LONG_ERROR) for line in table), "a pipe gets the error whole, on the letter's line"
    wide = whole_lines(chtxn("dlq", "list", "--config", config, "--format", "wide").stdout)
    assert any(line.endswith(LONG_ERROR) for line in wide), "wide gives it whole, on the letter's line"

    shown = whole_lines(chtxn("dlq", "show", "--config", config, letters.topic, "0", "5").stdout)
    error = next(line for line in shown if line.split()[:2] == ["error", "Cannot"])
    assert error.split(None, 1) == ["error", LONG_ERROR]
    source = next(line for line in shown if line.startswith("source "))
    assert source.split() == ["source", letters.topic, "partition", "0", "offset", "5"]
    assert max(len(line) for line in shown) == len(error), "no line padded to the longest"


# ---- --format tsv and json ------------------------------------------------------------------


def test_tsv_has_a_header_and_a_line_per_row(live: Pipeline, letters: Pipeline, handmade: Pipeline) -> None:
    config = str(handmade.config_path)
    every = json.loads(chtxn("txn", "list", "--config", config, "--json").stdout)
    txns = tsv(chtxn("txn", "list", "--config", config, "--format", "tsv").stdout)
    assert list(txns[0]) == [
        "txn", "state", "epoch", "commit_seq", "total_rows", "total_bytes", "partitions", "dead_letters",
        "started_utc", "consume_ms", "commit_ms", "publish_ms", "total_ms", "coordinator", "reason",
    ]  # fmt: skip
    assert [(t["txn"], t["state"], t["total_rows"], t["dead_letters"], t["reason"]) for t in txns] == [
        (t["txn"], t["state"], str(t["total_rows"]), str(t["dead_letters"]), t["reason"]) for t in every
    ], "tsv lists what json lists: nothing folded"
    [one] = tsv(chtxn("txn", "show", "e2_t2", "--config", config, "--format", "tsv").stdout)
    assert one == next(t for t in txns if t["txn"] == "e2_t2")

    status = run_chtxn(
        "status", "--config", str(live.config_path), "--format", "tsv", timeout_s=120, inherit_chtxn_vars=False
    )
    parts = tsv(status.stdout)
    assert [(p["topic"], p["partition"], p["committed"]) for p in parts] == [
        (live.topic, str(tp.partition), "150") for tp in live.partitions
    ]
    assert list(parts[0]) == ["topic", "partition", "committed", "log_end", "lag", "participant", "table"]
    assert {p["table"] for p in parts} == {live.cfg.clickhouse.target_table}
    assert f"pipeline {live.cfg.name}: failed: leader, participants" in status.stderr, "the heading goes to stderr"
    assert "coordinator out-c1: left, epoch 1, " in status.stderr, "and the replicas"

    checks = tsv(chtxn("verify", "--config", str(live.config_path), "--deep", "--format", "tsv").stdout)
    assert [(c["partition"], c["committed_to"], c["distinct_offsets"], c["ok"]) for c in checks] == [
        (str(tp.partition), "150", "150", "yes") for tp in live.partitions
    ]
    assert tsv(chtxn("verify", "--config", str(live.config_path), "--format", "tsv").stdout) == []

    letter_rows = tsv(chtxn("dlq", "list", "--config", str(letters.config_path), "--format", "tsv").stdout)
    assert [(x["position"], x["offset"], x["error_code"]) for x in letter_rows] == [
        ("0:0", "3", "0"),
        ("0:1", "5", "27"),
        ("0:2", "8", "1"),
    ]
    assert letter_rows[1]["error"] == LONG_ERROR
    [shown] = tsv(chtxn("dlq", "show", "--config", str(letters.config_path), "0:1", "--format", "tsv").stdout)
    assert shown == letter_rows[1] | {"key": "k5", "value": "{bad5", "tombstone": "no", "headers": ""}


def test_format_json_is_what_json_printed(live: Pipeline, letters: Pipeline) -> None:
    config, dlq = str(live.config_path), str(letters.config_path)
    for argv in (
        ("txn", "list", "--config", config),
        ("txn", "show", "e1_t1", "--config", config),
        ("verify", "--config", config, "--deep"),
        ("dlq", "list", "--config", dlq),
        ("dlq", "show", "--config", dlq, "0:1"),
    ):
        as_json = chtxn(*argv, "--json").stdout
        assert chtxn(*argv, "--format", "json").stdout == as_json
        assert json.loads(as_json)


# ---- txn list: folding and filters ------------------------------------------------------------

SHOWN = ["e2_t7", "e2_t3", "e2_t2", "e2_t1", "e1_t1"]  # HANDMADE without its empty commits and seals


def test_txn_list_folds_empty_commits_and_seals(handmade: Pipeline) -> None:
    assert listed(handmade) == SHOWN
    assert folded_line(handmade) == "+ 7 empty txns and 2 seals (show them: --all)"
    assert listed(handmade, "--format", "wide") == SHOWN
    assert listed(handmade, "--all") == [txn for txn, *_ in sorted(HANDMADE, key=lambda t: t[-1])]
    assert folded_line(handmade, "--all").startswith("e1_t0 ")
    assert listed(handmade, "--limit", "2") == ["e2_t7", "e2_t3"]
    assert folded_line(handmade, "--limit", "2") == "+ 3 empty txns (show them: --all)", "those among the listed"
    every = json.loads(chtxn("txn", "list", "--config", str(handmade.config_path), "--json").stdout)
    assert len(every) == len(HANDMADE), "json lists what it listed before: nothing folded"


def test_txn_list_filters(handmade: Pipeline) -> None:
    assert listed(handmade, "--non-empty") == ["e2_t3", "e2_t1", "e1_t1"]
    assert folded_line(handmade, "--non-empty").startswith("e1_t1 "), "no folded line: they were filtered"
    assert listed(handmade, "--state", "aborted") == ["e2_t2"]
    assert listed(handmade, "--state", "PUBLISHED") == ["e2_t3", "e2_t1", "e1_t1"]
    assert listed(handmade, "--since", "1h") == ["e2_t7", "e2_t3", "e2_t2", "e2_t1"]
    assert folded_line(handmade, "--since", "1h") == "+ 3 empty txns and 1 seal (show them: --all)"
    two_hours_ago = datetime.fromtimestamp(time.time() - 7200, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert listed(handmade, "--since", two_hours_ago, "--all") == [f"e2_t{n}" for n in range(7, -1, -1)]
    assert listed(handmade, "--since", "4h", "--non-empty", "--all") == ["e2_t3", "e2_t1", "e1_t1"]
    config = str(handmade.config_path)
    recent = json.loads(chtxn("txn", "list", "--config", config, "--since", "90m", "--non-empty", "--json").stdout)
    assert [t["txn"] for t in recent] == ["e2_t3", "e2_t1"]
    none = chtxn("txn", "list", "--config", config, "--since", "30s", "--state", "PUBLISHED").stdout
    assert none.startswith(f"no transactions in the ledger of pipeline {handmade.cfg.name} in state PUBLISHED")
    bad = run_chtxn("txn", "list", "--config", config, "--since", "yesterday", inherit_chtxn_vars=False)
    assert bad.returncode == 2 and "'yesterday' is neither a duration" in bad.stderr


def test_parse_since() -> None:
    now = 1_800_000_000.0
    assert parse_since("10m", now) == now - 600
    assert parse_since("1h30m", now) == now - 5400
    assert parse_since("2d", now) == now - 2 * 86400
    assert parse_since("2026-11-25T10:00:00Z") == datetime(2026, 11, 25, 10, tzinfo=timezone.utc).timestamp()
    assert parse_since("2026-11-25T12:00:00+02:00") == parse_since("2026-11-25 10:00")
    assert parse_since("2026-11-25") == datetime(2026, 11, 25, tzinfo=timezone.utc).timestamp()
    for bad in ("", "10", "m10", "10 minutes", "2026-13-01"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_since(bad, now)


# ---- on a terminal --------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", ["40", "80", "200"])
def test_a_terminal_table_never_cuts_an_id(monkeypatch, columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    summaries = [
        TxnSummary(txn=f"e12_t{1000 + i}", state=state, epoch=12, commit_seq=4000 + i, started_at=1.8e9, reason=why)
        for i, (state, why) in enumerate([("PUBLISHED", ""), ("ABORTED", "write-status timeout: " + "x" * 90)])
    ]
    for fmt in ("table", "wide"):
        screen = Terminal()
        out = Output(fmt, file=screen)
        sheet = Sheet("transactions", TXN_COLUMNS)
        for s in summaries:
            sheet.add(*txn_cells(s))
        out.sheet(sheet)
        text = re.sub(r"\x1b\[[0-9;]*m", "", screen.getvalue())
        assert "\u2026" not in text
        words = text.split()
        for s in summaries:
            assert {s.txn, s.state, str(s.commit_seq)} <= set(words), (columns, fmt, text)
        lines = text.splitlines()
        fits = all(len(line.rstrip()) <= int(columns) for line in lines)
        assert fits or any(summaries[1].reason in line for line in lines), "a table that fits, or whole lines"
        assert fits == (columns == "200"), (columns, fmt, text)
