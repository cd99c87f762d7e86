"""Secrets never leave a process: masking for every error, log line, table and JSON output.

A secret is the value of a key whose name says so (``is_secret_key``: passwords, secrets, tokens,
JAAS configs, PEM keys), the password of a URL (``mask_url``), or any value the configuration of
this process holds under such a key (``remember``; ``redact`` replaces them in any text, the
backstop for messages built from values chtxn did not mask at their source). Masked values read
``***``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
#: Parts of a key name that make its value a secret (lower case).
SECRET_WORDS = ("password", "passwd", "secret", "token", "jaas", ".pem", "credential", "apikey", "api_key")
#: ``scheme://user:password@`` in any text.
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^\s/:@]*:)(?P<password>[^\s/@]+)@", re.IGNORECASE)
#: Values shorter than this are not searched for in text (``redact``): too likely to be words.
MIN_REMEMBERED = 4

_remembered: set[str] = set()


def is_secret_key(key: str) -> bool:
    """Whether the value of ``key`` (``sasl.password``, ``clickhouse.password``, ...) is a secret."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_WORDS)


def mask_url(url: str) -> str:
    """``url`` with the password of its credentials masked (``http://user:***@host:8123``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}{MASK}@", url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def masked(key: str, value: object) -> object:
    """``value`` as it may be shown under ``key``: masked when the key is secret; a mapping with
    its secret keys masked; a string with any URL password masked."""
    if isinstance(value, Mapping):
        return {k: masked(str(k), v) for k, v in value.items()}
    if is_secret_key(key):
        return MASK if value not in ("", None) else value
    if isinstance(value, str):
        return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}{MASK}@", value)
    return value


def remember(values: Iterable[object]) -> None:
    """Secrets this process holds, for ``redact`` to find in any text (short ones are not kept)."""
    _remembered.update(str(v) for v in values if v is not None and len(str(v)) >= MIN_REMEMBERED)


def redact(text: str) -> str:
    """``text`` with every remembered secret and every URL password masked."""
    for value in sorted(_remembered, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}{MASK}@", text)
