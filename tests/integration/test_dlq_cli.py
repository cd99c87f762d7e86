"""``chtxn dlq list`` and ``chtxn dlq show`` as an operator runs them, on letters the publisher put there."""

from __future__ import annotations

import json
from functools import partial

from participant.bad_records import TOMBSTONE, Letter
from tests.helpers import REPO, run_chtxn, unique_name
from tests.integration.ledger_writes import publish_letters
from tests.pipelines import make_pipeline
from tests.records import Rec

LONG_ERROR = "Cannot parse input: expected '\"' before: " + "x" * 300


#: ``python -m cli`` of this checkout, without the session's ``CHTXN_*`` settings.
chtxn = partial(run_chtxn, timeout_s=120, inherit_chtxn_vars=False, env={"PYTHONPATH": str(REPO)})


def test_list_and_show_what_the_dead_letter_topic_holds(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("dlqcli"), partitions=1)
    config = str(pipeline.config_path)
    records = [
        Rec(pipeline.topic, 0, 4, None, b"deleted"),
        Rec(pipeline.topic, 0, 7, b"\xff\xfe{", b"k7"),
        Rec(pipeline.topic, 0, 9, b'{"id": "x"}', b"k9"),
    ]
    publish_letters(
        pipeline,
        [Letter(records[0], TOMBSTONE), Letter(records[1], "not a JSON object"), Letter(records[2], LONG_ERROR, 27)],
    )

    listed = chtxn("dlq", "list", "--config", config, "--json")
    assert listed.returncode == 0, listed.stderr
    letters = json.loads(listed.stdout)
    assert [(x["offset"], x["txn"], x["commit_seq"], x["error_code"]) for x in letters] == [
        (4, "e1_t1", 1, 0),
        (7, "e1_t1", 1, 0),
        (9, "e1_t1", 1, 27),
    ]
    assert letters[2]["error"] == LONG_ERROR, "--json gives the whole error"

    table = chtxn("dlq", "list", "--config", config)
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "Cannot parse input" in line)
    assert pipeline.topic in row and "e1_t1" in row and row.endswith(LONG_ERROR), "one whole line, the error whole"

    latest = json.loads(chtxn("dlq", "list", "--config", config, "--from-end", "--limit", "1", "--json").stdout)
    assert [x["offset"] for x in latest] == [9]

    tombstone = json.loads(chtxn("dlq", "show", "--config", config, pipeline.topic, "0", "4", "--json").stdout)
    assert (tombstone["key"], tombstone["value"], tombstone["tombstone"]) == ("deleted", None, True)
    assert tombstone["error"].startswith("tombstone: null value")
    binary = json.loads(chtxn("dlq", "show", "--config", config, letters[1]["position"], "--json").stdout)
    assert (binary["offset"], binary["value_base64"]) == (7, "//57")

    shown = chtxn("dlq", "show", "--config", config, pipeline.topic, "0", "9")
    assert shown.returncode == 0, shown.stderr
    assert LONG_ERROR in shown.stdout.replace("\n", ""), "show gives the whole error"
    assert '{"id": "x"}' in shown.stdout

    missing = chtxn("dlq", "show", "--config", config, pipeline.topic, "0", "5")
    assert missing.returncode == 1
    assert "no letter for source record" in missing.stderr and "chtxn dlq list" in missing.stderr
