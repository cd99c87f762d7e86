"""The ``--timeout`` option of the one-shot commands that ask the Kafka broker for its topics
(``chtxn init``, ``chtxn doctor``): how long a broker may take before it counts as unreachable."""

from __future__ import annotations

import argparse

from clients import kafka as kafka_clients


def add_broker_timeout_option(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS`` (default ``clients.kafka.DEFAULT_TIMEOUT_S``), read as ``args.timeout``."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=kafka_clients.DEFAULT_TIMEOUT_S,
        help="seconds to wait for the Kafka broker (default %(default)g)",
    )
