"""The keys a config section takes, for "did you mean" on an unknown key (``protocol.config.parse``)."""

from __future__ import annotations

import difflib
import re
import typing
from typing import Any

import msgspec


def section_type(root: type, path: str) -> type | None:
    """The ``msgspec.Struct`` at ``path`` (``kafka``, ``route[0]``; "" for ``root``), or None."""
    cls: Any = root
    for part in [p for p in re.sub(r"\[\d+\]", "", path).split(".") if p]:
        hint = typing.get_type_hints(cls).get(part)
        cls = _struct_in(hint)
        if cls is None:
            return None
    return cls


def suggest(root: type, path: str, key: str) -> str | None:
    """The key of the section at ``path`` that ``key`` most likely misspells, if any is close."""
    cls = section_type(root, path)
    if cls is None:
        return None
    names = [f.encode_name for f in msgspec.structs.fields(cls)]
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    return close[0] if close else None


def _struct_in(hint: Any) -> type | None:
    """The Struct type ``hint`` names, directly or inside ``tuple[...]``, ``list[...]`` or ``X | None``."""
    if isinstance(hint, type) and issubclass(hint, msgspec.Struct):
        return hint
    for arg in typing.get_args(hint):
        if (found := _struct_in(arg)) is not None:
            return found
    return None
