"""The ``chtxn`` command line: one module per command group, each with ``register(subparsers)``.

Every command has ``--help`` with an example; commands whose output a script may want take
``--json``, and the read commands ``--format table|wide|tsv|json`` (``cli.output``: whole lines
into a pipe). Exit codes: 0 success, 1 a failed check or operation, 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from protocol import secrets
from protocol.errors import ChtxnError, ConfigError

#: Command modules, in the order ``chtxn --help`` lists them.
COMMAND_MODULES = (
    "cli.embedded",
    "cli.init",
    "cli.service",
    "cli.txn",
    "cli.verify",
    "cli.status",
    "cli.dlq",
    "cli.participant",
    "cli.demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chtxn",
        description="Exactly-once Kafka-to-ClickHouse ingestion: coordinator, participants, inspection.",
        epilog="Example: chtxn embedded up && chtxn init --config pipeline.toml && chtxn coordinator --config pipeline.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default) or ERROR")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # a command group not built yet
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from coordinator.logs import setup_logging

    setup_logging(args.log_level)
    from clients import failpoints

    failpoints.arm_from_env()  # tests arm crash/stall points in the processes they start
    try:
        return int(args.func(args) or 0)
    except ConfigError as exc:
        print(f"chtxn: config error: {secrets.redact(str(exc))}", file=sys.stderr)
        return 2
    except ChtxnError as exc:
        print(f"chtxn: {secrets.redact(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
