"""Stager step 1.5 (``participant.stager``): the fields a chunk's records carry that its stage table
lacks, by ``[schema]`` (the rules are ``protocol.tables.schema_types``'s; docs/architecture.md, Schema
evolution).

- ``evolve = "add-columns"``: each new field with a non-null value becomes a column of the target
  (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``, ``ON CLUSTER`` with ``clickhouse.cluster``), then
  of the stage table with the type the target has then (read back from ``system.columns``: another
  participant may have added it first, with another type), before the chunk is inserted, so no
  row loses the field. Target first, then stage: a stage table never has a column its target
  lacks. A retryable failure of an ALTER is retried; any other, or retries running out, fails
  the chunk (``SchemaEvolutionError``), so its txn aborts and the records are read again: nothing
  is dropped.
- ``unknown_fields = "dead-letter"`` (with ``evolve = "off"``): a record carrying a non-null field
  the stage table has no column for becomes a dead letter naming the field.
- ``name_fields``: a dead letter ClickHouse refused gets the field whose value its column cannot
  read named first in its error, when the JSON kind tells which (any mode, JSON object formats).

Columns are read from ``system.columns`` once per stage table and cached; a field the cache lacks
is looked up again before anything is added or refused, so the cache is only ever a fast path.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from participant.bad_records import Letter
from protocol import naming
from protocol.chcodes import ErrorClass, classify
from protocol.chunking import RecordLike
from protocol.config.sections import ClickHouseSection, SchemaSection
from protocol.errors import ChtxnError, ClickHouseError
from protocol.framing import JSON_OBJECT_FORMATS
from protocol.tables import replicated_ddl, schema_types

log = logging.getLogger(__name__)

#: Stage tables whose columns are cached (a txn has one; the spare is the next).
CACHED_TABLES = 16
_COLUMNS_SQL = (
    "SELECT table, name, type FROM system.columns WHERE database = {db:String} AND table IN {names:Array(String)} "
    "ORDER BY table, position"
)


class SchemaEvolutionError(ChtxnError):
    """A column could not be added: the chunk fails, its txn aborts, its records are read again."""

    def __init__(self, message: str, *, fields: Sequence[str], code: int = 0) -> None:
        super().__init__(message)
        self.fields, self.code = tuple(fields), code


class SchemaEvolution:
    """Stager step 1.5 for one ``Stager``; ``retrying(what)`` is its retry policy. Thread-safe: the
    insert workers of a task share it, and its ALTERs run one at a time."""

    def __init__(
        self,
        *,
        client: Any,
        section: ClickHouseSection,
        schema: SchemaSection,
        retrying: Callable[[str], Any],
        pipeline: str = "",
    ) -> None:
        self.client, self.section, self.schema, self.pipeline = client, section, schema, pipeline
        self._retrying = retrying
        json_objects = section.input_format in JSON_OBJECT_FORMATS
        self.adds = json_objects and schema.evolve == "add-columns"
        self.refuses = json_objects and schema.evolve == "off" and schema.unknown_fields == "dead-letter"
        self.names_fields = json_objects
        self._columns: OrderedDict[str, dict[str, str]] = OrderedDict()
        self._lock = threading.Lock()  # the cache
        self._ddl = threading.Lock()  # one ALTER sequence at a time in this process

    @property
    def scans(self) -> bool:
        """Whether stager step 1.5 reads the records' fields at all (else it costs nothing)."""
        return self.adds or self.refuses

    # ---- stager step 1.5 --------------------------------------------------------------------

    def prepare(
        self, stage_table: str, records: Sequence[RecordLike], txn: str = ""
    ) -> tuple[Sequence[RecordLike], list[Letter]]:
        """Stager step 1.5: (records to insert, letters): with ``add-columns`` every new field with a
        value is a column of ``stage_table``'s target (the table its name says it stages ``txn``
        into: with ``[[route]]``, its topic's table) and of ``stage_table`` when this returns; with
        ``dead-letter`` the records carrying a field ``stage_table`` lacks are letters. Raises
        ``SchemaEvolutionError`` (or ``ClickHouseError`` for a read) when a column cannot be added."""
        if not self.scans or not records:
            return records, []
        values: list[bytes] = [r.value() for r in records]  # type: ignore[misc]  # prechecked: never None
        found = schema_types.scan_fields(values, self.columns(stage_table).keys())
        if not found.unknown:
            return records, []
        if self.adds:
            named = {name for names in found.unknown.values() for name in names}
            self._add_columns(stage_table, txn, {n: t for n, t in found.types().items() if n in named})
            errors = {
                i: schema_types.bad_name_error(bad[0])
                for i, names in found.unknown.items()
                if (bad := [n for n in names if schema_types.name_problem(n)])
            }
        else:
            known = self.columns(stage_table, fresh=True)
            errors = {
                i: schema_types.unknown_field_error(missing)
                for i, names in found.unknown.items()
                if (missing := [n for n in names if n not in known])
            }
        if not errors:
            return records, []
        kept = [r for i, r in enumerate(records) if i not in errors]
        return kept, [Letter(records[i], error) for i, error in sorted(errors.items())]

    def target_of(self, stage_table: str, txn: str) -> str:
        """The table ``stage_table`` (of ``txn``) is published into: the one its name begins with (each
        routed table's own), else ``clickhouse.target_table``; ``SchemaEvolutionError`` when neither tells."""
        target = naming.table_of_stage(stage_table, self.pipeline, txn) or self.section.target_table
        if not target:
            raise SchemaEvolutionError(
                f"cannot tell which table stage table {self.section.database}.{stage_table} of txn {txn!r} belongs "
                f"to (pipeline {self.pipeline!r}): no column can be added; the txn aborts and its records are read "
                "again",
                fields=(),
            )
        return target

    def _add_columns(self, stage_table: str, txn: str, types: dict[str, str]) -> None:
        """Add each field of ``types`` (name -> inferred type) that can be a column to the target,
        then to ``stage_table`` with the target's type, placed as in the target."""
        wanted = {name: kind for name, kind in types.items() if schema_types.addable(name)}
        if not wanted:
            return
        db, target, cluster = self.section.database, self.target_of(stage_table, txn), self.section.cluster
        with self._ddl:
            tables = self._read(stage_table, target)
            stage, theirs = tables.get(stage_table, {}), tables.get(target, {})
            if not stage:
                raise ClickHouseError(f"stage table {db}.{stage_table} does not exist (or has no columns)")
            wanted = {name: kind for name, kind in wanted.items() if name not in stage}
            if not wanted:
                self._remember(stage_table, stage)
                return
            new: list[tuple[str, str, str | None]] = [
                (name, kind, None) for name, kind in wanted.items() if name not in theirs
            ]
            if new:
                log.warning(
                    "adding columns %s to %s.%s for fields its records carry (schema.evolve = add-columns)",
                    ", ".join(f"{name} {kind}" for name, kind, _ in new),
                    db,
                    target,
                )
                self._alter(target, new, cluster, wanted)
                theirs = self._read(target).get(target, {})
            additions = schema_types.stage_additions(list(theirs.items()), stage.keys(), wanted.keys())
            if len(additions) < len(wanted):
                missing = sorted(set(wanted) - {name for name, _, _ in additions})
                raise SchemaEvolutionError(
                    f"columns {', '.join(missing)} are still missing from {db}.{target} after ALTER TABLE ... ADD "
                    "COLUMN: check that chtxn's user may ALTER the target; the txn aborts and its records are read "
                    "again",
                    fields=missing,
                )
            self._alter(stage_table, additions, cluster, wanted)
            self._remember(stage_table, self._read(stage_table).get(stage_table, {}))

    def _alter(
        self, table: str, columns: list[tuple[str, str, str | None]], cluster: str, wanted: dict[str, str]
    ) -> None:
        qualified = f"{schema_types.ident(self.section.database)}.{schema_types.ident(table)}"
        sql = schema_types.add_columns_sql(qualified, columns, on_cluster=replicated_ddl.on_cluster(cluster))
        try:
            self._retrying(f"add columns to {self.section.database}.{table}")(self.client.command, sql)
        except ClickHouseError as exc:
            added = ", ".join(f"{name} {kind}" for name, kind, _ in columns)
            raise SchemaEvolutionError(
                f"cannot add columns {added} to {self.section.database}.{table} for fields the records carry "
                f'(schema.evolve = "add-columns"): {exc}; the txn aborts and its records are read again: grant '
                'chtxn\'s user ALTER ADD COLUMN on the table, or set schema.evolve = "off"',
                fields=list(wanted),
                code=exc.code,
            ) from None

    # ---- the columns ------------------------------------------------------------------------

    def columns(self, table: str, *, fresh: bool = False) -> dict[str, str]:
        """name -> type of ``table``'s columns, from the cache unless ``fresh``; raises
        ``ClickHouseError`` when the table does not exist."""
        if not fresh:
            with self._lock:
                if table in self._columns:
                    return self._columns[table]
        found = self._read(table).get(table)
        if not found:
            raise ClickHouseError(f"table {self.section.database}.{table} does not exist (or has no columns)")
        self._remember(table, found)
        return found

    def _read(self, *tables: str) -> dict[str, dict[str, str]]:
        """name -> type of the columns of those of ``tables`` that exist, in order, in one query."""
        rows = self._retrying(f"read the columns of {', '.join(tables)}")(
            self.client.query, _COLUMNS_SQL, parameters={"db": self.section.database, "names": list(tables)}
        ).result_rows
        found: dict[str, dict[str, str]] = {}
        for table, name, kind in rows:
            found.setdefault(table, {})[name] = kind
        return found

    def _remember(self, table: str, columns: dict[str, str]) -> None:
        with self._lock:
            self._columns[table] = columns
            self._columns.move_to_end(table)
            while len(self._columns) > CACHED_TABLES:
                self._columns.popitem(last=False)

    # ---- naming the field of a refused record -------------------------------------------------

    def name_fields(self, stage_table: str, letters: list[Letter]) -> list[Letter]:
        """``letters`` (ClickHouse's refusals), each refused for its data led by the field whose
        value its column cannot read, when the JSON kind tells; unchanged when it does not, or
        when the columns cannot be read (it only words the error)."""
        if not self.names_fields or not any(classify(letter.code) is ErrorClass.DATA for letter in letters):
            return letters
        try:
            columns = self.columns(stage_table)
        except ChtxnError as exc:
            log.warning("cannot read the columns of %s to name the fields of dead letters: %s", stage_table, exc)
            return letters
        named = []
        for letter in letters:
            value = letter.record.value()
            found = (
                schema_types.conflict(value, columns) if value and classify(letter.code) is ErrorClass.DATA else None
            )
            named.append(letter._replace(error=schema_types.conflict_error(found, letter.error)) if found else letter)
        return named
