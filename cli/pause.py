"""``chtxn pause`` and ``chtxn resume``: stop the leader starting txns, and start again.

Pause steps 1 and 2 (``coordinator.ledger.pauses``): a marker in the next commit slot, so that the pause or
resume is ordered against every commit and offset reset, then a PAUSED (or RESUMED) row with who
and why: a leader that takes over reads the latest, so a pause survives any number of take-overs.
Pause step 3: a ``Pause`` message on the control topic, so the running leader acts at once: paused,
it ends the open txn (which commits as usual) and starts none until resumed. The participants read
nothing between txns, so a paused pipeline reads nothing. ``chtxn status`` shows the pause.
"""

from __future__ import annotations

import argparse
import getpass
import os
import socket

import msgspec

from cli.config_option import add_config_option
from clients.clickhouse import make_client
from clients.kafka import KafkaClientFactory
from coordinator.ledger import pauses
from coordinator.ledger.store import LedgerStore
from protocol import codec
from protocol.config.parse import load_config
from protocol.errors import ChtxnError
from protocol.messages import Pause

SEND_TIMEOUT_S = 10.0


class PauseNotSent(ChtxnError):
    """The ledger row is written but the control message did not go out."""


def register(subparsers: argparse._SubParsersAction) -> None:
    for name, paused in (("pause", True), ("resume", False)):
        what = (
            "stop starting txns: the open txn ends at once and commits; none starts until chtxn resume"
            if paused
            else "start txns again after chtxn pause"
        )
        parser = subparsers.add_parser(
            name,
            help=what,
            description=f"{what[0].upper()}{what[1:]}. Recorded in the ledger with who and why (a new leader "
            "reads it at take-over, so it survives take-overs), then sent on the control topic so that the "
            "running leader acts at once. chtxn status shows it. Idempotent.",
            epilog=f"Examples:\n  chtxn {name} --config pipeline.toml --reason 'widening a column'\n"
            f"  chtxn {name} --config pipeline.toml --json",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_config_option(parser)
        parser.add_argument("--reason", default="", help="why, for the ledger and chtxn status")
        parser.add_argument(
            "--by", default="", metavar="WHO", help="who, for the ledger (default <user>@<host> of this shell)"
        )
        parser.add_argument("--json", action="store_true", help="print what was recorded as JSON")
        parser.set_defaults(func=run, paused=paused)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    who = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
    ledger = LedgerStore.of(cfg, make_client(cfg.clickhouse))
    row = pauses.record(ledger, paused=args.paused, who=who, reason=args.reason)  # Pause steps 1 and 2
    message = Pause(pipeline=cfg.name, epoch=0, txn="", sender=who, paused=args.paused, who=who, reason=args.reason)
    producer = KafkaClientFactory(cfg).producer(**{"client.id": "chtxn-pause", "linger.ms": 0})
    producer.produce(cfg.control_topic, key=cfg.name.encode(), value=codec.encode(message))  # Pause step 3
    if producer.flush(SEND_TIMEOUT_S):
        raise PauseNotSent(
            f"{row.event.value} is recorded in the ledger, but the message to the leader did not reach "
            f"{cfg.kafka.bootstrap_servers} within {SEND_TIMEOUT_S:g} s: the running leader acts on it at its "
            f"next take-over; run chtxn {'pause' if args.paused else 'resume'} again once the broker is back"
        )
    state = "paused" if args.paused else "resumed"
    if args.json:
        print(
            msgspec.json.encode(
                {"pipeline": cfg.name, "state": state, "by": who, "reason": args.reason, "commit_seq": row.commit_seq}
            ).decode()
        )
    else:
        why = f": {args.reason}" if args.reason else ""
        print(f"pipeline {cfg.name} {state} by {who}{why} (commit slot {row.commit_seq})")
    return 0
