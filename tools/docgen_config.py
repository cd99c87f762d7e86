"""``docs/configuration.md`` (``tools.docgen``): every section Struct of ``PipelineConfig``
(``protocol/config/sections.py``) and its fields: type, default, the ``msgspec.Meta`` description
on the field (with its ``extra["brief"]`` remark), and the ``CHTXN_<SECTION>_<FIELD>`` environment
override; plus the prose in ``SECTION_PROSE`` below.
"""

from __future__ import annotations

import json
import re
import types
import typing

import msgspec

from tools.docgen_markdown import banner, md, table

SECTION_PROSE: dict[str, str] = {
    "route": (
        "Many tables per pipeline, with one commit point across them: each `[[route]]` sends the records "
        "of its topics to its table. Use it instead of `pipeline.topics` with `clickhouse.target_table` "
        "(the one-table form, which is one route). A txn stages into one stage table per table with "
        "records waiting (an idle table costs a txn nothing; its first records after idling wait one txn "
        "longer), and its one COMMITTED ledger row commits them all. What a reader of two tables can see "
        "between their publishes is in docs/architecture.md, section 12.\n\n"
        '```toml\n[[route]]\ntopics = ["orders", "re:orders-eu-.*"]\ntable = "orders"\n\n'
        '[[route]]\ntopics = ["clicks"]\ntable = "clicks"\n```'
    ),
    "pipeline": (
        "What the pipeline reads and where its control messages and dead letters go. The name "
        "scopes everything the pipeline creates (ledger rows, stage tables, tokens, consumer "
        "groups), so several pipelines can share a ClickHouse database and a target table."
    ),
    "kafka": (
        "How every chtxn process reaches Kafka. `[kafka.properties]` passes librdkafka properties "
        "through untouched to every client (consumers, producers, the admin client), after "
        "chtxn's defaults: put security settings here (`security.protocol`, `sasl.*`, `ssl.*`). "
        "Keys that name a secret (`password`, `secret`, `token`, `jaas`, ...) are masked wherever "
        "chtxn shows them. `bootstrap.servers` and "
        "`group.id` are refused there: the first has its own key, the group ids are chtxn's."
    ),
    "clickhouse": (
        "The ClickHouse server (its HTTP interface), the target table and how records are "
        "inserted. The ledger table `chtxn_ledger` and the stage tables live in the same "
        "database as the target. Every chtxn insert is synchronous (`async_insert = 0`) and "
        "deduplicated by token, whatever `insert_settings` says."
    ),
    "transaction": (
        "When a transaction ends, how long the coordinator waits for participants, and how "
        "committed rows reach the target. The coordinator sends END-COMMIT after `interval_s`, "
        "or earlier once the participants' heartbeats report `size_trigger_rows` rows read. "
        "A participant is dead after `heartbeat_interval_s x heartbeat_misses` seconds of "
        "silence, which must be shorter than `write_status_timeout_s`."
    ),
    "participant": (
        "How a participant cuts records into chunks (one insert each, with a deduplication token "
        "that carries the chunk's offset range) and how the Spark job is laid out. A chunk is "
        "cut by row count or byte size only, never by time, so a retried chunk holds the same "
        "records."
    ),
    "schema": (
        "What happens to top-level JSON fields the target has no column for: ignored (the default), "
        "dead-lettered, or added as columns before their rows are staged (opt-in). See "
        "[architecture](architecture.md#schema-evolution) for the type rules and "
        "[operations](operations.md#schema-evolution) for turning it on."
    ),
    "coordinator": ("The coordinator replicas: their ids, the leader's lease, metrics and ClickHouse retries."),
}

#: Values of the required fields in the complete example.
EXAMPLE_VALUES: dict[str, object] = {
    "pipeline.name": "orders",
    "pipeline.topics": ("orders",),
    "clickhouse.target_table": "orders",
}

VALIDATION_RULES = (
    "`pipeline.name` is required: letters, digits and `_`, not starting with a digit.",
    "`pipeline.topics` lists at least one topic; every topic name is a valid Kafka topic name, and "
    "neither the control topic nor the dead-letter topic is a source topic.",
    "`clickhouse.target_table` is required: a plain table name in `clickhouse.database`.",
    "With `[[route]]` tables instead, `pipeline.topics` and `clickhouse.target_table` are not set; every "
    "route has topics and a plain table name, and a named topic goes to one table only (a topic that "
    "the patterns of two tables' routes match is held when the partitions are listed: none of its "
    "records are read, the leader logs it, `chtxn status` fails its routes check and the metric "
    "`chtxn_topic_held` is 1, while every other topic is read).",
    "`clickhouse.url` starts with `http://` or `https://`; `clickhouse.input_format` is a format name.",
    "Intervals, timeouts, counts and sizes are greater than 0 (`participant.task_slots` and "
    "`coordinator.metrics_port` may be 0).",
    "`transaction.heartbeat_interval_s x transaction.heartbeat_misses` is shorter than "
    "`transaction.write_status_timeout_s`.",
    "`[kafka.properties]` holds neither `bootstrap.servers` nor `group.id`.",
    "`[clickhouse.insert_settings]` holds no setting that would let ClickHouse skip, invent or merge rows, "
    "nor one that turns off synchronous, deduplicated inserts (`protocol/insert_settings.py`).",
    '`schema.evolve = "add-columns"` and `schema.unknown_fields = "dead-letter"` need a JSON object '
    "`clickhouse.input_format` (JSONEachRow and its aliases), and go one at a time; with `add-columns`, "
    "`[clickhouse.insert_settings]` does not turn off the input format settings it sets "
    "(`ADD_COLUMNS_SETTINGS` in `protocol/insert_settings.py`).",
)


def config_sections() -> dict[str, type]:
    """The TOML sections of ``PipelineConfig`` (``[[route]]``, an array of tables, is not one)."""
    from protocol.config.parse import PipelineConfig

    return {f.name: f.type for f in msgspec.structs.fields(PipelineConfig) if isinstance(f.type, type)}


def documented_sections() -> dict[str, type]:
    """The sections and ``[[route]]`` (the struct of one route), as the configuration page lists them."""
    from protocol.config.sections import RouteSection

    return {**config_sections(), "route": RouteSection}


def field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """Field name -> (description, brief remark), from the ``msgspec.Meta`` in each field's
    ``Annotated`` type ("" where a field has none)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs: dict[str, tuple[str, str]] = {}
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]  # a msgspec Struct class
        metas = [m for m in getattr(hints[name], "__metadata__", ()) if isinstance(m, msgspec.Meta)]
        description = " ".join(m.description for m in metas if m.description)
        brief = " ".join(str((m.extra or {}).get("brief", "")) for m in metas).strip()
        docs[name] = (description, brief)
    return docs


def unannotated(tp: object) -> object:
    """``tp`` without its ``Annotated`` wrapper."""
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def env_var(section: str, field: str) -> str:
    """The override variable ``protocol.config.parse`` reads for ``section.field``."""
    return f"CHTXN_{section}_{field}".upper()


def is_table(field: msgspec.structs.FieldInfo) -> bool:
    tp = unannotated(field.type)
    return typing.get_origin(tp) is dict or tp is dict


def type_name(tp: object) -> str:
    tp = unannotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(f'`"{a}"`' for a in args)
    if origin in (tuple, list):
        return f"array of {type_name(args[0])}s"
    if origin is dict:
        return f"table of {type_name(args[1])} values"
    if origin in (typing.Union, types.UnionType):
        names = [type_name(a) for a in args]
        return ", ".join(names[:-1]) + " or " + names[-1]
    scalars: dict[object, str] = {str: "string", int: "integer", float: "float", bool: "boolean"}
    return scalars.get(tp, getattr(tp, "__name__", str(tp)))


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def default_of(field: msgspec.structs.FieldInfo) -> object:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    return field.default_factory()


def _quoted_as_code(text: str) -> str:
    """Double-quoted values in a brief remark as code spans: ``default "<name>.x"`` -> ``default `<name>.x```."""
    return re.sub(r'"([^"`]*)"', r"`\1`", text)


def sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def configuration_page() -> str:
    sections = documented_sections()
    out = [
        banner("protocol/config/sections.py"),
        "",
        "# Configuration",
        "",
        "A pipeline is configured by one TOML file, passed to every command as `--config FILE`. "
        "Every process of the pipeline (coordinator replicas, the participant job, the CLI) reads "
        "the same file. What the fields do inside the protocol is in [architecture.md](architecture.md).",
        "",
        "- **Unknown keys are refused**, with their path (`unknown key 'transaction.intervl_s'`), "
        "and so are values of the wrong type, naming the key, the value and why.",
        "- **Environment overrides**: every field can be set by `CHTXN_<SECTION>_<FIELD>` (upper case), "
        "e.g. `CHTXN_CLICKHOUSE_PASSWORD` or `CHTXN_KAFKA_BOOTSTRAP_SERVERS`; the variable wins over "
        "the file. Arrays take comma-separated values (`CHTXN_PIPELINE_TOPICS=orders,payments`). "
        "Tables (`kafka.properties`, `clickhouse.insert_settings`) can be set only in the file.",
        "- **Secrets** never appear in an error, a log line, a table or `--json` output: "
        "`clickhouse.password`, the password in `clickhouse.url`, and every Kafka property whose key "
        "names a secret (`password`, `secret`, `token`, `jaas`, `.pem`, `credential`, `apikey`; "
        "`protocol/secrets.py`) show as `***`.",
        "- Only `[pipeline]` `name` and `topics` and `[clickhouse]` `target_table` are required; "
        "everything else has a default.",
        "",
        "The checks made when a config is loaded, beyond types:",
        "",
        *[f"- {rule}" for rule in VALIDATION_RULES],
        "",
        "A config that fails them is refused at start with exit code 2 "
        "(see [troubleshooting.md](troubleshooting.md#configuration)).",
        "",
        "Sections: " + ", ".join(f"[`[{name}]`](#{name})" for name in sections) + ", "
        "[a complete example](#a-complete-example).",
    ]
    for section, cls in sections.items():
        rows: list[tuple[str, ...]] = []
        docs = field_docs(cls)
        for field in msgspec.structs.fields(cls):
            note, brief = docs[field.name]
            description = " ".join(p for p in (md(note), md(sentence(_quoted_as_code(brief)))) if p)
            if section == "route":
                env = "file only"
            elif is_table(field):
                env = "file only (a table)"
            else:
                env = f"`{env_var(section, field.name)}`"
                if typing.get_origin(unannotated(field.type)) in (tuple, list):
                    env += " (comma-separated)"
            rows.append(
                (f"`{field.name}`", md(type_name(field.type)), f"`{toml_value(default_of(field))}`", env, description)
            )
        out += [
            "",
            f"## `[[{section}]]`" if section == "route" else f"## `[{section}]`",
            "",
            SECTION_PROSE.get(section, ""),
            "",
            table(("key", "type", "default", "environment", "description"), rows),
        ]
    out += [
        "",
        "## A complete example",
        "",
        "Every field with its default, and example values for the required ones:",
        "",
        "```toml",
        example_toml(),
        "```",
        "",
    ]
    return "\n".join(out)


def example_toml() -> str:
    lines: list[str] = []
    for section, cls in config_sections().items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        docs = field_docs(cls)
        for field in msgspec.structs.fields(cls):
            value = EXAMPLE_VALUES.get(f"{section}.{field.name}", default_of(field))
            line = f"{field.name} = {toml_value(value)}"
            brief = docs[field.name][1]
            lines.append(f"{line:<40}# {brief}" if brief else line)
    return "\n".join(lines)
