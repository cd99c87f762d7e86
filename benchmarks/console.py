"""The benchmarks' rich console: a terminal's own width; in a pipe or a file (``make bench``'s output,
``results/*.txt``) 200 columns, so that no table is cut or folded at 80."""

from __future__ import annotations

import sys

from rich.console import Console

#: Columns of a console that is no terminal: the widest table (ClickHouse's CPU by statement) fits.
PIPE_WIDTH = 200


def console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)
