"""``multipart/form-data`` request bodies and the external tables they carry.

A ClickHouse server reads a multipart body as an HTML form: each plain field counts as a URL
parameter (``query``, ``param_<name>``, settings, ...), and each file part named ``<name>`` is an
external table for this query only, described by the parameters ``<name>_structure``
(``"id UInt32, s String"``) or ``<name>_types`` (``"UInt32,String"``, columns ``_1``, ``_2``, ...)
and ``<name>_format`` (default ``TabSeparated``), in the URL or in the form.

The body is parsed with the standard library's ``email`` parser, which keeps file bytes as sent.
Field values are returned as ``latin-1`` text (one character per byte), as URL parameters are.
"""

from __future__ import annotations

from dataclasses import dataclass
from email import policy
from email.parser import BytesParser
from typing import cast

from embedded.ch_errors import BAD_ARGUMENTS, EngineError

_PARSER = BytesParser(policy=policy.HTTP)


@dataclass(frozen=True)
class Form:
    """The fields of a form body, in order, and its file parts by name."""

    fields: list[tuple[str, str]]
    files: dict[str, bytes]


@dataclass(frozen=True)
class ExternalTable:
    """A table sent with the query: ``CREATE TEMPORARY TABLE name (structure)`` filled with
    ``data`` in ``fmt``."""

    name: str
    structure: str
    fmt: str
    data: bytes


def is_form(content_type: str | None) -> bool:
    return (content_type or "").strip().lower().startswith("multipart/form-data")


def parse_form(body: bytes, content_type: str) -> Form:
    """Split a ``multipart/form-data`` body; raises BAD_ARGUMENTS when it is not one."""
    message = _PARSER.parsebytes(b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body)
    if not message.is_multipart() or message.defects:
        raise EngineError(
            BAD_ARGUMENTS,
            f"Cannot parse the multipart/form-data request body ({', '.join(map(str, message.defects)) or 'no parts'}): "
            "check its boundary and Content-Type",
        )
    fields: list[tuple[str, str]] = []
    files: dict[str, bytes] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        payload = cast(bytes, part.get_payload(decode=True) or b"")  # decoded: bytes (None for a multipart part)
        if part.get_filename() is not None:
            files[name] = payload
        else:
            fields.append((name, payload.decode("latin-1")))
    return Form(fields, files)


def external_tables(files: dict[str, bytes], params: dict[str, str]) -> list[ExternalTable]:
    """The external tables of ``files``; their ``<name>_structure/_types/_format`` entries are
    removed from ``params``. A file without a structure raises BAD_ARGUMENTS, as on a server."""
    tables = []
    for name, data in files.items():
        structure = params.pop(f"{name}_structure", None)
        types = params.pop(f"{name}_types", None)
        fmt = params.pop(f"{name}_format", None) or "TabSeparated"
        if structure is None and types is not None:
            structure = ", ".join(f"_{i} {t.strip()}" for i, t in enumerate(types.split(","), start=1))
        if not structure:
            raise EngineError(
                BAD_ARGUMENTS,
                f"Neither structure nor types have not been provided for external table {name}. "
                f"Use fields {name}_structure or {name}_types to do so.",
            )
        tables.append(ExternalTable(name, structure, fmt, data))
    return tables
