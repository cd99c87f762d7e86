"""The pipeline configuration: one TOML file, decoded into frozen Structs.

Every field can be overridden by an environment variable ``CHTXN_<SECTION>_<FIELD>``
(e.g. ``CHTXN_CLICKHOUSE_PASSWORD``); lists take comma-separated values. Unknown keys are
refused with their path. librdkafka properties pass through untouched under
``[kafka.properties]``. The sections, each field with its description, are in
``protocol.config.sections`` (re-exported here). ``parse_config`` takes text and a mapping;
``load_config`` reads the file; neither reads the environment itself: the caller (the CLI, the
Spark job's driver) passes ``os.environ``. A refused value from a variable is named by the
variable; ``unknown_variables`` lists the ``CHTXN_*`` variables that override nothing (misspellings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

import msgspec

from protocol import insert_settings, routing, secrets, shards, topic_patterns
from protocol.config import env as config_env, keys as config_keys
from protocol.config.pipeline import PipelineConfig
from protocol.errors import ConfigError
from protocol.framing import JSON_OBJECT_FORMATS

_IDENT = r"^[A-Za-z_][A-Za-z0-9_]*$"
_TOPIC = r"^[A-Za-z0-9._-]+$"


class _FieldError(ConfigError):
    """A value refused by validation: ``why`` without the key and value, so that the message can
    name where the value came from (the file or an environment variable)."""

    def __init__(self, key: str, value: object, why: str) -> None:
        super().__init__(f"{key} = {value!r}: {why}", key=key, value=value)
        self.why = why


def _located(source: str, origins: Mapping[str, str], environ: Mapping[str, str], error: _FieldError) -> ConfigError:
    """``error`` naming the environment variable its value came from, else the file ``source``."""
    key, value = error.key, error.value
    base = next((k for k in origins if key == k or key.startswith((f"{k}.", f"{k}["))), None)
    if base is None:
        return ConfigError(f"{source}: {error}", key=key, value=value)
    var = origins[base]
    raw = secrets.masked(base, environ[var])
    same = key == base and not (isinstance(value, str) and value != raw)  # else name the part refused
    named = f"{var}={raw!r}" if same else f"{var}={raw!r} ({key} = {value!r})"
    return ConfigError(
        f"{named}: {error.why} (from the environment, overriding {base} of {source})", key=key, value=value
    )


def _merge(base: dict, overrides: dict[str, dict[str, object]]) -> dict:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, fields in overrides.items():
        merged.setdefault(section, {}).update(fields)
    return merged


def validate(config: PipelineConfig) -> None:
    """``ConfigError`` naming the first key of ``config`` whose value is wrong (``parse_config`` without the
    file: for a config derived from a parsed one)."""
    import re

    def bad(key: str, value: object, why: str) -> ConfigError:
        return _FieldError(key, secrets.masked(key, value), why)

    p, ch, tx, pa = config.pipeline, config.clickhouse, config.transaction, config.participant
    if not p.name or not re.match(_IDENT, p.name):
        raise bad("pipeline.name", p.name, "required; letters, digits and '_' only, not starting with a digit")
    if config.route and (p.topics or ch.target_table):
        key = "pipeline.topics" if p.topics else "clickhouse.target_table"
        raise bad(
            key,
            p.topics or ch.target_table,
            "set either [[route]] tables or pipeline.topics with "
            "clickhouse.target_table (the one-table form), not both",
        )
    where = "route" if config.route else "pipeline.topics"
    if not config.route and not p.topics:
        raise bad("pipeline.topics", list(p.topics), "list at least one source topic")
    for i, route in enumerate(config.route):
        if not route.topics:
            raise bad(f"route[{i}].topics", list(route.topics), "list at least one source topic of this route")
        if not route.table or not re.match(_IDENT, route.table):
            raise bad(f"route[{i}].table", route.table, "required; a plain table name in clickhouse.database")
    for i, route in enumerate(config.routes):
        key = f"route[{i}].topics" if config.route else "pipeline.topics"
        for topic in topic_patterns.names(route.topics):
            if not re.match(_TOPIC, topic):
                raise bad(key, topic, "not a valid Kafka topic name (or re:<regex> for every topic it matches)")
        for spec in filter(topic_patterns.is_pattern, route.topics):
            try:
                pattern = topic_patterns.compile_pattern(spec)
            except re.error as exc:
                raise bad(key, spec, f"not a regular expression after re: ({exc})") from None
            if hit := [t for t in (config.control_topic, config.dead_letter_topic) if pattern.fullmatch(t)]:
                raise bad(key, spec, f"matches {hit[0]}, the pipeline's own control or dead-letter topic: narrow it")
    for table in config.tables:
        if len(modes := {r.publish_mode for r in config.route if r.table == table and r.publish_mode}) > 1:
            raise bad("route", table, f"its routes set different publish_mode values ({', '.join(sorted(modes))})")
    for topic in topic_patterns.names(config.source_topics):
        if len(claimed := routing.tables_of(topic, config.routes)) > 1:
            raise bad(where, topic, f"goes to more than one table ({', '.join(claimed)}): route each topic once")
    for topic in (config.control_topic, config.dead_letter_topic):
        if not re.match(_TOPIC, topic):
            raise bad("pipeline.control_topic", topic, "not a valid Kafka topic name")
    if {config.control_topic, config.dead_letter_topic} & set(config.source_topics):
        raise bad(
            "pipeline.control_topic", config.control_topic, "control and dead-letter topics must not be source topics"
        )
    if not config.route and (not ch.target_table or not re.match(_IDENT, ch.target_table)):
        raise bad("clickhouse.target_table", ch.target_table, "required; a plain table name in clickhouse.database")
    if not re.match(_IDENT, ch.database):
        raise bad("clickhouse.database", ch.database, "letters, digits and '_' only")
    if ch.cluster and not re.match(_IDENT, ch.cluster):
        raise bad("clickhouse.cluster", ch.cluster, "a cluster name of system.clusters: letters, digits and '_' only")
    if config.ledger.keeper_path and not re.match(r"^(/[A-Za-z0-9_.-]+)+$", config.ledger.keeper_path):
        raise bad("ledger.keeper_path", config.ledger.keeper_path, "an absolute Keeper path such as /chtxn/default")
    if not ch.url.startswith(("http://", "https://")):
        raise bad("clickhouse.url", ch.url, "must start with http:// or https://")
    for shard in ch.shards:
        if not shard.startswith(("http://", "https://")):
            raise bad("clickhouse.shards", shard, "every shard's URL must start with http:// or https://")
        if urlsplit(shard).username or urlsplit(shard).password:
            raise bad(
                "clickhouse.shards",
                secrets.mask_url(shard),
                "a shard's URL holds a user or password: set clickhouse.user and .password",
            )
    if len({shards.address(u) for u in ch.shards}) < len(ch.shards):
        raise bad("clickhouse.shards", ", ".join(ch.shards), "names one server twice: list one server per shard")
    # placed by a key, the shards, the key and the weights may come from a Distributed target
    # (protocol.tables.distributed, which checks that the three are complete once learnt)
    if ch.placement == "sharding-key":
        if ch.sharding_key and (problem := shards.key_problem(ch.sharding_key)):
            raise bad("clickhouse.sharding_key", ch.sharding_key, problem)
        if len({urlsplit(u).scheme for u in ch.shards}) > 1:
            raise bad("clickhouse.shards", ", ".join(ch.shards), "mixes http:// and https://: use one for every shard")
    if ch.shard_weights and (
        (ch.shards and len(ch.shard_weights) != len(ch.shards))
        or min(ch.shard_weights) < 0
        or not sum(ch.shard_weights)
    ):
        raise bad(
            "clickhouse.shard_weights",
            ch.shard_weights,
            f"one weight of 0 or more per shard ({len(ch.shards)} shards), at least one above 0",
        )
    if not re.match(r"^[A-Za-z0-9]+$", ch.input_format):
        raise bad("clickhouse.input_format", ch.input_format, "a ClickHouse input format name, e.g. JSONEachRow")
    positive = {
        "transaction.interval_s": tx.interval_s,
        "transaction.size_trigger_rows": tx.size_trigger_rows,
        "transaction.write_status_timeout_s": tx.write_status_timeout_s,
        "transaction.heartbeat_interval_s": tx.heartbeat_interval_s,
        "transaction.heartbeat_misses": tx.heartbeat_misses,
        "kafka.control_fetch_wait_ms": config.kafka.control_fetch_wait_ms,
        "participant.chunk_rows": pa.chunk_rows,
        "participant.chunk_bytes": pa.chunk_bytes,
        "participant.poll_batch": pa.poll_batch,
        "coordinator.leader_lease_s": config.coordinator.leader_lease_s,
        "coordinator.ledger_checkpoint_every": config.coordinator.ledger_checkpoint_every,
        "coordinator.ledger_retention_days": config.coordinator.ledger_retention_days,
    }
    for key, value in positive.items():
        if value <= 0:
            raise bad(key, value, "must be greater than 0")
    if tx.idle_interval_s < 0:
        raise bad(
            "transaction.idle_interval_s", tx.idle_interval_s, "must be 0 or more (0: idle txns end at interval_s)"
        )
    if config.heartbeat_timeout_s >= tx.write_status_timeout_s:
        raise bad(
            "transaction.heartbeat_misses",
            tx.heartbeat_misses,
            f"heartbeat_interval_s x heartbeat_misses ({config.heartbeat_timeout_s:g} s) must be shorter "
            f"than write_status_timeout_s ({tx.write_status_timeout_s:g} s)",
        )
    if "group.id" in config.kafka.properties or "bootstrap.servers" in config.kafka.properties:
        raise bad(
            "kafka.properties",
            dict(config.kafka.properties),
            "set bootstrap servers in kafka.bootstrap_servers; group ids are chtxn's",
        )
    if not -20 <= config.coordinator.clickhouse_nice <= 19:
        raise bad(
            "coordinator.clickhouse_nice",
            config.coordinator.clickhouse_nice,
            "a nice value is between -20 (first) and 19 (last); 0 leaves the server's default",
        )
    for setting, setting_value in ch.insert_settings.items():
        if why := insert_settings.problem(setting, setting_value):
            raise bad(f"clickhouse.insert_settings.{setting}", setting_value, why)
    _validate_schema(config, bad)


def _validate_schema(config: PipelineConfig, bad: Callable[[str, object, str], ConfigError]) -> None:
    """``[schema]``: its modes read the records' fields, so they need a JSON object input format, and
    ``add-columns`` needs the input format settings it sets on every chunk insert."""
    schema, ch = config.schema, config.clickhouse
    if schema.evolve != "off" and schema.unknown_fields != "ignore":
        raise bad(
            "schema.unknown_fields",
            schema.unknown_fields,
            'applies with schema.evolve = "off" only (add-columns adds a column for every field): remove one',
        )
    if ch.input_format not in JSON_OBJECT_FORMATS:
        for key, value, default in (
            ("schema.evolve", schema.evolve, "off"),
            ("schema.unknown_fields", schema.unknown_fields, "ignore"),
        ):
            if value != default:
                raise bad(
                    key,
                    value,
                    f"reads the top-level fields of JSON objects, but clickhouse.input_format is {ch.input_format!r}: "
                    f"use JSONEachRow records or set {key} = {default!r}",
                )
    if schema.evolve == "add-columns":
        for setting, setting_value in ch.insert_settings.items():
            if why := insert_settings.add_columns_problem(setting, setting_value):
                raise bad(f"clickhouse.insert_settings.{setting}", setting_value, why)


def _path_of(error: msgspec.ValidationError) -> str:
    # msgspec says e.g. "Object contains unknown field `x` - at `$.transaction`"
    text = str(error)
    at = text.rsplit(" - at `", 1)
    where = at[1].rstrip("`").removeprefix("$").lstrip(".") if len(at) == 2 else ""
    return where


def parse_config(text: str, environ: Mapping[str, str] | None = None, *, source: str = "<config>") -> PipelineConfig:
    """Decode a TOML pipeline configuration, apply ``CHTXN_*`` overrides from ``environ``, validate."""
    try:
        raw = msgspec.toml.decode(text.encode())
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    overrides = config_env.overrides(environ or {})
    origins = {f"{s}.{f}": f"CHTXN_{s}_{f}".upper() for s, fields in overrides.items() for f in fields}
    merged = _merge(raw, overrides)
    try:
        config = msgspec.convert(merged, PipelineConfig, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        key = _path_of(exc)
        unknown = message.split("unknown field `", 1)
        if len(unknown) == 2:
            field = unknown[1].split("`", 1)[0]
            close = config_keys.suggest(PipelineConfig, key, field)
            key = f"{key}.{field}" if key else field
            hint = f"did you mean {close!r}?" if close else "check its spelling against the docs"
            raise ConfigError(f"{source}: unknown key {key!r}: {hint}", key=key) from None
        value = secrets.masked(key, _lookup(merged, key))
        raise _located(source, origins, environ or {}, _FieldError(key, value, message.split(" - at ", 1)[0])) from None
    try:
        validate(config)
        config = _credentials_from_url(config)
    except _FieldError as exc:
        raise _located(source, origins, environ or {}, exc) from None
    secrets.remember(
        [config.clickhouse.password, *(v for k, v in config.kafka.properties.items() if secrets.is_secret_key(k))]
    )
    return config


def _credentials_from_url(config: PipelineConfig) -> PipelineConfig:
    """``clickhouse.url``'s user and password moved into ``clickhouse.user`` and ``.password``, so
    they are used to connect and the URL holds none (every message may then show it). A URL whose
    user or password differs from one also set on its own is refused."""
    ch = config.clickhouse
    parts = urlsplit(ch.url)
    if parts.username is None and parts.password is None:
        return config
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    shown = secrets.mask_url(ch.url)
    if password and ch.password and password != ch.password:
        raise _FieldError(
            "clickhouse.url", shown, "holds a password other than clickhouse.password; set it in one place"
        )
    if user and ch.user not in ("default", user):
        raise _FieldError(
            "clickhouse.url", shown, f"holds user {user!r}, but clickhouse.user is {ch.user!r}; set it in one place"
        )
    url = urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
    section = msgspec.structs.replace(ch, url=url, user=user or ch.user, password=password or ch.password)
    return msgspec.structs.replace(config, clickhouse=section)


def _lookup(tree: dict, path: str) -> object:
    node: object = tree
    for part in path.replace("[", ".").replace("]", "").split("."):
        if not part:
            continue
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def load_config(path: str, environ: Mapping[str, str] | None = None) -> PipelineConfig:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the pipeline config {path!r}: {exc.strerror}; pass --config FILE") from None
    return parse_config(text, environ, source=path)
