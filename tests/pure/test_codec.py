"""Golden bytes of the control-message wire format, and the rules for evolving it.

``golden/*.hex`` are bytes earlier chtxn versions wrote: every fixture must keep decoding.
A failing ``test_encoding_matches_golden`` means the wire format changed: if a field was
appended with a default (allowed), add a fixture for the new encoding and keep the old one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import pytest

from protocol import codec
from protocol.codec import decode, encode
from protocol.messages import (
    KINDS,
    PROTOCOL_VERSION,
    AckCommit,
    Heartbeat,
    ParticipantFigures,
    TopicPartition,
    WriteStatus,
)
from tests.pure.codec_samples import SAMPLES

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text().strip())


def latest(kind: str) -> str:
    """The newest fixture of ``kind`` (``<kind>.v<N>.hex``): what today's writer must produce."""
    return max((p.name for p in GOLDEN.glob(f"{kind}.v*.hex")), key=lambda n: int(n.rsplit(".v", 1)[1].split(".")[0]))


def test_every_kind_has_a_sample_and_a_fixture() -> None:
    assert set(SAMPLES) == set(KINDS)
    for kind in KINDS:
        assert (GOLDEN / f"{kind}.v1.hex").exists(), f"add tests/pure/golden/{kind}.v1.hex for the new kind {kind}"


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_encoding_matches_golden(kind: str) -> None:
    assert encode(SAMPLES[kind]).hex() == golden(latest(kind)).hex(), (
        f"the wire format of {kind} changed; if a field was appended with a default, add a new "
        "fixture and keep the old one"
    )


@pytest.mark.parametrize("fixture", sorted(p.name for p in GOLDEN.glob("*.hex")))
def test_every_golden_fixture_still_decodes(fixture: str) -> None:
    kind = fixture.split(".", 1)[0]
    message = decode(golden(fixture))
    assert message is not None
    assert type(message) is KINDS[kind]
    if fixture == latest(kind):
        assert message == SAMPLES[kind]


def test_a_start_commit_of_an_old_leader_has_no_holders_and_fences_nobody() -> None:
    old = decode(golden("start-commit.v1.hex"))
    bare = {"holders": (), "chunk_rows": 0, "stage_tables": (), "shards": (), "shard_count": 0}
    assert old == msgspec.structs.replace(SAMPLES["start-commit"], **bare)


def test_a_start_commit_of_a_leader_older_than_routes_stages_every_topic_into_stage_table() -> None:
    old = decode(golden("start-commit.v3.hex"))
    assert old.stage_tables == () and old.stage_table_of("clicks") == old.stage_table == "events__chtxn_e3_t17"
    new = SAMPLES["start-commit"]
    assert new.stage_table_of("clicks") == "clicks__chtxn_e3_t17" and new.stage_table_of("other") == ""  # held


def test_a_start_commit_of_a_leader_older_than_touched_shards_stages_every_partition() -> None:
    old = decode(golden("start-commit.v4.hex"))
    assert old.shards == () and old.shard_count == 0
    src0, src1 = TopicPartition(topic="src", partition=0), TopicPartition(topic="src", partition=1)
    assert old.stage_table_for(src0) == old.stage_table_for(src1) == "events__chtxn_e3_t17"
    new = SAMPLES["start-commit"]
    assert new.stage_table_for(src0) == "events__chtxn_e3_t17" and new.stage_table_for(src1) == ""  # held


def test_a_heartbeat_of_a_participant_older_than_figures_carries_none() -> None:
    old = decode(golden("heartbeat.v3.hex"))
    assert old == msgspec.structs.replace(SAMPLES["heartbeat"], figures=None)


def test_figures_missing_some_fields_decode_with_zeros() -> None:
    fields = _as_map("heartbeat")
    fields["figures"] = {"rows_read": 7}  # a writer older than the other figures
    message = decode(msgspec.msgpack.encode(fields))
    assert isinstance(message, Heartbeat) and message.figures == ParticipantFigures(rows_read=7)


def test_a_reader_older_than_standby_heartbeats_skips_them_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    older = {kind: cls for kind, cls in KINDS.items() if kind != "standby-heartbeat"}
    monkeypatch.setattr(codec, "KINDS", older)
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(encode(SAMPLES["standby-heartbeat"])) is None
        assert decode(encode(SAMPLES["leader-heartbeat"])) == SAMPLES["leader-heartbeat"]
    assert [r.getMessage() for r in caplog.records] == [
        "skipping control message of unknown kind 'standby-heartbeat' (version 1)"
    ]


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip(kind: str) -> None:
    assert decode(encode(SAMPLES[kind])) == SAMPLES[kind]


# Bytes of writers from before the defaulted fields existed (written by hand from msgpack maps).
OLD_WRITE_STATUS = (
    "8ca46b696e64ac77726974652d737461747573a776657273696f6e01a8706970656c696e65a66f7264657273a565706f"
    "636802a374786ea565325f7435a673656e646572a27030a5746f706963a3737263a9706172746974696f6e00ac737461"
    "72745f6f66667365740aaa656e645f6f666673657414a4726f77730aa66368756e6b7301"
)
OLD_ACK = (
    "87a46b696e64aa61636b2d636f6d6d6974a776657273696f6e01a8706970656c696e65a66f7264657273a565706f6368"
    "02a374786ea565325f7435a673656e646572a163a76f6666736574739183a5746f706963a3737263a9706172746974696f"
    "6e00a66f666673657414"
)
OLD_HEARTBEAT = (
    "87a46b696e64a9686561727462656174a776657273696f6e01a8706970656c696e65a66f7264657273a565706f636802"
    "a374786ea0a673656e646572a27030aa706172746974696f6e739184a5746f706963a3737263a9706172746974696f6e00"
    "a8706f736974696f6e14a76c6f675f656e6419"
)


def test_messages_without_later_fields_decode_with_defaults() -> None:
    ws = decode(bytes.fromhex(OLD_WRITE_STATUS))
    assert isinstance(ws, WriteStatus)
    assert (ws.start_offset, ws.end_offset, ws.rows, ws.chunks) == (10, 20, 10, 1)
    assert (ws.dead_letters, ws.bytes, ws.errors) == (0, 0, ())
    ack = decode(bytes.fromhex(OLD_ACK))
    assert isinstance(ack, AckCommit) and ack.commit_seq == 0 and ack.offsets[0].offset == 20
    hb = decode(bytes.fromhex(OLD_HEARTBEAT))
    assert isinstance(hb, Heartbeat) and hb.partitions[0].buffered_rows == 0 and hb.partitions[0].log_end == 25


def _as_map(kind: str) -> dict:
    return msgspec.msgpack.decode(encode(SAMPLES[kind]))


def test_a_message_with_an_unknown_extra_field_decodes() -> None:
    fields = _as_map("abort") | {"priority": 5, "trace": {"id": "x"}}
    assert decode(msgspec.msgpack.encode(fields)) == SAMPLES["abort"]


def test_an_unknown_kind_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    fields = _as_map("end-commit") | {"kind": "compact-commit"}
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(msgspec.msgpack.encode(fields)) is None
    assert any("unknown kind 'compact-commit'" in r.getMessage() for r in caplog.records)


def test_a_newer_version_is_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    fields = _as_map("start-commit") | {"version": PROTOCOL_VERSION + 1}
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(msgspec.msgpack.encode(fields)) is None
    assert any(f"version {PROTOCOL_VERSION + 1}" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode([1, 2, 3])])
def test_garbage_is_skipped_not_raised(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(data) is None
    assert caplog.records


def test_a_known_kind_with_bad_fields_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    fields = _as_map("write-status") | {"rows": "many"}
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(msgspec.msgpack.encode(fields)) is None
    assert any("invalid write-status" in r.getMessage() for r in caplog.records)


def test_a_null_value_is_skipped_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="protocol.codec"):
        assert decode(None) is None
    assert any("null value" in r.getMessage() for r in caplog.records)
