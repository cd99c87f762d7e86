"""The soak's own oracle when the operator changes things: every acknowledged record, found by the
``id`` it carries, exactly as often as the operator's changes say, in the union of the tables the
pipeline ever wrote to. It reads nothing of chtxn's ledger and knows nothing of offsets in the
target: it is independent of ``chtxn verify --deep``, which must agree with it.

How often a good record (generation g of the topic, partition p, offset o) must be in the tables:

- once, plus once for each reset the operator applied that rewound p in generation g over o
  (``[reset_to, committed)`` as ``chtxn reset --json`` reported it);
- at most that often when its topic was deleted (a new generation began) before the record was
  committed: offsets at or past the committed end read just before the deletion may be gone with
  the log; below it they must be there.

Every id in the tables must be one the producers had acknowledged. Bad records: each one not lost
with its topic is among the dead letters chtxn recorded for its committed txns
(``chtxn_dead_letters``, which outlives the dead-letter topic's retention), and no good record is.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from protocol.dead_letters import letters as letters_table
from tests.soak.traffic import Traffic, good_value


@dataclass
class Changes:
    """What the operator's changes did to the expected counts, as the harness saw them happen."""

    rewinds: list[tuple[int, int, int, int]] = field(default_factory=list)  # (generation, partition, lo, hi)
    deleted: dict[int, dict[int, int]] = field(default_factory=dict)  # generation -> committed end at deletion
    tables: set[str] = field(default_factory=set)  # every table the topic was routed to

    def expected(self, generation: int, partition: int, offset: int) -> tuple[int, int]:
        """(fewest, most) copies of the record at ``offset``."""
        most = 1 + sum(1 for g, p, lo, hi in self.rewinds if (g, p) == (generation, partition) and lo <= offset < hi)
        head = self.deleted.get(generation)
        gone = head is not None and offset >= head.get(partition, 0)
        return (0 if gone else most, most)


def check_ids(client: Any, database: str, traffic: Traffic, changes: Changes) -> dict[str, Any]:
    """Count every id in the tables against what ``traffic`` acknowledged and ``changes`` allow."""
    union = " UNION ALL ".join(f"SELECT id FROM `{database}`.`{t}`" for t in sorted(changes.tables))
    found = Counter(
        {int(i): int(n) for i, n in client.query(f"SELECT id, count() FROM ({union}) GROUP BY id").result_rows}
    )
    losses, duplicates, examples = 0, 0, {"lost": [], "duplicated": [], "unknown": []}
    expected_rows = 0
    known: set[int] = set()
    for generation, partitions in enumerate(traffic.placed):
        for partition, records in partitions.items():
            for offset, record_id in records.items():
                known.add(record_id)
                fewest, most = changes.expected(generation, partition, offset)
                expected_rows += most
                have = found.get(record_id, 0)
                if have < fewest:
                    losses += fewest - have
                    examples["lost"].append((generation, partition, offset, record_id, have, fewest))
                elif have > most:
                    duplicates += have - most
                    examples["duplicated"].append((generation, partition, offset, record_id, have, most))
    unknown = sorted(set(found) - known)
    examples["unknown"] = unknown[:10]
    anomalies = []
    if losses:
        anomalies.append(
            f"{losses} acknowledged records missing, e.g. (gen, partition, offset, id, found, expected) {examples['lost'][:5]}"
        )
    if duplicates:
        anomalies.append(f"{duplicates} copies too many, e.g. {examples['duplicated'][:5]}")
    if unknown:
        anomalies.append(f"{len(unknown)} ids in the tables that were never acknowledged, e.g. {unknown[:5]}")
    return {
        "ok": not anomalies,
        "anomalies": anomalies,
        "rows_in_target": sum(found.values()),
        "expected_rows_at_most": expected_rows,
        "losses": losses,
        "duplicates": duplicates,
        "tables": sorted(changes.tables),
        "rewinds": changes.rewinds,
        "deleted": {str(g): h for g, h in changes.deleted.items()},
    }


def check_letters(
    client: Any, database: str, pipeline: str, committed: set[str], traffic: Traffic, changes: Changes
) -> dict[str, Any]:
    """Every bad record not lost with its topic is a letter of a committed txn; no good record is."""
    rows = client.query(
        f"SELECT txn, value FROM {letters_table.qualified(database)} WHERE pipeline = {{p:String}}",
        parameters={"p": pipeline},
        column_formats={"value": "bytes"},
    ).result_rows
    letters = Counter(bytes(v or b"") for txn, v in rows if txn in committed)
    wanted: Counter[bytes] = Counter()
    for generation, partitions in enumerate(traffic.placed_bad):
        for partition, records in partitions.items():
            for offset, value in records.items():
                if changes.expected(generation, partition, offset)[0]:
                    wanted[value] += 1
    missing = wanted - letters
    good = {int(i) for parts in traffic.placed for records in parts.values() for i in records.values()}
    good_letters = [v for v in letters if v.startswith(b'{"id": ') and _is_good(v, good)]
    return {
        "dead_lettered": sum(letters.values()),
        "bad_produced": sum(len(r) for parts in traffic.placed_bad for r in parts.values()),
        "good_dead_lettered": len(good_letters),
        "bad_not_dead_lettered": sum(missing.values()),
        "examples": {
            "good_dead_lettered": [v[:80].decode(errors="replace") for v in good_letters[:5]],
            "bad_not_dead_lettered": [v[:80].decode(errors="replace") for v in list(missing)[:5]],
        },
    }


def _is_good(value: bytes, good: set[int]) -> bool:
    try:
        record_id = int(value.split(b",", 1)[0].removeprefix(b'{"id": '))
    except ValueError:
        return False
    return record_id in good and value == good_value(record_id)
