"""Just enough of ClickHouse's SQL lexer to route a statement the way its HTTP handler does.

The endpoint never rewrites a query's meaning: it only needs to know what kind of statement it
holds (first keyword), where an INSERT's inline data begins (after ``FORMAT <name>`` or
``VALUES``, or after the ``FORMAT`` of an ``INSERT ... SELECT ... FROM input(...)``, whose call
it finds so that the engine can read the data in its place), which output format a query asks
for, and the assignments of a ``SET``. Quoted
strings, quoted identifiers, comments and brackets are skipped, so keywords inside them never
count. Text is handled as ``latin-1`` so that character offsets are byte offsets.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

#: Statements that only read, and so may run over GET or with ``readonly`` set.
READ_ONLY_KINDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK", "SET", "USE"})
#: Statements whose result is a table in an output format (so the reply names that format).
RESULT_KINDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK", "KILL"})

# Bytes from 0x80 up (UTF-8 sequences, as latin-1 characters) are identifier characters, as in
# ClickHouse's lexer; only ASCII counts as blank or digit.
_WORD = re.compile(r"[A-Za-z_\x80-\xff][A-Za-z0-9_$\x80-\xff]*")
_SPACE = re.compile(r"[ \t\n\r\f\v]+")
_BLANKS = " \t\n\r\f\v"
_NUMBER = re.compile(r"[0-9][0-9A-Za-z_.]*(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True)
class Token:
    """One lexeme: ``kind`` is ``word``, ``quoted``, ``string``, ``number`` or ``punct``."""

    kind: str
    text: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.text.upper() in words


def tokens(text: str) -> Iterator[Token]:
    """Lex ``text`` lazily, skipping whitespace and comments; stops quietly at an unclosed quote."""
    pos, size = 0, len(text)
    while pos < size:
        ch = text[pos]
        if ch in _BLANKS:
            pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # ch is a blank: a match
        elif text.startswith("--", pos) or ch == "#":
            nl = text.find("\n", pos)
            pos = size if nl < 0 else nl + 1
        elif text.startswith("/*", pos):
            close = text.find("*/", pos + 2)
            pos = size if close < 0 else close + 2
        elif ch in "'\"`":
            end = _closing_quote(text, pos)
            if end < 0:
                return
            yield Token("string" if ch == "'" else "quoted", text[pos:end], pos, end)
            pos = end
        elif word := _WORD.match(text, pos):
            end = word.end()
            yield Token("word", text[pos:end], pos, end)
            pos = end
        elif "0" <= ch <= "9":
            end = _NUMBER.match(text, pos).end()  # type: ignore[union-attr]  # ch is a digit: a match
            yield Token("number", text[pos:end], pos, end)
            pos = end
        else:
            yield Token("punct", ch, pos, pos + 1)
            pos += 1


def _closing_quote(text: str, start: int) -> int:
    """Index just past the quote closing the one at ``start`` (backslash and doubled escapes), or -1."""
    quote, pos = text[start], start + 1
    while pos < len(text):
        ch = text[pos]
        if ch == "\\":
            pos += 2
        elif ch == quote:
            if text.startswith(quote * 2, pos):
                pos += 2
            else:
                return pos + 1
        else:
            pos += 1
    return -1


def _top_level(text: str) -> Iterator[Token]:
    """Tokens outside any bracket, plus the outermost brackets themselves."""
    depth = 0
    for tok in tokens(text):
        if tok.kind == "punct" and tok.text in "([{":
            depth += 1
            if depth == 1:
                yield tok
        elif tok.kind == "punct" and tok.text in ")]}":
            depth = max(0, depth - 1)
            if depth == 0:
                yield tok
        elif depth == 0:
            yield tok


def statement_kind(text: str) -> str:
    """The statement's first keyword, upper-cased (``""`` when there is none)."""
    for tok in tokens(text):
        return tok.text.upper() if tok.kind == "word" else ""
    return ""


def output_format(text: str) -> str | None:
    """The format named by the statement's own top-level ``FORMAT`` clause, if any."""
    found = None
    toks = list(_top_level(text))
    for tok, nxt in pairwise(toks):
        if tok.is_word("FORMAT") and nxt.kind in ("word", "quoted"):
            found = nxt.text.strip('`"')
    return found


@dataclass(frozen=True)
class InsertWithData:
    """An INSERT whose rows follow the statement: ``statement`` has no FORMAT clause; the data
    starts at byte ``data_offset`` of the text that was split, in ``input_format``."""

    statement: str
    input_format: str
    data_offset: int
    #: For ``INSERT ... SELECT ... FROM input(<args>)``: where ``input(<args>)`` is in ``statement``.
    input_call: tuple[int, int] | None = None
    #: ``<args>`` of that call: the structure of the data, as ClickHouse's input() takes it.
    input_args: str = ""


def split_insert(text: str) -> InsertWithData | None:
    """Split ``INSERT ... FORMAT <name> <data>``, ``INSERT ... VALUES <data>`` or
    ``INSERT ... SELECT ... FROM input(<structure>) ... FORMAT <name> <data>``.

    As ClickHouse does, the data begins after the format name, past blanks and at most one line
    break. Returns None for anything else (an ``INSERT ... SELECT`` without ``input()``, other
    statements, a head of text too short to hold the whole statement).
    """
    toks = _top_level(text)
    first = next(toks, None)
    if first is None or not first.is_word("INSERT"):
        return None
    selecting = False
    call: tuple[int, int] | None = None
    args = ""
    for tok in toks:
        if tok.is_word("SELECT", "WITH"):
            selecting = True
        elif selecting and call is None and tok.is_word("INPUT"):
            call, args = _call_span(text, tok)
        elif tok.is_word("VALUES") and not selecting:
            return InsertWithData(text[: tok.start].rstrip(), "Values", tok.end)
        elif tok.is_word("FORMAT"):
            name = next(toks, None)
            if name is None or name.kind not in ("word", "quoted") or (selecting and call is None):
                return None
            fmt = name.text.strip('`"')
            return InsertWithData(text[: tok.start].rstrip(), fmt, _data_start(text, name.end), call, args)
    return None


def _call_span(text: str, name: Token) -> tuple[tuple[int, int] | None, str]:
    """The span of ``name(...)`` and the text between its brackets; ``(None, "")`` when ``name`` is
    not called. Only the top-level ``(`` and ``)`` of a call are lexed again here."""
    depth, start = 0, None
    for tok in tokens(text[name.end :]):
        if start is None:
            if tok.text != "(":
                return None, ""
            start = name.end + tok.end
        if tok.kind == "punct" and tok.text in "([{":
            depth += 1
        elif tok.kind == "punct" and tok.text in ")]}":
            depth -= 1
            if depth == 0:
                close = name.end + tok.start
                return (name.start, close + 1), text[start:close].strip()
    return None, ""


def _data_start(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\f":
        pos += 1
    if text.startswith("\r\n", pos):
        return pos + 2
    if pos < len(text) and text[pos] in "\r\n":
        return pos + 1
    return pos


def set_assignments(text: str) -> list[tuple[str, str]] | None:
    """The ``(name, literal)`` pairs of ``SET a = 1, b = 'x'``; None if it is another kind of SET."""
    toks = [t for t in _top_level(text) if t.text != ";"]
    if len(toks) < 4 or not toks[0].is_word("SET") or toks[1].is_word("ROLE", "DEFAULT", "TRANSACTION"):
        return None
    segments: list[list[Token]] = [[]]
    for tok in toks[1:]:
        if tok.kind == "punct" and tok.text == ",":
            segments.append([])
        else:
            segments[-1].append(tok)
    pairs: list[tuple[str, str]] = []
    for seg in segments:
        if len(seg) < 3 or seg[0].kind not in ("word", "quoted") or seg[1].text != "=":
            return None
        pairs.append((seg[0].text.strip('`"'), text[seg[2].start : seg[-1].end]))
    return pairs


def use_database(text: str) -> str | None:
    """The database named by ``USE db``, or None."""
    toks = list(tokens(text))
    if len(toks) >= 2 and toks[0].is_word("USE") and toks[1].kind in ("word", "quoted"):
        return toks[1].text.strip('`"')
    return None


def quote(value: str) -> str:
    """``value`` as a ClickHouse string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: ``system.processes`` as a server shows it: ``query_id`` is the HTTP query id, which the endpoint
#: passes to the engine in the ``log_comment`` setting (the engine gives each statement its own id).
PROCESSES_WITH_HTTP_IDS = (
    "(SELECT * REPLACE (if(Settings['log_comment'] != '', Settings['log_comment'], query_id) AS query_id) "
    "FROM system.processes)"
)


def with_http_query_ids(text: str) -> str:
    """``text`` with ``query_id`` meaning the HTTP query id: in ``KILL QUERY WHERE ...`` every
    ``query_id`` becomes the ``log_comment`` setting of the process; elsewhere ``system.processes``
    becomes a view whose ``query_id`` is that setting."""
    toks = list(tokens(text))
    edits: list[tuple[int, int, str]] = []
    if len(toks) > 1 and toks[0].is_word("KILL") and toks[1].is_word("QUERY"):
        edits = [(t.start, t.end, "Settings['log_comment']") for t in toks if t.kind == "word" and t.text == "query_id"]
    else:
        for first, dot, second in zip(toks, toks[1:], toks[2:]):
            if (first.kind, first.text, dot.text, second.kind, second.text) == (
                "word",
                "system",
                ".",
                "word",
                "processes",
            ):
                edits.append((first.start, second.end, PROCESSES_WITH_HTTP_IDS))
    for start, end, replacement in reversed(edits):
        text = text[:start] + replacement + text[end:]
    return text
