"""``chtxn commit-point show`` and ``chtxn commit-point switch --to MODE``: the commit point the
ledger records, and the one documented way to change it (``coordinator.ledger.commit_points``).

The switch reads the control topic for a leader's heartbeat first: it refuses while any leader
holds the lease (every coordinator running before the switch claims by the old commit point).
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket
import time

import msgspec

from cli.config_option import add_config_option
from cli.control_tail import heartbeats
from clients import kafka as kafka_clients
from clients.clickhouse import make_client
from clients.log_ends import CONSUMER_PROPERTIES
from coordinator.ledger import commit_points
from protocol import naming
from protocol.config.parse import PipelineConfig, load_config
from protocol.ledger.commit_points import MODES, PROCEDURE

#: How long the switch reads the control topic for a leader's heartbeat.
HEARTBEAT_READ_S = 10.0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "commit-point",
        help="show the commit point the ledger records, or switch it (token <-> keeper) while paused",
        description="The ledger records which commit point (ledger.commit_point) its slots are claimed by; a "
        "coordinator configured with another one does not start. 'show' prints it; 'switch' changes it at one "
        "commit slot, claimed through the old commit point, only while the pipeline is paused and no coordinator "
        f"leads. The procedure: {PROCEDURE.format(to='keeper')}.",
        epilog="Examples:\n  chtxn commit-point show --config pipeline.toml\n"
        "  chtxn pause --config pipeline.toml --reason 'moving to Keeper'\n"
        "  chtxn commit-point switch --config pipeline.toml --to keeper\n"
        "  chtxn resume --config pipeline.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print the commit point the ledger records")
    add_config_option(show)
    show.add_argument("--json", action="store_true", help="print it as JSON")
    show.set_defaults(func=run_show)
    switch = actions.add_parser(
        "switch",
        help="record a new commit point in the ledger (the pipeline paused, no coordinator leading)",
        description="Claim the next commit slot through the old commit point with a marker, then record the new "
        "one: slots after it are claimed by the new commit point only. Refused unless the pipeline is paused "
        "and no leader's heartbeat is heard. Idempotent: run again after an interruption.",
    )
    add_config_option(switch)
    switch.add_argument("--to", required=True, choices=MODES, help="the new commit point")
    switch.add_argument("--reason", default="", help="why, for the ledger")
    switch.add_argument("--by", default="", metavar="WHO", help="who, for the ledger (default <user>@<host>)")
    switch.add_argument("--json", action="store_true", help="print what was recorded as JSON")
    switch.set_defaults(func=run_switch)


def run_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    fact = commit_points.current(commit_points.store_of(cfg, make_client(cfg.clickhouse), cfg.ledger.commit_point))
    if args.json:
        print(msgspec.json.encode({"pipeline": cfg.name, "commit_point": fact}).decode())
    elif fact is None:
        print(f"pipeline {cfg.name}: the ledger records no commit point yet (its first coordinator records its own)")
    else:
        since = f"from commit slot {fact.since + 1}" if fact.since else "from the first coordinator on"
        print(f"pipeline {cfg.name}: commit point {fact.mode} {since}")
    return 0


def run_switch(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    done = commit_points.switch(
        cfg, make_client(cfg.clickhouse), to=args.to, who=who, reason=args.reason, leaders=_leaders(cfg)
    )
    if args.json:
        print(msgspec.json.encode(done).decode())
    elif done.already:
        print(f"pipeline {cfg.name}: the ledger already records commit point {done.to}; nothing to switch")
    else:
        print(
            f"pipeline {cfg.name}: commit point {done.frm} -> {done.to} from commit slot {done.commit_seq + 1} on; "
            f'start the coordinators with ledger.commit_point = "{done.to}", then chtxn resume'
        )
    return 0


def _leaders(cfg: PipelineConfig) -> dict[str, int]:
    """The coordinators whose last heartbeat says they hold the lease (id -> epoch)."""
    consumer = kafka_clients.KafkaClientFactory(cfg).consumer(
        **{"group.id": naming.status_group(cfg.name), **CONSUMER_PROPERTIES}
    )
    try:
        leaders, _, _ = heartbeats(cfg, consumer, time.time(), HEARTBEAT_READ_S)
    finally:
        consumer.close()
    lease_s = cfg.coordinator.leader_lease_s
    return {who: heard.epoch for who, heard in leaders.items() if heard.age_s <= lease_s and not heard.leaving}
