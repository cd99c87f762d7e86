"""``chtxn config check``: the effective config, where each value came from, and every check that needs
no running pipeline and no server: the config's own validation, the ``CHTXN_*`` variables, the
``[kafka.properties]`` librdkafka accepts, where the secrets are. ``chtxn doctor`` checks the servers.

Exit code 0 when no check failed (warnings do not fail), 1 when one did, 2 for a config chtxn refuses
(the one-line ``chtxn: config error: ...`` every command gives).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import Consumer, KafkaException, Producer
from rich.markup import escape

from cli.config_option import add_config_option
from cli.output import Column, Output, Sheet, Styled, add_format_option
from clients import kafka as kafka_clients
from protocol.checks import Check
from protocol.config import sources as config_sources
from protocol.config.parse import PipelineConfig, parse_config
from protocol.config.sources import Setting
from protocol.errors import ConfigError


class ConfigReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``chtxn config check --json`` prints."""

    config: str  # the file read, absolute
    pipeline: str
    ok: bool  # no check failed
    settings: dict[str, dict[str, Any]]  # key -> {"value", "source"}
    checks: tuple[Check, ...]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "config",
        help="check the pipeline config: effective values, their sources, offline checks",
        description="The pipeline config as chtxn reads it.",
        epilog="Examples:\n  chtxn config check --config pipeline.toml\n  chtxn config check --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = commands.add_parser(
        "check",
        help="the effective config with the environment applied, the source of every value, offline checks",
        description="Reads the config file, applies the CHTXN_* environment variables and validates the result as "
        "every chtxn command does, without contacting any server. Prints every effective value (secrets masked "
        "as ***) with its source: the file, the environment variable that overrode it, or the default (a "
        "default computed from another value names it). Then the checks: environment (CHTXN_* variables chtxn "
        "does not read, with the likely spelling), kafka.properties (librdkafka makes every client chtxn makes "
        "from them, offline, and its configuration warnings), secrets (the ClickHouse password in the file, or "
        "sent over plain http to another host) and coordinator.id. Exit code 0 when no check failed (warnings "
        "do not fail), 1 when one did, 2 when the config is refused (the one-line error every command gives). "
        "chtxn doctor checks the servers.",
        epilog="Examples:\n  chtxn config check --config pipeline.toml\n"
        "  CHTXN_CLICKHOUSE_URL=https://ch:8443 chtxn config check --config pipeline.toml --format tsv\n"
        "  chtxn config check --json | jq '.settings[\"clickhouse.url\"]'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(check)
    add_format_option(check, rows="one line per setting (the checks on stderr)")
    check.set_defaults(func=run_check)


def report(path: str, environ: dict[str, str]) -> ConfigReport:
    """The report of the config at ``path`` with ``environ`` applied; ``ConfigError`` when refused."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the pipeline config {path!r}: {exc.strerror}; pass --config FILE") from None
    cfg = parse_config(text, environ, source=path)
    found = config_sources.settings(cfg, text, environ)
    checks = (
        Check(name="config", status="ok", found=f"valid: {_sources(found)}"),
        config_sources.environment_check(environ),
        kafka_properties_check(cfg),
        config_sources.secrets_check(cfg, found),
        config_sources.coordinator_id_check(cfg),
    )
    return ConfigReport(
        config=str(Path(path).resolve()),
        pipeline=cfg.name,
        ok=not any(c.status == "fail" for c in checks),
        settings={s.key: {"value": s.value, "source": s.source} for s in found},
        checks=checks,
    )


def _sources(found: list[Setting]) -> str:
    env = sum("CHTXN_" in s.source for s in found)
    default = sum(s.source.startswith(config_sources.DEFAULT) for s in found)
    return f"{len(found) - env - default} values from the file, {env} from the environment, {default} defaults"


class _Collect(logging.Handler):
    """librdkafka's log lines for one check, without the client's name."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage().split("]: ", 1)[-1]
        if "property and will be ignored by this" in line:
            return  # [kafka.properties] go to every client, producer and consumer alike
        if line not in self.lines:
            self.lines.append(line)


def kafka_properties_check(cfg: PipelineConfig) -> Check:
    """fail: librdkafka refuses the properties of a client chtxn makes; warn: it warns about them. Offline:
    the clients are made without bootstrap servers, so none connects."""
    collect = _Collect()
    logger = logging.getLogger("chtxn.config-check.kafka")
    logger.propagate = False
    logger.setLevel(logging.WARNING)
    logger.addHandler(collect)
    offline = {"bootstrap.servers": "", "logger": logger}
    try:
        consumer = Consumer({**kafka_clients.consumer_conf(cfg), **offline})
        consumer.poll(0.01)
        consumer.close()
        for extra in ({}, {"transactional.id": f"{cfg.name}.config-check"}):  # the dead-letter publisher's
            producer = Producer({**kafka_clients.producer_conf(cfg, **extra), **offline})
            producer.poll(0)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        why = error.str() if hasattr(error, "str") else str(error)
        return Check(
            name="kafka.properties",
            status="fail",
            found=f"librdkafka refuses the client configuration: {why}",
            fix="fix [kafka.properties] (librdkafka's CONFIGURATION.md lists every property)",
        )
    finally:
        logger.removeHandler(collect)
    names = ", ".join(sorted(cfg.kafka.properties)) or "none set"
    if collect.lines:
        return Check(
            name="kafka.properties",
            status="warn",
            found=f"librdkafka warns: {'; '.join(collect.lines)}",
            fix="fix [kafka.properties]",
        )
    return Check(name="kafka.properties", status="ok", found=f"librdkafka accepts them ({names})")


SETTING_COLUMNS = (
    Column("key", "key"),
    Column("value", "value", fold=20),
    Column("source", "source"),
)
CHECK_COLUMNS = (
    Column("check", "check"),
    Column("result", "result"),
    Column("found", "found", fold=30),
    Column("what to do", "fix", fold=30),
)
_STYLES = {"ok": "green", "warn": "yellow", "fail": "red"}


def run_check(args: argparse.Namespace) -> int:
    result = report(args.config, dict(os.environ))
    if args.format == "json":
        print(msgspec.json.format(msgspec.json.encode(result)).decode())
        return 0 if result.ok else 1
    out = Output(args.format)
    table = Sheet(f"effective config of pipeline {result.pipeline} ({result.config})", SETTING_COLUMNS)
    for key, setting in result.settings.items():
        table.add(key, json.dumps(setting["value"], ensure_ascii=False), setting["source"])
    out.sheet(table)
    if args.format == "tsv":
        for c in result.checks:
            out.note(f"check {c.name}: {c.status}: {escape(c.found)}" + (f"; {escape(c.fix)}" if c.fix else ""))
    else:
        checks = Sheet("checks", CHECK_COLUMNS)
        for c in result.checks:
            checks.add(c.name, Styled(c.status, _STYLES[c.status]), c.found, c.fix or "-")
        out.sheet(checks)
    failed = [c.name for c in result.checks if c.status == "fail"]
    warnings = sum(c.status == "warn" for c in result.checks)
    if failed:
        out.note(f"[red]config check: failed: {', '.join(failed)}[/]")
    else:
        out.note(f"[green]config check: no check failed[/] ({warnings} warning{'s' if warnings != 1 else ''})")
    return 0 if result.ok else 1
