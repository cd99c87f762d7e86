"""The ``--config`` option every pipeline command takes, and where its default comes from."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from protocol.errors import ConfigError

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
