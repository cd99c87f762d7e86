"""The ``--config`` option every pipeline command takes, where its default comes from, and the config
as the pipeline's processes run it (``learnt``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from protocol.config.parse import PipelineConfig
from protocol.errors import ChtxnError, ClickHouseError, ConfigError, SetupError

#: The file ``--config`` falls back to, in the working directory, when ``$CHTXN_CONFIG`` is not set.
DEFAULT_FILE = "pipeline.toml"


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``, optional: ``default_config`` fills it in when not given."""
    parser.add_argument(
        "--config",
        default=None,
        metavar="FILE",
        help=f"pipeline TOML file (default: $CHTXN_CONFIG, else ./{DEFAULT_FILE} when it exists)",
    )


def default_config(environ: Mapping[str, str], cwd: Path) -> str:
    """``$CHTXN_CONFIG`` when set, else ``./pipeline.toml`` when it exists; ``ConfigError`` otherwise."""
    if environ.get("CHTXN_CONFIG"):
        return environ["CHTXN_CONFIG"]
    if (cwd / DEFAULT_FILE).is_file():
        return DEFAULT_FILE
    raise ConfigError(
        f"no pipeline config: --config not given, CHTXN_CONFIG not set, and no ./{DEFAULT_FILE} in {cwd}; "
        "pass --config FILE"
    )


def learnt(cfg: PipelineConfig, *, timeout_s: float | None = None) -> tuple[PipelineConfig, ChtxnError | None]:
    """``cfg`` as the coordinator and the participants run it (a Distributed target: its local table on its
    cluster's shards, ``clients.target_table.learnt``) and None; or ``cfg`` itself and why it could not be
    learnt (a ``ClickHouseError``: the server did not answer within ``timeout_s``; a ``SetupError``: a
    Distributed target chtxn cannot load), for a command that reports what it can without it."""
    from clients import target_table

    try:
        return target_table.learnt(cfg, timeout_s=timeout_s), None
    except (ClickHouseError, SetupError) as exc:
        return cfg, exc
