"""ClickHouse settings of chunk inserts: what every chunk insert sets, and what a config may not set.

The commit protocol counts on one row per record (the coordinator checks the stage table's
``count()`` against the rows reported) and on synchronous, deduplicated inserts. Settings that
let ClickHouse skip rows, invent or merge rows, or that turn either guarantee off are refused in
``clickhouse.insert_settings`` at config load, and the participant sets their safe values on
every chunk insert too (a server profile may have changed a default). Pure: no client imports.
"""

from __future__ import annotations

#: Set on every chunk insert, besides its ``insert_deduplication_token``. Settings a server does
#: not know are left out by the caller (``for_server``): older servers refuse unknown settings.
#: (``optimize_on_insert = 0`` keeps rows uncollapsed should a stage table ever merge rows away;
#: stage tables of merging targets are plain MergeTree, so a config may set it for the target.)
CHUNK_INSERT_SETTINGS: dict[str, int] = {
    "insert_deduplicate": 1,
    "async_insert": 0,
    "optimize_on_insert": 0,
    "input_format_allow_errors_num": 0,
    "input_format_allow_errors_ratio": 0,
    "input_format_csv_skip_first_lines": 0,
    "input_format_tsv_skip_first_lines": 0,
    "input_format_csv_detect_header": 0,
    "input_format_tsv_detect_header": 0,
    "input_format_custom_detect_header": 0,
}

#: Set on every chunk insert too with ``schema.evolve = "add-columns"`` (``for_server(add_columns=True)``):
#: a field whose values were all null has no column yet and is skipped (its rows get the default, as
#: a null would); objects and arrays are read into the String columns inferred for them as their
#: JSON text, and numbers and booleans as their text into a String column inferred for mixed values
#: (``protocol.tables.schema_types``). Each is ClickHouse's default; set here should a profile change it.
ADD_COLUMNS_SETTINGS: dict[str, int] = {
    "input_format_skip_unknown_fields": 1,
    "input_format_json_read_objects_as_strings": 1,
    "input_format_json_read_arrays_as_strings": 1,
    "input_format_json_read_numbers_as_strings": 1,
    "input_format_json_read_bools_as_strings": 1,
}

_REMOVE = "remove it from clickhouse.insert_settings"
_SKIPS = (
    "skips records silently, so a chunk stores fewer rows than it has records and its txn can never commit; "
    f"{_REMOVE} (chtxn sends records ClickHouse refuses to the dead-letter topic instead)"
)

#: setting -> (the only value allowed, why any other breaks chtxn, what to do).
_REQUIRED: dict[str, tuple[float, str]] = {
    "input_format_allow_errors_num": (0, f"skips up to that many bad rows and {_SKIPS}"),
    "input_format_allow_errors_ratio": (0, f"skips bad rows and {_SKIPS}"),
    "input_format_csv_skip_first_lines": (0, f"skips the first records of every chunk and {_SKIPS}"),
    "input_format_tsv_skip_first_lines": (0, f"skips the first records of every chunk and {_SKIPS}"),
    "input_format_csv_detect_header": (0, f"takes a first record that looks like a header for one and {_SKIPS}"),
    "input_format_tsv_detect_header": (0, f"takes a first record that looks like a header for one and {_SKIPS}"),
    "input_format_custom_detect_header": (0, f"takes a first record that looks like a header for one and {_SKIPS}"),
    "async_insert": (
        0,
        "chunk inserts must be synchronous: a chunk counts as staged only once ClickHouse has "
        f"stored it; {_REMOVE} or set it to 0",
    ),
    "insert_deduplicate": (
        1,
        "a retried insert would be stored twice; chtxn deduplicates every chunk by its "
        f"token: {_REMOVE} or set it to 1",
    ),
}
_FORBIDDEN: dict[str, str] = {
    "insert_deduplication_token": f"chtxn sets its own token on every chunk insert: {_REMOVE}",
}


def problem(setting: str, value: object) -> str | None:
    """Why ``setting = value`` in ``clickhouse.insert_settings`` breaks chtxn, or None when it is safe."""
    if setting in _FORBIDDEN:
        return _FORBIDDEN[setting]
    if setting not in _REQUIRED:
        return None
    required, why = _REQUIRED[setting]
    number = _number(value)
    return None if number is not None and number == required else why


def add_columns_problem(setting: str, value: object) -> str | None:
    """Why ``setting = value`` in ``clickhouse.insert_settings`` contradicts ``schema.evolve =
    "add-columns"``, or None."""
    if setting not in ADD_COLUMNS_SETTINGS or _number(value) == ADD_COLUMNS_SETTINGS[setting]:
        return None
    return (
        'schema.evolve = "add-columns" sets it to 1 on every chunk insert (it reads fields of every JSON type into '
        f"the String columns it infers, and skips fields seen only as null): {_REMOVE}"
    )


def for_server(known: object, *, add_columns: bool = False) -> dict[str, int]:
    """``CHUNK_INSERT_SETTINGS`` (and ``ADD_COLUMNS_SETTINGS`` with ``add_columns``) less those
    ``known`` (the server's settings) lacks; all when unknown."""
    wanted = {**CHUNK_INSERT_SETTINGS, **(ADD_COLUMNS_SETTINGS if add_columns else {})}
    if not isinstance(known, dict) or not known:
        return wanted
    return {k: v for k, v in wanted.items() if k in known}


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            return float(text == "true")
        try:
            return float(text)
        except ValueError:
            return None
    return None
