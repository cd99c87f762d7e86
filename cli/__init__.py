"""The ``chtxn`` command line: one module per command group, each with ``register(subparsers)``.

Every command has ``--help`` with an example; commands whose output a script may want take
``--json``, and the read commands ``--format table|wide|tsv|json`` (``cli.output``: whole lines
into a pipe). Exit codes: 0 success, 1 a failed check or operation, 2 bad usage or config. A failure prints one
line ``chtxn: <message>`` on stderr, the traceback only with ``--debug``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import traceback
from importlib import metadata
from pathlib import Path

from cli.config_option import default_config
from protocol import secrets
from protocol.config import env as config_env
from protocol.errors import ChtxnError, ConfigError

#: Command modules, in the order ``chtxn --help`` lists them.
COMMAND_MODULES = (
    "cli.embedded",
    "cli.init",
    "cli.service",
    "cli.txn",
    "cli.verify",
    "cli.status",
    "cli.doctor",
    "cli.pause",
    "cli.reset",
    "cli.commit_point",
    "cli.dlq",
    "cli.participant",
    "cli.demo",
    "cli.config_cmd",
    "cli.completion",
)


#: Commands that run until stopped: librdkafka's log lines stay on for them (repeats are dropped).
SERVICE_COMMANDS = ("coordinator", "participant")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chtxn",
        description="Exactly-once Kafka-to-ClickHouse ingestion: coordinator, participants, inspection.",
        epilog="Example: chtxn embedded up && chtxn init --config pipeline.toml && chtxn coordinator --config pipeline.toml",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"chtxn {_version()}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="DEBUG, INFO, WARNING (default) or ERROR",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
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


def _version() -> str:
    try:
        return metadata.version("chtxn")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    """Run one command. A failure is one line ``chtxn: <message>`` on stderr (with ``--debug``, the
    traceback before it): exit 2 for bad usage or config, 1 for a failed operation or a bug."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except ConfigError as exc:
        return _fail(args, f"config error: {exc}", 2)
    except ChtxnError as exc:
        return _fail(args, str(exc), 1)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # SIGPIPE blocked by whoever started us: the reader of stdout is gone all the same
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 128 + signal.SIGPIPE
    except Exception as exc:
        if (kafka := _kafka_failure(exc)) is not None:
            refused = kafka.startswith(_REFUSED)  # a config error, as the participant job says it
            return _fail(args, f"config error: {kafka}" if refused else kafka, 2 if refused else 1)
        return _fail(args, f"internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", 1)


def _run(args: argparse.Namespace) -> int:
    from coordinator.logs import setup_logging

    setup_logging(args.log_level)
    _quiet_clients(args)
    if args.command not in SERVICE_COMMANDS:
        # ``chtxn txn list | head``: the reader has all it wanted; end quietly, as cat does
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    for var, close in config_env.unknown_variables(os.environ):
        hint = f"; did you mean {close}?" if close else ""
        print(f"chtxn: warning: {var} is not a variable chtxn reads, ignored{hint}", file=sys.stderr)
    if getattr(args, "config", "") is None:
        args.config = default_config(os.environ, Path.cwd())
    from clients import failpoints

    failpoints.arm_from_env()  # tests arm crash/stall points in the processes they start
    return int(args.func(args) or 0)


def _quiet_clients(args: argparse.Namespace) -> None:
    """librdkafka logs every failed connection attempt, the HTTP client of ClickHouse every retry: a
    one-shot command shows none of them (its own error says what failed) unless ``--log-level
    DEBUG``; a service shows each librdkafka line once."""
    kafka_log = logging.getLogger("chtxn.kafka")
    if args.command in SERVICE_COMMANDS:
        kafka_log.addFilter(_OncePerMessage())
    elif args.log_level != "DEBUG":
        for name in ("chtxn.kafka", "urllib3", "clickhouse_connect"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


class _OncePerMessage(logging.Filter):
    """Passes the first record of each message text, drops its repeats."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


_REFUSED = "the Kafka client refused its configuration"


def _kafka_failure(exc: Exception) -> str | None:
    """The message for an error librdkafka raised (a client refusing ``[kafka.properties]``), or None."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException):
        return None
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return f"Kafka: {exc}"
    if error.code() == KafkaError._INVALID_ARG:
        return f"{_REFUSED}: {error.str()}; check [kafka.properties]"
    return f"Kafka: {error.name()}: {error.str()}; check kafka.bootstrap_servers and that the broker is running"


def _fail(args: argparse.Namespace, message: str, code: int) -> int:
    if args.debug:
        traceback.print_exc()
    print(f"chtxn: {secrets.redact(message)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
