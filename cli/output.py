"""How the read commands print: ``--format table|wide|tsv|json``, the same way for every command.

- ``table`` (the default): the columns that matter. Into a pipe or a file: plain aligned text, a
  title line, a header line and a line per row, every cell whole (a newline or tab in it written
  ``\\n``, ``\\t``), no line ending in a space, however wide the lines get. On a terminal, the same
  table with colour, fitted to its width: prose columns (reasons, errors) wrap onto more lines; ids,
  offsets and numbers are never cut or folded, and when they alone do not fit, the lines stay whole
  (the terminal wraps them).
- ``wide``: the same with every column.
- ``tsv``: a header line of column keys, then a line per row, cells separated by one tab, never
  padded; a backslash, tab, newline or carriage return in a cell is written ``\\\\``, ``\\t``,
  ``\\n``, ``\\r``. Anything else the command says (a heading, a verdict) goes to stderr.
- ``json``: what the command printed with ``--json``, which stays as an alias. The commands print
  it themselves.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import IO, NamedTuple

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

FORMATS = ("table", "wide", "tsv", "json")


def add_format_option(parser: argparse.ArgumentParser, *, rows: str) -> None:
    """``--format`` (default ``table``) and ``--json`` (the same as ``--format json``); ``rows``
    says what a line of the table is, e.g. "one line per transaction"."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help=f"table (default): the columns that matter; wide: every column; tsv: a header line, then {rows}, "
        "tab-separated; json: what --json prints",
    )
    parser.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        default=argparse.SUPPRESS,
        help="print JSON: the same as --format json",
    )


class Column(NamedTuple):
    header: str  # as a table shows it
    key: str  # in the header line of TSV
    right: bool = False  # right-aligned (numbers)
    wide: bool = False  # only with --format wide or tsv
    fold: int = 0  # prose (a reason, an error): on a terminal it may wrap down to this width (0: never)


class Styled(NamedTuple):
    """A cell's text with a rich style for terminals (colour); pipes get the text alone."""

    text: str
    style: str


Cell = str | Styled


class Sheet:
    """A table to print: a title, columns, and rows with a cell per column."""

    def __init__(self, title: str, columns: Sequence[Column]) -> None:
        self.title = title
        self.columns = tuple(columns)
        self.rows: list[tuple[Cell, ...]] = []

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(cells)


def _text(cell: Cell) -> str:
    return cell.text if isinstance(cell, Styled) else cell


def _rich(cell: Cell) -> Text:
    return Text(cell.text, style=cell.style) if isinstance(cell, Styled) else Text(cell)


_TSV = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_ONE_LINE = str.maketrans({"\t": "\\t", "\n": "\\n", "\r": "\\r"})


class Output:
    """Prints a command's tables, key-value facts and notes in format ``fmt`` to ``file`` (stdout).

    Rich renders only on a terminal; anything else gets whole lines. ``tsv`` sends notes to stderr,
    so that stdout holds only the TSV.
    """

    def __init__(self, fmt: str, file: IO[str] | None = None) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown output format {fmt!r}: use one of {', '.join(FORMATS)}")
        self.format = fmt
        self._file = file if file is not None else sys.stdout
        self.terminal = self._file.isatty()
        self._console = Console(file=self._file, highlight=False, soft_wrap=not self.terminal)
        self._notes = Console(file=sys.stderr, highlight=False, soft_wrap=True) if fmt == "tsv" else self._console

    def note(self, markup: str) -> None:
        """A line of prose (rich markup: escape what comes from data with ``rich.markup.escape``)."""
        self._notes.print(markup)

    def sheet(self, sheet: Sheet) -> None:
        """``sheet`` as the format says: its ``wide`` columns only with ``wide`` and ``tsv``."""
        picked = [i for i, c in enumerate(sheet.columns) if not c.wide or self.format != "table"]
        columns = [sheet.columns[i] for i in picked]
        rows = [[row[i] for i in picked] for row in sheet.rows]
        if self.format == "tsv":
            self._lines(["\t".join(c.key for c in columns)])
            self._lines(["\t".join(_text(cell).translate(_TSV) for cell in row) for row in rows])
            return
        widths = _fit(columns, rows, self._console.width) if self.terminal else None
        if widths is None:
            self._lines(_aligned(sheet.title, columns, rows))
            return
        title = Text(sheet.title, style="table.title", justify="left") if sheet.title else None
        table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
        for c, width in zip(columns, widths):
            table.add_column(c.header, justify="right" if c.right else "left", width=width, overflow="fold")
        for row in rows:
            table.add_row(*(_rich(cell) for cell in row))
        self._console.print(table)

    def facts(self, pairs: Sequence[tuple[str, Cell]]) -> None:
        """Name-value pairs, a line each; a value's own lines are kept, under the value column."""
        if self.terminal:
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold", no_wrap=True)
            grid.add_column(overflow="fold")
            for name, value in pairs:
                grid.add_row(name, _rich(value))
            self._console.print(grid)
            return
        width = max((cell_len(name) for name, _ in pairs), default=0)
        lines = []
        for name, value in pairs:
            first, *more = _text(value).splitlines() or [""]
            lines.append(f"{_pad(name, width, False)}  {first}".rstrip())
            lines += [(" " * (width + 2) + line).rstrip() for line in more]
        self._lines(lines)

    def _lines(self, lines: Sequence[str]) -> None:
        for line in lines:
            self._file.write(line + "\n")
        self._file.flush()


#: Spaces between two columns.
_GAP = 2


def _fit(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], space: int) -> list[int] | None:
    """Column widths that fit ``space`` terminal columns, or None when they cannot.

    A column is as wide as its widest line and its header, if they all fit. If not, headers wrap
    at their spaces and ``fold`` columns narrow (to ``Column.fold`` at the least), the width left
    shared out to the columns that need least first. A cell of a column that does not fold always
    fits on one line.
    """
    natural, least = [], []
    for j, c in enumerate(columns):
        cells = [cell_len(line) for row in rows for line in _text(row[j]).splitlines()]
        natural.append(max([*cells, cell_len(c.header), 1]))
        words = max([*cells, *(cell_len(w) for w in c.header.split()), 1])
        least.append(min(natural[j], c.fold) if c.fold else words)
    room = space - _GAP * (len(columns) - 1)
    if sum(natural) <= room:
        return natural
    if sum(least) > room:
        return None
    widths, extra = list(least), room - sum(least)
    wanting = sorted(range(len(columns)), key=lambda j: natural[j] - least[j])
    for k, j in enumerate(wanting):
        widths[j] += min(natural[j] - least[j], extra // (len(wanting) - k))
        extra -= widths[j] - least[j]
    return widths


def _aligned(title: str, columns: Sequence[Column], rows: Sequence[Sequence[Cell]]) -> list[str]:
    """The plain table: a title line, a header line and a line per row; cells whole, in aligned
    columns, ``_GAP`` spaces apart; no line ends in a space."""
    texts = [[c.header for c in columns]] + [[_text(cell).translate(_ONE_LINE) for cell in row] for row in rows]
    widths = [max(cell_len(r[j]) for r in texts) for j in range(len(columns))]
    lines = [title] if title else []
    for r in texts:
        lines.append((" " * _GAP).join(_pad(v, w, c.right) for v, w, c in zip(r, widths, columns)).rstrip())
    return lines


def _pad(text: str, width: int, right: bool) -> str:
    space = " " * (width - cell_len(text))
    return space + text if right else text + space
