"""``chtxn init``: create what a pipeline needs, idempotently, and check what it cannot create.

Creates, when missing: the control topic (exactly 1 partition), the dead-letter topic (as many
partitions as the largest source topic), the ledger table, the dead-letter table and, with
``ledger.commit_point = "keeper"``, the KeeperMap table of claims (replicated and ``ON CLUSTER``
when ``clickhouse.cluster`` is set). Checks first, without touching them: the broker, the source
topics, an existing control topic (one partition), the ClickHouse database and the target tables,
each refused exactly as the coordinator and the participants refuse it (``protocol.tables.target_rules``);
when any check fails it creates nothing. Prints the DDL it ran, for an operator to read or to run
elsewhere. Running it again changes nothing. Exit code 0 when everything is in place, 1 when
something needs the operator.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Literal

import msgspec
from clickhouse_connect.driver.client import Client
from confluent_kafka.admin import AdminClient
from rich.markup import escape

from cli.broker_timeout import add_broker_timeout_option
from cli.config_option import add_config_option, learnt
from cli.output import Column, Output, Sheet, Styled
from clients import kafka as kafka_clients
from clients.clickhouse import make_client, retrying
from clients.target_table import read_target
from coordinator.ledger.store import LedgerStore
from protocol import secrets, topic_patterns
from protocol.config.parse import PipelineConfig, load_config
from protocol.dead_letters import letters as dead_letters
from protocol.errors import ChtxnError, ClickHouseError, SetupError
from protocol.ledger import claims as ledger_claims, rows as ledger
from protocol.tables.target_rules import refusals

_UNKNOWN_DATABASE = 81


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """One thing ``init`` looked at, and what it found or did."""

    kind: Literal["kafka topic", "clickhouse database", "clickhouse table"]
    name: str
    status: Literal["created", "found", "missing", "wrong", "unreachable"]
    detail: str = ""
    ddl: tuple[str, ...] = ()  # the statements init ran for this table


class Report(msgspec.Struct, frozen=True, kw_only=True):
    pipeline: str
    ok: bool
    items: tuple[Item, ...]
    problems: tuple[str, ...]
    ddl: tuple[str, ...] = ()  # every DDL statement init ran, in order


class RecordingClient:
    """A clickhouse-connect client that keeps the DDL statements it ran (``CREATE``, ``ALTER``)."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.ddl: list[str] = []

    def command(self, cmd: str, *args: Any, **kwargs: Any) -> Any:
        result = self.client.command(cmd, *args, **kwargs)
        statement = cmd.strip()
        if statement.upper().startswith(("CREATE ", "ALTER ")) and statement not in self.ddl:
            self.ddl.append(statement)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "init",
        help="create the control and dead-letter topics and the ledger table (idempotent)",
        description="Create what the pipeline needs if missing: the control topic (1 partition), the "
        "dead-letter topic and the ledger table; check that the source topics, the ClickHouse "
        "database and the target table exist, and that the coordinator and the participants would "
        "accept the target (engine, materialized views, deduplication, metadata columns), as chtxn doctor "
        "judges it too. Safe to run again: it reports what it created and what it found.",
        epilog="Example: chtxn init --config pipeline.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    add_broker_timeout_option(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)


#: The columns of ``init``'s table: one line per topic or table checked or made.
ITEM_COLUMNS = (
    Column("what", "what"),
    Column("name", "name"),
    Column("result", "result"),
    Column("detail", "detail", fold=10),
)


class InitFailed(ChtxnError):
    """A check failed: nothing was created (or a creation failed); the problems are listed above."""


def run(args: argparse.Namespace) -> int:
    cfg, unlearnt = learnt(load_config(args.config, os.environ))
    items: list[Item] = []
    problems: list[str] = [str(unlearnt)] if isinstance(unlearnt, SetupError) else []
    admin = kafka_clients.admin(cfg)
    widest = _check_kafka(cfg, admin, args.timeout, items, problems)
    client = _check_clickhouse(cfg, items, problems)
    recording = RecordingClient(client) if client is not None else None
    try:
        if problems or widest is None or recording is None:
            problems.append("created nothing: fix the problems above, then run chtxn init again")
        else:
            _create_topics(cfg, admin, widest, args.timeout, items, problems)
            _create_tables(cfg, recording, items, problems)
    finally:
        if client is not None:
            client.close()
    ddl = tuple(recording.ddl) if recording is not None else ()
    report = Report(pipeline=cfg.name, ok=not problems, items=tuple(items), problems=tuple(problems), ddl=ddl)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(report)).decode())
    else:
        _print(Output("table"), report)
    if not report.ok:
        more = len(problems) - 2  # the last one says that nothing was created
        raise InitFailed(
            f"{problems[0]}" + (f" (and {more} more problem{'s' * (more != 1)} above)" if more > 0 else "")
        )
    return 0


def _check_kafka(
    cfg: PipelineConfig, admin: AdminClient, timeout_s: float, items: list[Item], problems: list[str]
) -> int | None:
    """Check the broker, the source topics and an existing control topic; the partition count of
    the widest source topic (the dead-letter topic's), or None when the broker did not answer."""
    bootstrap = cfg.kafka.bootstrap_servers
    try:
        topics = kafka_clients.cluster_metadata(admin, timeout_s, bootstrap).topics
    except kafka_clients.BrokerUnreachable as exc:
        items.append(Item(kind="kafka topic", name=bootstrap, status="unreachable", detail=str(exc)))
        problems.append(str(exc))
        return None
    widest = 1
    existing = [name for name, found in topics.items() if found.error is None and found.partitions]
    for topic in topic_patterns.matching(cfg.source_topics, existing):
        found = topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            message = (
                f"source topic {topic} does not exist on {bootstrap}: create it (e.g. kafka-topics.sh "
                f"--create --topic {topic} --partitions N) or fix pipeline.topics"
            )
            items.append(Item(kind="kafka topic", name=topic, status="missing", detail="source topic"))
            problems.append(message)
            continue
        widest = max(widest, len(found.partitions))
        items.append(
            Item(
                kind="kafka topic",
                name=topic,
                status="found",
                detail=f"source topic, {len(found.partitions)} partitions",
            )
        )
    if cfg.control_topic in topics:
        try:
            kafka_clients.check_control_topic(admin, cfg.control_topic, timeout_s, bootstrap)
        except SetupError as exc:
            items.append(Item(kind="kafka topic", name=cfg.control_topic, status="wrong", detail="control topic"))
            problems.append(str(exc))
    return widest


def _create_topics(
    cfg: PipelineConfig, admin: AdminClient, widest: int, timeout_s: float, items: list[Item], problems: list[str]
) -> None:
    bootstrap = cfg.kafka.bootstrap_servers
    wanted = {cfg.control_topic: 1, cfg.dead_letter_topic: widest}
    try:
        created = kafka_clients.create_topics(admin, wanted, timeout_s, bootstrap)
        kafka_clients.check_control_topic(admin, cfg.control_topic, timeout_s, bootstrap)
        dlq_partitions = len(
            kafka_clients.cluster_metadata(admin, timeout_s, bootstrap).topics[cfg.dead_letter_topic].partitions
        )
    except SetupError as exc:
        problems.append(str(exc))
        return
    items.append(
        Item(
            kind="kafka topic",
            name=cfg.control_topic,
            status="created" if created[cfg.control_topic] else "found",
            detail="control topic, 1 partition",
        )
    )
    items.append(
        Item(
            kind="kafka topic",
            name=cfg.dead_letter_topic,
            status="created" if created[cfg.dead_letter_topic] else "found",
            detail=f"dead-letter topic, {dlq_partitions} partitions",
        )
    )


def _check_clickhouse(cfg: PipelineConfig, items: list[Item], problems: list[str]) -> Client | None:
    """Check the database and the target table; the client when the server answered, else None."""
    ch = cfg.clickhouse
    try:
        client = make_client(ch)
    except ClickHouseError as exc:
        if exc.code == _UNKNOWN_DATABASE:
            items.append(Item(kind="clickhouse database", name=ch.database, status="missing"))
            problems.append(
                f"ClickHouse database {ch.database} does not exist at {secrets.mask_url(ch.url)}: create it "
                f"(CREATE DATABASE {ch.database}) and the target tables {', '.join(cfg.tables)} in it"
            )
        else:
            items.append(Item(kind="clickhouse database", name=ch.url, status="unreachable", detail=str(exc)))
            problems.append(str(exc))
        return None
    items.append(Item(kind="clickhouse database", name=ch.database, status="found"))
    for table in cfg.tables:
        name = f"{ch.database}.{table}"
        try:
            facts = retrying(3, f"check the target table {table}")(read_target, client, ch.database, table)
        except ClickHouseError as exc:
            problems.append(str(exc))
            return client
        refused = refusals(cfg, table, facts)  # what the coordinator and the participants refuse
        status: Literal["found", "missing", "wrong"] = "missing" if facts is None else "wrong" if refused else "found"
        items.append(Item(kind="clickhouse table", name=name, status=status, detail="target table"))
        problems.extend(r.message for r in refused)
    return client


def _create_tables(cfg: PipelineConfig, client: RecordingClient, items: list[Item], problems: list[str]) -> None:
    """The ledger, the dead-letter table and (keeper commit point) the claims table, through the
    coordinator's own ``LedgerStore.ensure_tables``; an item per table with the DDL run for it."""
    ch = cfg.clickhouse
    tables = {ledger.TABLE: "ledger", dead_letters.TABLE: "dead letters"}
    if cfg.ledger.commit_point == "keeper":
        tables[ledger_claims.TABLE] = f"KeeperMap claims at {cfg.keeper_path}"
    try:
        existed = {
            table: int(
                retrying(3, f"check {ch.database}.{table}")(client.command, f"EXISTS TABLE `{ch.database}`.`{table}`")
            )
            for table in tables
        }
        LedgerStore.of(cfg, client, retries=3).ensure_tables()
    except (ClickHouseError, SetupError) as exc:
        problems.append(str(exc))
        return
    for table, detail in tables.items():
        name = f"{ch.database}.{table}"
        ran = tuple(d for d in client.ddl if f"`{ch.database}`.`{table}`" in d)
        status: Literal["created", "found"] = "found" if existed[table] else "created"
        items.append(Item(kind="clickhouse table", name=name, status=status, detail=detail, ddl=ran))


def _print(out: Output, report: Report) -> None:
    sheet = Sheet(f"chtxn init: pipeline {report.pipeline}", ITEM_COLUMNS)
    colours = {"created": "green", "found": "cyan"}
    for item in report.items:
        detail = item.detail if item.status not in ("unreachable",) else ""
        sheet.add(item.kind, item.name, Styled(item.status, colours.get(item.status, "red")), detail)
    out.sheet(sheet)
    if report.ddl:
        out.note("DDL run:")
        for statement in report.ddl:
            out.note(escape(f"{statement};"))
    for problem in report.problems:
        out.note(f"[red]problem:[/] {escape(problem)}")
    if report.ok:
        out.note("[green]ready[/]: start the coordinator with chtxn coordinator --config <file>")
