"""``chtxn embedded topic create`` and ``chtxn embedded sql``: a pipeline's source topic and target
table, set up by hand on the running embedded stack, without Kafka's or ClickHouse's own tools.

Both talk to the stack :mod:`cli.embedded_dir` names, at the addresses ``up`` recorded (not the
``CHTXN_*`` variables), and exit 1 when it does not run. Exit codes: ``topic create`` 0 when the
topic exists with the partition count asked for (created now or before), 1 otherwise; ``sql`` 0 when
the statement ran, 1 when ClickHouse refused it (its message on stderr).
"""

from __future__ import annotations

import argparse
import sys

from cli import embedded_dir
from protocol.errors import SetupError

_FORMATTER = argparse.RawDescriptionHelpFormatter
#: How long the broker may take to create a topic and list it.
TOPIC_TIMEOUT_S = 30.0


def register(commands: argparse._SubParsersAction) -> None:
    topic = commands.add_parser(
        "topic",
        help="create a Kafka topic on the running stack",
        formatter_class=_FORMATTER,
        description="Kafka topics on the running embedded stack (no kafka-topics.sh needed).",
        epilog="Example: chtxn embedded topic create orders --partitions 4",
    )
    topic_commands = topic.add_subparsers(dest="topic_command", metavar="SUBCOMMAND", required=True)
    create = topic_commands.add_parser(
        "create",
        help="create a topic with N partitions",
        formatter_class=_FORMATTER,
        description="Create a topic on the running embedded broker and wait until its metadata lists every "
        "partition. A topic that exists is left as it is: exit 0 when its partition count is the one asked "
        "for, 1 otherwise.",
        epilog="Example: chtxn embedded topic create orders --partitions 4",
    )
    create.add_argument("name", metavar="NAME", help="the topic's name")
    create.add_argument("--partitions", type=int, default=1, help="number of partitions (default 1)")
    embedded_dir.add_argument(create)
    create.set_defaults(func=run_topic_create)

    sql = commands.add_parser(
        "sql",
        help="run one SQL statement on the running ClickHouse endpoint",
        formatter_class=_FORMATTER,
        description="Run one statement on the running embedded ClickHouse endpoint (through clickhouse-connect; "
        "no clickhouse-client needed) and print its result, if any, in FORMAT (a FORMAT clause in the "
        "statement wins). QUERY `-` reads the statement from stdin.",
        epilog="Examples:\n"
        '  chtxn embedded sql "CREATE TABLE orders (id UInt64, amount Float64, _topic LowCardinality(String), '
        '_partition Int32, _offset Int64) ENGINE = MergeTree ORDER BY (_partition, _offset)"\n'
        '  chtxn embedded sql "SELECT count() FROM orders"\n'
        "  chtxn embedded sql --format PrettyCompact \"SELECT name, engine FROM system.tables WHERE database = 'default'\"",
    )
    sql.add_argument("query", metavar="QUERY", help="the statement, or - to read it from stdin")
    sql.add_argument("--database", default="default", help="the database it runs in (default default)")
    sql.add_argument(
        "--format", default="TabSeparatedWithNames", help="ClickHouse output format (default TabSeparatedWithNames)"
    )
    embedded_dir.add_argument(sql)
    sql.set_defaults(func=run_sql)


def run_topic_create(args: argparse.Namespace) -> int:
    from confluent_kafka.admin import AdminClient

    from clients.kafka import cluster_metadata, create_topics

    if args.partitions < 1:
        print("chtxn: --partitions must be at least 1", file=sys.stderr)
        return 2
    where = embedded_dir.resolve(args)
    bootstrap = embedded_dir.running_state(where).components["kafka"].address
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = create_topics(admin, {args.name: args.partitions}, TOPIC_TIMEOUT_S, bootstrap)[args.name]
    found = cluster_metadata(admin, TOPIC_TIMEOUT_S, bootstrap).topics.get(args.name)
    count = len(found.partitions) if found is not None else 0
    if where.note:
        print(f"note: {where.note}", file=sys.stderr)
    if created:
        print(f"created topic {args.name} with {count} partitions on {bootstrap}")
    else:
        print(f"topic {args.name} already exists with {count} partitions on {bootstrap}")
    if count != args.partitions:
        print(f"chtxn: topic {args.name} has {count} partitions, not {args.partitions}", file=sys.stderr)
        return 1
    return 0


def run_sql(args: argparse.Namespace) -> int:
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import DatabaseError

    query = sys.stdin.read() if args.query == "-" else args.query
    if not query.strip():
        print("chtxn: empty statement", file=sys.stderr)
        return 2
    where = embedded_dir.resolve(args)
    url = embedded_dir.running_state(where).components["clickhouse"].address
    if where.note:
        print(f"note: {where.note}", file=sys.stderr)
    client = clickhouse_connect.get_client(dsn=url, database=args.database)
    try:
        # default_format applies only when the statement has no FORMAT clause, and only to a result.
        out = client.raw_query(query, settings={"default_format": args.format})
    except DatabaseError as exc:
        raise SetupError(f"ClickHouse at {url} refused the statement: {exc}") from None
    finally:
        client.close()
    sys.stdout.buffer.write(out)
    return 0
