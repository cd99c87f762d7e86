"""``chtxn coordinator``: run one coordinator replica until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import os
import signal
import threading

from cli.config_option import add_config_option
from coordinator.metrics import CoordinatorMetrics
from coordinator.metrics_server import MetricsServer
from coordinator.service import CoordinatorService
from protocol.config.parse import load_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "coordinator",
        help="run a coordinator replica (run 2+ for high availability; one leads)",
        description="Run one coordinator replica. Replicas elect a leader through a lease on the control "
        "topic; a standby takes over when the leader falls silent for coordinator.leader_lease_s. "
        "SIGTERM finishes committed work, aborts the open transaction and exits. "
        "With a metrics port, the replica serves Prometheus metrics on /metrics and its readiness on "
        "/ready: 200 for the leader once its take-over is done and for a standby that reaches ClickHouse "
        "and the broker, 503 otherwise, with one line saying which.",
        epilog="Example: chtxn coordinator --config pipeline.toml --metrics-port 9464 --metrics-address 0.0.0.0",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_option(parser)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve /metrics and /ready on this port (overrides coordinator.metrics_port; 0: none)",
    )
    parser.add_argument(
        "--metrics-address",
        default=None,
        metavar="ADDRESS",
        help="the address that port binds (overrides coordinator.metrics_address, default 127.0.0.1; "
        "0.0.0.0 for every interface)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, os.environ)
    metrics = CoordinatorMetrics.of(cfg)
    service = CoordinatorService(cfg, metrics=metrics)
    port = cfg.coordinator.metrics_port if args.metrics_port is None else args.metrics_port
    address = cfg.coordinator.metrics_address if args.metrics_address is None else args.metrics_address
    server = MetricsServer(metrics.registry, service.readiness, address=address, port=port) if port else None
    if server is not None:
        server.start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        service.run(stop)
    finally:
        if server is not None:
            server.stop()
    return 0
