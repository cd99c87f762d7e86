"""Stager step 5 (``participant.stager``): records that are not one row, found after their insert.

When ClickHouse stored a different number of rows than records were sent (``written_rows``), the
chunk's rows are in the stage table under its token and its txn cannot commit. ``NotOneRowFinder``
then finds the culprits without touching the stage table again: in JSON object formats the records
``json_problem`` finds not one object, then a bisection (``participant.bisection.isolate``) whose
probes go to a Null-engine clone of the stage table (``naming.probe_table``, dropped afterwards).
It remembers them in ``remembered`` and returns the chunk's error, so the coordinator aborts once
and the txn that reads them again dead-letters them at stager step 1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from participant.bad_records import Letter, Remembered, json_problem
from participant.bisection import Refused, isolate
from protocol import naming
from protocol.chcodes import ErrorClass, classify
from protocol.chunking import Chunk, RecordLike
from protocol.config.sections import ClickHouseSection
from protocol.errors import ChtxnError, ClickHouseError
from protocol.framing import JSON_OBJECT_FORMATS, frame

log = logging.getLogger(__name__)


class NotOneRow(ChtxnError):
    """ClickHouse stored ``written`` rows for ``records``: some record is not exactly one row."""

    def __init__(self, message: str, *, records: Sequence[RecordLike], written: int) -> None:
        super().__init__(message)
        self.records, self.written = records, written


class NotOneRowFinder:
    """Stager step 5 for one ``Stager``: ``retrying(what)`` is its retry policy, ``settings()`` its
    chunk insert settings. Thread-safe as far as ``remembered`` and the client are."""

    def __init__(
        self,
        *,
        client: Any,
        section: ClickHouseSection,
        remembered: Remembered,
        retrying: Callable[[str], Any],
        settings: Callable[[], dict[str, int]],
    ) -> None:
        self.client, self.section, self.remembered = client, section, remembered
        self._retrying, self._settings = retrying, settings

    # ---- stager step 5: records that are not one row, found after their insert ---------------

    def set_aside(self, stage_table: str, chunk: Chunk, exc: NotOneRow) -> str:
        """Find the records of ``exc`` that are not one row, remember them; the chunk's error."""
        try:
            found = self._isolate(stage_table, chunk.token, exc.records)
        except ChtxnError as failure:
            found, why = [], f"finding them failed: {failure}"
        else:
            why = "none could be told apart by its row count" if not found else ""
        self.remembered.remember(found)
        offsets = ", ".join(str(letter.record.offset()) for letter in found[:20]) + (" ..." if len(found) > 20 else "")
        if found:
            log.warning(
                "records at offsets %s of %s/%d are not one row each; dead-lettered when read again",
                offsets,
                chunk.topic,
                chunk.partition,
                extra={"txn": chunk.txn, "first_error": found[0].error[:500]},
            )
            return (
                f"{exc}: the records at offsets {offsets} are not exactly one {self.section.input_format} row each; "
                "they are set aside for the dead-letter topic when read again, and this txn must abort"
            )
        log.error("%s and %s", exc, why, extra={"txn": chunk.txn})
        return f"{exc}: some record is not exactly one {self.section.input_format} row, and {why}; the txn will abort"

    def _isolate(self, stage_table: str, token: str, records: Sequence[RecordLike]) -> list[Letter]:
        """JSON records that are not one object, then a bisection of the rest on a Null-engine clone
        (the records' rows only are counted there: no metadata column is filled)."""
        letters: list[Letter] = []
        rest: Sequence[RecordLike] = records
        fmt = self.section.input_format
        if fmt in JSON_OBJECT_FORMATS:
            rest = []
            for record in records:
                if problem := json_problem(record.value()):  # type: ignore[arg-type]  # prechecked: never None
                    letters.append(Letter(record, f"not one row: {problem}"))
                else:
                    rest.append(record)
        probe_table = naming.probe_table(stage_table, token)
        db = _ident(self.section.database)
        settings = {k: v for k, v in self._settings().items() if k != "insert_deduplicate"}

        def probe(part: Sequence[RecordLike]) -> int:
            try:
                summary = self._retrying(f"probe {len(part)} records in {probe_table}")(
                    self.client.raw_insert,
                    probe_table,
                    insert_block=frame(part, fmt),
                    fmt=self.section.input_format,
                    settings=settings,
                )
            except ClickHouseError as exc:
                if classify(exc.code) is ErrorClass.DATA:
                    raise Refused(str(exc), exc.code) from None
                raise
            if "written_rows" not in (summary.summary or {}):
                raise ClickHouseError("the server reports no written_rows for inserts: cannot count rows per record")
            return summary.written_rows

        self._retrying(f"create {probe_table}")(
            self.client.command,
            f"CREATE TABLE IF NOT EXISTS {db}.{_ident(probe_table)} AS {db}.{_ident(stage_table)} ENGINE = Null",
        )
        try:
            letters += isolate(rest, probe)
        finally:
            self._retrying(f"drop {probe_table}")(
                self.client.command, f"DROP TABLE IF EXISTS {db}.{_ident(probe_table)}"
            )
        return sorted(letters, key=lambda letter: letter.record.offset())


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
