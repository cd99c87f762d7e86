"""Structured logs: one JSON object per line on stderr, quiet (WARNING) by default, secrets
masked. The formatter lives in ``clients.logs`` (shipped to Spark executors, so participant tasks
log the same lines); this module keeps the coordinator's import path."""

from __future__ import annotations

from clients.logs import JsonFormatter, setup_logging

__all__ = ["JsonFormatter", "setup_logging"]
