"""``chtxn coordinator``: run one coordinator replica until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from cli.config_option import add_config_option
from coordinator.metrics import CoordinatorMetrics
from coordinator.service import CoordinatorService
from protocol.config import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "coordinator",
        help="run a coordinator replica (run 2+ for high availability; one leads)",
        description="Run one coordinator replica. Replicas elect a leader through a lease on the control "
        "topic; a standby takes over when the leader falls silent for coordinator.leader_lease_s. "
        "SIGTERM finishes committed work, aborts the open transaction and exits.",
        epilog="Example: chtxn coordinator --config pipeline.toml --metrics-port 9464",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on this port (overrides coordinator.metrics_port)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    metrics = CoordinatorMetrics(cfg.name)
    port = cfg.coordinator.metrics_port if args.metrics_port is None else args.metrics_port
    metrics.serve(port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    CoordinatorService(cfg, metrics=metrics).run(stop)
    return 0
