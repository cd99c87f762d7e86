"""Where each value of a pipeline config came from, and the checks a config allows without a running
pipeline (``chtxn config check``). Pure: the caller reads the file and passes ``os.environ``.

A value's source is the environment variable that overrode it (``CHTXN_<SECTION>_<FIELD>``), the
file, or the default; a default derived from another value says so (``default, from pipeline.name``),
and a user or password taken from ``clickhouse.url`` names the URL. Secrets are masked
(``protocol.secrets``): a value that is one reads ``***``, a URL shows no password.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from protocol import secrets
from protocol.checks import Check
from protocol.config.env import override_variables, unknown_variables
from protocol.config.parse import PipelineConfig

FILE, DEFAULT = "file", "default"
#: Defaults computed from other values: key -> what they come from.
DERIVED = {
    "pipeline.control_topic": "pipeline.name",
    "pipeline.dead_letter_topic": "pipeline.name",
    "ledger.keeper_path": "clickhouse.database",
    "coordinator.id": "the host name and process id of each coordinator",
}
#: Tables of free keys: one setting per entry.
TABLES = ("kafka.properties", "clickhouse.insert_settings")


class Setting(msgspec.Struct, frozen=True, kw_only=True):
    """One effective value: ``key`` (``section.field``, or ``section.table."entry"``), ``value``
    (masked when secret) and ``source``."""

    key: str
    value: Any
    source: str


def settings(cfg: PipelineConfig, text: str, environ: Mapping[str, str]) -> list[Setting]:
    """Every effective value of ``cfg``, decoded from TOML ``text`` with ``environ`` applied, in the
    order of the sections and their fields, each with its source."""
    tree = msgspec.toml.decode(text.encode())
    variables = {key: var for var, key in override_variables().items()}
    effective = msgspec.to_builtins(cfg)
    url_source = _source("clickhouse.url", tree, environ, variables)
    url = environ.get("CHTXN_CLICKHOUSE_URL") or tree.get("clickhouse", {}).get("url", "")
    parts = urlsplit(url) if isinstance(url, str) else None
    found: list[Setting] = []
    for section, fields in effective.items():
        if section == "route":  # ``[[route]]``: one setting per route, from the file
            found += [
                Setting(
                    key=f"route[{i}]",
                    value=f"{', '.join(r['topics'])} -> {r['table']}"
                    + (f" ({r['publish_mode']})" if r.get("publish_mode") else ""),
                    source=FILE,
                )
                for i, r in enumerate(fields)
            ]
            continue
        for field, value in fields.items():
            key = f"{section}.{field}"
            source = _source(key, tree, environ, variables)
            if key in TABLES and value:
                found += [
                    Setting(key=f'{key}."{name}"', value=secrets.masked(name, item), source=source)
                    for name, item in value.items()
                ]
                continue
            if source == DEFAULT and key in DERIVED:
                value = _derived(key, cfg)
                source = f"default, from {DERIVED[key]}"
            elif source == DEFAULT and parts is not None and _from_url(field, parts, key):
                source = f"clickhouse.url ({url_source})"
            found.append(Setting(key=key, value=_shown(key, value), source=source))
    return found


def _source(key: str, tree: Mapping[str, Any], environ: Mapping[str, str], variables: Mapping[str, str]) -> str:
    var = variables.get(key, "")
    if var in environ:
        return var
    section, _, field = key.partition(".")
    return FILE if field in tree.get(section, {}) else DEFAULT


def _derived(key: str, cfg: PipelineConfig) -> str:
    if key == "coordinator.id":
        return f"{cfg.coordinator_id.rsplit('-', 1)[0]}-<pid>"
    return {
        "pipeline.control_topic": cfg.control_topic,
        "pipeline.dead_letter_topic": cfg.dead_letter_topic,
        "ledger.keeper_path": cfg.keeper_path,
    }[key]


def _from_url(field: str, parts: Any, key: str) -> bool:
    return (key == "clickhouse.user" and bool(parts.username)) or (
        key == "clickhouse.password" and bool(parts.password)
    )


def _shown(key: str, value: Any) -> Any:
    if key == "clickhouse.url" and isinstance(value, str):
        return secrets.mask_url(value)
    return secrets.masked(key, value)


# ---- checks --------------------------------------------------------------------------------------


def environment_check(environ: Mapping[str, str]) -> Check:
    """fail: a ``CHTXN_*`` variable chtxn does not read (a misspelled override is otherwise ignored)."""
    unknown = unknown_variables(environ)
    applied = sorted(var for var in override_variables() if var in environ)
    if unknown:
        named = "; ".join(f"{var} (did you mean {close}?)" if close else var for var, close in unknown)
        return Check(
            name="environment",
            status="fail",
            found=f"{len(unknown)} CHTXN_* variable{'s' if len(unknown) != 1 else ''} chtxn does not read: {named}",
            fix="rename or unset them: each overrides nothing",
        )
    found = f"overrides applied: {', '.join(applied)}" if applied else "no CHTXN_* override set"
    return Check(name="environment", status="ok", found=found)


def secrets_check(cfg: PipelineConfig, found: list[Setting]) -> Check:
    """warn: the ClickHouse password stored in the file, or sent over plain HTTP to another host."""
    sources = {s.key: s.source for s in found}
    problems, fixes = [], []
    if cfg.clickhouse.password and sources["clickhouse.password"] in (FILE, f"clickhouse.url ({FILE})"):
        problems.append("the ClickHouse password is in the config file")
        fixes.append("set it in CHTXN_CLICKHOUSE_PASSWORD instead")
    host = urlsplit(cfg.clickhouse.url).hostname or ""
    if cfg.clickhouse.password and cfg.clickhouse.url.startswith("http://") and not _loopback(host):
        problems.append(f"the ClickHouse password goes to {host} over plain http")
        fixes.append("use an https:// URL (port 8443)")
    if problems:
        return Check(name="secrets", status="warn", found="; ".join(problems), fix="; ".join(fixes))
    return Check(name="secrets", status="ok", found="secrets masked below; none in the file or sent in clear")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def coordinator_id_check(cfg: PipelineConfig) -> Check:
    """warn: no ``coordinator.id``: each process names itself ``<hostname>-<pid>``, a new name at every restart."""
    if cfg.coordinator.id:
        return Check(name="coordinator.id", status="ok", found=f"coordinators run as {cfg.coordinator.id!r}")
    return Check(
        name="coordinator.id",
        status="warn",
        found="not set: each coordinator process is named <hostname>-<pid>, a new name in the ledger, logs and "
        "chtxn status at every restart",
        fix="give each replica its own CHTXN_COORDINATOR_ID",
    )
