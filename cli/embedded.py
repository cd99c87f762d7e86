"""``chtxn embedded up | down | status``: a local Kafka broker and ClickHouse endpoint, no Docker
(``up --keeper``: and a ZooKeeper the endpoint uses for KeeperMap tables; ``up --user U --password
P``: an endpoint that takes only that user, as a ClickHouse server checks credentials; ``up --shards
N``: N ClickHouse endpoints, the shards of one cluster); ``topic create`` and ``sql``
(:mod:`cli.embedded_tools`) set up a pipeline's topic and table on it by hand.

One stack per user, found from any directory (:mod:`cli.embedded_dir`). Exit codes: ``up`` 0 when
the stack runs (also when it already did), 1 when a server could not start; ``down`` 0; ``status``
0 when every server recorded runs and answers (the broker and the endpoint at least), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from rich.console import Console
from rich.table import Table

from cli import embedded_dir, embedded_tools
from embedded import daemon
from embedded.ch_config import DEFAULT_CLUSTER

_FORMATTER = argparse.RawDescriptionHelpFormatter


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "embedded",
        help="run a local Kafka broker and ClickHouse endpoint (no Docker)",
        description="A Kafka-protocol broker (Tansu) and a ClickHouse endpoint "
        "(ClickHouse's engine through chDB, over ClickHouse's HTTP interface), on loopback, as "
        "background processes that outlive the command. One stack per user: its data, logs and state "
        "live in one directory (--data-dir of each subcommand), so every shell and directory finds it.",
        epilog="Example: chtxn embedded up && chtxn embedded status && chtxn embedded down",
        formatter_class=_FORMATTER,
    )
    commands = parser.add_subparsers(dest="embedded_command", metavar="SUBCOMMAND", required=True)

    up = commands.add_parser(
        "up",
        help="start the stack in the background",
        formatter_class=_FORMATTER,
        description="Start the broker and the ClickHouse endpoint unless they already run (then it says "
        "where they run, and exits 0). A taken port moves to a free one (the output says so). Kafka data "
        "stays in DATA_DIR/kafka and ClickHouse data in DATA_DIR/clickhouse across `down` and `up`. With --env, "
        "a `#` comment line on stdout says whether it started the stack or uses the running one. The ClickHouse "
        "endpoint takes any user and password unless --user or --password is given: then it takes only that "
        "user with that password, answering any other as a ClickHouse server does (HTTP 403, code 516 "
        "AUTHENTICATION_FAILED), so credentials can be tried before production; an endpoint already running "
        "must take them, or `up` refuses (exit 1) and says how to restart it. With --shards N it starts N ClickHouse "
        "endpoints, each its own chDB process with its own data (DATA_DIR/clickhouse, DATA_DIR/clickhouse-shard2, "
        "...), on --clickhouse-port and the ports after it, all configured with one cluster naming them "
        "(system.clusters, --cluster); CHTXN_CLICKHOUSE_SHARDS lists their URLs. The shards speak HTTP only: a "
        "Distributed table over them can be created, and chtxn loads it shard by shard (its target_table learns "
        "the shards from the cluster), but reads and inserts through it need ClickHouse's native protocol to the "
        "other shards and fail (a read with skip_unavailable_shards = 1 returns its own shard's rows).",
        epilog="Examples:\n  chtxn embedded up --kafka-port 9092 --clickhouse-port 8123\n"
        '  eval "$(chtxn embedded up --env)"   # start it (or use the running one), point this shell at it\n'
        "  chtxn embedded up --keeper           # with a ZooKeeper, for KeeperMap tables\n"
        "  chtxn embedded up --user ingest --password s3cret   # the endpoint checks credentials\n"
        "  chtxn embedded up --shards 3 --json  # three ClickHouse endpoints, the shards of cluster chtxn_shards",
    )
    embedded_dir.add_argument(up)
    up.add_argument("--kafka-port", type=int, default=9092, help="broker port (default 9092; 0: any free port)")
    up.add_argument(
        "--clickhouse-port", type=int, default=8123, help="ClickHouse HTTP port (default 8123; 0: any free port)"
    )
    up.add_argument(
        "--keeper",
        action="store_true",
        help="also start a keeper (ZooKeeper, from `make install`) first and configure the ClickHouse endpoint "
        "for it, so KeeperMap tables work (a running endpoint is restarted with it, its data kept); a data "
        "directory that has one keeps starting it until `down --purge`",
    )
    up.add_argument("--keeper-port", type=int, default=2181, help="keeper port (default 2181; 0: any free port)")
    up.add_argument(
        "--user",
        default=None,
        help="the one user the ClickHouse endpoint takes (default: with --password, `default`; without either, "
        "any user)",
    )
    up.add_argument(
        "--password",
        default=None,
        help="that user's password (default: with --user, none); never written to the stack's state",
    )
    up.add_argument(
        "--shards",
        type=int,
        default=None,
        metavar="N",
        help="run N ClickHouse endpoints, the shards of one cluster (default: as many as DATA_DIR holds, else 1; "
        "fewer is refused until `down --purge`)",
    )
    up.add_argument(
        "--cluster",
        default=DEFAULT_CLUSTER,
        metavar="NAME",
        help=f"the name of the shards' cluster in system.clusters (default {DEFAULT_CLUSTER}; with --shards 2 or more)",
    )
    output = up.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the addresses as JSON, for scripts")
    output.add_argument(
        "--env", action="store_true", help="print only `export CHTXN_...=...` lines, for eval in a shell"
    )
    up.set_defaults(func=run_up)

    down = commands.add_parser(
        "down",
        help="stop the stack started by `up`",
        formatter_class=_FORMATTER,
        description="Stop the servers `up` started in the data directory, and nothing else.",
        epilog="Example: chtxn embedded down --purge",
    )
    embedded_dir.add_argument(down)
    down.add_argument(
        "--purge",
        action="store_true",
        help="also delete the ClickHouse (every shard's) and keeper data and logs the stack wrote in DATA_DIR",
    )
    down.set_defaults(func=run_down)

    status = commands.add_parser(
        "status",
        help="show what runs",
        formatter_class=_FORMATTER,
        description="Show the servers `up` started in the data directory: running or not, "
        "answering or not, addresses, pids, logs. Exits 1 unless everything runs and answers.",
        epilog="Example: chtxn embedded status --json",
    )
    embedded_dir.add_argument(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON, for scripts")
    status.set_defaults(func=run_status)
    embedded_tools.register(commands)


def _env(state: daemon.StackState, password: str | None = None) -> dict[str, str]:
    """The ``CHTXN_*`` variables pointing at the stack; the ClickHouse user when the endpoint checks
    users, and ``password`` (the one this command was given) with it; with shards, every shard's URL."""
    env = {}
    if "kafka" in state.components:
        env["CHTXN_KAFKA_BOOTSTRAP_SERVERS"] = state.components["kafka"].address
    if "clickhouse" in state.components:
        env["CHTXN_CLICKHOUSE_URL"] = state.components["clickhouse"].address
        if users := state.components["clickhouse"].users:
            env["CHTXN_CLICKHOUSE_USER"] = users[0]
            if password is not None:
                env["CHTXN_CLICKHOUSE_PASSWORD"] = password
    if len(shards := state.shard_urls()) > 1:
        env["CHTXN_CLICKHOUSE_SHARDS"] = ",".join(shards)
    if "keeper" in state.components:
        env["CHTXN_EMBEDDED_KEEPER"] = state.components["keeper"].address
    return env


def run_up(args: argparse.Namespace) -> int:
    where = embedded_dir.resolve(args)
    users = None
    if args.user is not None or args.password is not None:
        users = {args.user or "default": args.password or ""}
    result = daemon.up(
        where.data_dir,
        kafka_port=args.kafka_port,
        clickhouse_port=args.clickhouse_port,
        keeper=args.keeper,
        keeper_port=args.keeper_port,
        clickhouse_users=users,
        option=where.option(),
        shards=args.shards,
        cluster=args.cluster,
    )
    state = result.state
    env = _env(state, args.password if users else None)
    checked = state.components["clickhouse"].users
    if checked and users is None:
        result.notes.append(
            f"the ClickHouse endpoint takes only user {checked[0]} with its password: set CHTXN_CLICKHOUSE_PASSWORD "
            "(or clickhouse.password) too"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "already_up": result.already_up,
                    "started": result.started,
                    "notes": [*([where.note] if where.note else []), *result.notes],
                    "data_dir": state.data_dir,
                    "kafka_bootstrap": state.components["kafka"].address,
                    "clickhouse_url": state.components["clickhouse"].address,
                    "keeper": state.components["keeper"].address if "keeper" in state.components else None,
                    "clickhouse_users": list(checked),
                    "clickhouse_shards": state.shard_urls(),
                    "cluster": state.cluster_name(),
                    "env": env,
                    "components": {name: _component_json(c) for name, c in state.components.items()},
                },
                indent=2,
            )
        )
        return 0
    if args.env:
        # Comment lines: `eval` skips them, a reader sees which stack the variables point at.
        if where.note:
            print(f"# {where.note}")
        if result.already_up:
            print(f"# using the running embedded stack in {state.data_dir}")
        else:
            kept = [daemon.title(name) for name in state.components if name not in result.started]
            print(
                f"# started the embedded stack in {state.data_dir}"
                + (f" (kept the running {', '.join(kept)})" if kept else "")
            )
        print("".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items()), end="")
        for note in result.notes:
            print(f"chtxn: note: {note}", file=sys.stderr)
        return 0
    console = _console()
    headline = "already running" if result.already_up else "up"
    console.print(f"[bold]chtxn embedded stack is {headline}[/bold] in {state.data_dir}")
    for note in [*([where.note] if where.note else []), *result.notes]:
        console.print(f"[yellow]note:[/yellow] {note}")
    table = Table(box=None, pad_edge=False)
    for column in ("server", "address", "pid", "log"):
        table.add_column(column, no_wrap=True)
    for name, component in state.components.items():
        table.add_row(daemon.title(name), component.address, str(component.pid), component.log)
    console.print(table)
    bootstrap = state.components["kafka"].address
    ch = state.components["clickhouse"]
    shown = dict(env)  # a password is printed only for eval (--env) and scripts (--json)
    login = ""
    if checked:
        shown["CHTXN_CLICKHOUSE_PASSWORD"] = f"<the password of {checked[0]}>"
        login = f', username="{checked[0]}", password=...'
    console.print(
        "\nPoint chtxn at it (these override the pipeline config):\n"
        + "".join(f"  export {key}={value}\n" for key, value in shown.items())
        + "\nUse it from Python:\n"
        "  from confluent_kafka import Producer, Consumer\n"
        f'  producer = Producer({{"bootstrap.servers": "{bootstrap}"}})\n'
        '  producer.produce("demo", b\'{"id": 1}\'); producer.flush()\n'
        "  import clickhouse_connect\n"
        f'  client = clickhouse_connect.get_client(host="{state.host}", port={ch.port}{login})\n'
        '  client.query("SELECT version()").result_rows\n'
        + (
            "  client.command(\"CREATE TABLE kv (key String, v String) ENGINE = KeeperMap('/kv') PRIMARY KEY key\")\n"
            if "keeper" in state.components
            else ""
        )
        + (
            f"  client.query(\"SELECT shard_num, host_name, port FROM system.clusters WHERE cluster = '{cluster}'\")"
            ".result_rows\n"
            if (cluster := state.cluster_name())
            else ""
        )
        + f"\nStop it with: chtxn embedded down{where.option()}"
        + "  (its data stays for the next `up`; `down --purge` deletes it)",
        soft_wrap=True,
    )
    return 0


def run_down(args: argparse.Namespace) -> int:
    where = embedded_dir.resolve(args)
    if where.note:
        print(f"note: {where.note}")
    stopped = daemon.down(where.data_dir, purge=args.purge)
    if stopped:
        print(f"stopped in {where.data_dir}: " + ", ".join(daemon.title(name) for name in stopped))
    else:
        print(f"nothing was running from {where.data_dir}")
    if args.purge:
        print(f"deleted the Kafka, ClickHouse and keeper data and logs in {where.data_dir}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    where = embedded_dir.resolve(args)
    statuses = daemon.status(where.data_dir)
    healthy = set(daemon.REQUIRED) <= {s.name for s in statuses} and all(s.running and s.answering for s in statuses)
    if args.json:
        print(
            json.dumps(
                {
                    "data_dir": str(where.data_dir),
                    **({"note": where.note} if where.note else {}),
                    "up": healthy,
                    "components": {
                        s.name: {**_component_json(s.state), "running": s.running, "answering": s.answering}
                        for s in statuses
                    },
                },
                indent=2,
            )
        )
        return 0 if healthy else 1
    if not statuses:
        print(
            f"not running: no embedded stack recorded in {where.data_dir} "
            f"(start it with `chtxn embedded up{where.option()}`)"
        )
        return 1
    table = Table(box=None, pad_edge=False)
    for column in ("server", "state", "address", "pid", "started", "log"):
        table.add_column(column, no_wrap=True)
    for s in statuses:
        state = (
            "[green]running[/green]"
            if s.answering
            else "[yellow]running, not answering[/yellow]"
            if s.running
            else "[red]stopped[/red]"
        )
        table.add_row(daemon.title(s.name), state, s.state.address, str(s.state.pid), s.state.started_at, s.state.log)
    console = _console()
    console.print(f"embedded stack in {where.data_dir}")
    if where.note:
        console.print(f"[yellow]note:[/yellow] {where.note}")
    console.print(table)
    if not healthy:
        print("some servers are not running: `chtxn embedded up` starts what is missing", file=sys.stderr)
    return 0 if healthy else 1


def _console() -> Console:
    """Rich output; wide when not on a terminal, so piped output is not cut at 80 columns."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _component_json(component: daemon.ComponentState) -> dict[str, object]:
    return {
        "address": component.address,
        "port": component.port,
        **({"keeper": component.keeper} if component.keeper else {}),
        **({"users": list(component.users)} if component.users else {}),
        **({"cluster": component.cluster} if component.cluster else {}),
        "pid": component.pid,
        "log": component.log,
        "started_at": component.started_at,
    }
