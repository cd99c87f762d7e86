"""Generates the reference pages in ``docs/`` from the code, so they cannot drift from it.

    python -m tools.docgen           # rewrite docs/configuration.md and docs/cli.md
    python -m tools.docgen --check   # exit 1 naming each page that differs from what the code gives

Run from the repository root with the project's environment (``.venv/bin/python``). ``tools/`` is
deliberately not a package of the installed distribution.

- ``docs/configuration.md`` comes from ``PipelineConfig``'s sections (``tools.docgen_config``).
- ``docs/cli.md`` comes from ``cli.build_parser()`` (``tools.docgen_cli``).

``tests/pure/test_docs.py`` fails when a committed page differs from what this module produces.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from tools.docgen_cli import cli_page
from tools.docgen_config import configuration_page
from tools.docgen_markdown import REGENERATE

ROOT = Path(__file__).resolve().parents[1]

# ---- entry point -----------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "docs/configuration.md": configuration_page,
    "docs/cli.md": cli_page,
}


def stale_pages(root: Path = ROOT) -> list[str]:
    """The generated pages whose committed text differs from what the code gives now."""
    stale = []
    for path, render in PAGES.items():
        target = root / path
        if not target.is_file() or target.read_text(encoding="utf-8") != render():
            stale.append(path)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.docgen", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages()
        for path in stale:
            print(f"{path} is stale: run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for path, render in PAGES.items():
        (ROOT / path).write_text(render(), encoding="utf-8")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
