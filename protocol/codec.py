"""Encode and decode control messages; unknown kinds and newer versions are skipped, not fatal."""

from __future__ import annotations

import logging

import msgspec

from protocol.messages import KINDS, PROTOCOL_VERSION, ControlMessage

log = logging.getLogger(__name__)


class _Envelope(msgspec.Struct, kw_only=True):
    """The part of every message a reader looks at before trusting the rest."""

    kind: str = ""
    version: int = 0


_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_message_decoder = msgspec.msgpack.Decoder(ControlMessage)


def encode(message: ControlMessage) -> bytes:
    return _encoder.encode(message)


def decode(data: bytes | None) -> ControlMessage | None:
    """The message in ``data``, or None (with a warning) for what this reader must skip.

    Skipped: a null value (a tombstone), bytes that are not a message map, unknown kinds,
    versions newer than ``PROTOCOL_VERSION``, and known kinds whose fields do not validate.
    """
    if data is None:
        log.warning("skipping a control record with a null value (a tombstone)")
        return None
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.DecodeError as exc:
        log.warning("skipping undecodable control message: %s", exc)
        return None
    if envelope.kind not in KINDS:
        log.warning("skipping control message of unknown kind %r (version %d)", envelope.kind, envelope.version)
        return None
    if envelope.version > PROTOCOL_VERSION:
        log.warning(
            "skipping %s message of version %d: this reader knows version %d; upgrade chtxn",
            envelope.kind,
            envelope.version,
            PROTOCOL_VERSION,
        )
        return None
    try:
        return _message_decoder.decode(data)
    except msgspec.DecodeError as exc:
        log.warning("skipping invalid %s message: %s", envelope.kind, exc)
        return None
