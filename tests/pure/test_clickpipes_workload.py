"""The ClickPipes-like workload's records (``benchmarks.clickpipes_data``), its Avro codec
(``benchmarks.avro``) and its per-core figures (``benchmarks.clickpipes.per_core``). No I/O."""

from __future__ import annotations

import json
import statistics
import struct

import pytest

from benchmarks import avro, clickpipes, clickpipes_data
from benchmarks.clickpipes_data import SCHEMA, SCHEMA_ID, avro_value, confluent_payload, json_value, record

SAMPLE = range(0, 20_000, 97)


def test_json_records_are_about_1_6_kb() -> None:
    sizes = [len(json_value(i)) for i in SAMPLE]
    assert min(sizes) >= 1_500 and max(sizes) <= 1_700
    assert 1_550 <= statistics.mean(sizes) <= 1_650


def test_records_nest_objects_arrays_strings_numbers_and_a_map() -> None:
    decoded = json.loads(json_value(12_345))
    assert isinstance(decoded["user"], dict) and isinstance(decoded["user"]["premium"], bool)
    assert isinstance(decoded["device"]["screen"], dict) and isinstance(decoded["device"]["screen"]["width"], int)
    assert isinstance(decoded["items"], list) and len(decoded["items"]) == clickpipes_data.ITEMS
    assert all(isinstance(item, dict) and isinstance(item["unit_price"], float) for item in decoded["items"])
    assert all(isinstance(tag, str) for tag in decoded["tags"])
    assert len(decoded["attributes"]) == clickpipes_data.ATTRIBUTES
    assert decoded["id"] == 12_345


def test_records_are_deterministic_and_differ_by_index_and_seed() -> None:
    assert [json_value(i) for i in (5, 3, 5)] == [json_value(5), json_value(3), json_value(5)]
    assert json_value(5) != json_value(6)
    assert json_value(5, seed=1) != json_value(5, seed=2)
    assert avro_value(77) == avro_value(77)


def test_every_record_field_is_in_the_avro_schema_and_the_table_in_that_order() -> None:
    names = [field["name"] for field in SCHEMA["fields"]]
    assert list(record(1)) == names
    lines = clickpipes_data.TABLE_COLUMNS.splitlines()
    table = [line.split()[0] for line in lines if line.startswith("    ") and not line.startswith("     ")]
    assert table == [*names, "_topic", "_partition", "_offset"]


@pytest.mark.parametrize("i", [0, 1, 999, 123_456])
def test_the_avro_value_is_confluent_framed_and_decodes_back_to_the_record(i: int) -> None:
    value = avro_value(i)
    assert value[0] == 0 and struct.unpack(">I", value[1:5]) == (SCHEMA_ID,)
    schema_id, body = confluent_payload(value)
    assert schema_id == SCHEMA_ID
    assert avro.decode(SCHEMA, body) == record(i)


def test_avro_encodes_the_specifications_known_bytes() -> None:
    # Avro 1.11 spec: long 0 -> 00, -1 -> 01, 1 -> 02, -64 -> 7f, 64 -> 80 01; string "foo" -> 06 66 6f 6f
    assert [avro.encode("long", n) for n in (0, -1, 1, -64, 64)] == [b"\x00", b"\x01", b"\x02", b"\x7f", b"\x80\x01"]
    assert avro.encode("string", "foo") == b"\x06foo"
    assert avro.encode("double", 1.5) == struct.pack("<d", 1.5)
    assert avro.encode({"type": "array", "items": "long"}, [3, 27]) == b"\x04\x06\x36\x00"
    assert avro.encode({"type": "array", "items": "long"}, []) == b"\x00"
    assert avro.encode({"type": "map", "values": "boolean"}, {"a": True}) == b"\x02\x02a\x01\x00"
    pair = {"type": "record", "name": "p", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}]}
    assert avro.encode(pair, {"a": 27, "b": "foo"}) == b"\x36\x06foo"


def test_avro_decoding_reads_multi_block_arrays_and_refuses_leftovers_and_short_data() -> None:
    longs = {"type": "array", "items": "long"}
    # two blocks, the second with a negative count followed by its byte size
    assert avro.decode(longs, b"\x02\x02" + b"\x01\x02\x04" + b"\x00") == [1, 2]
    with pytest.raises(ValueError, match="left"):
        avro.decode("long", b"\x02\x02")
    with pytest.raises(ValueError, match="ends early"):
        avro.decode("string", b"\x06fo")
    with pytest.raises(ValueError, match="does not encode"):
        avro.encode(["null", "long"], None)


def test_a_value_without_the_magic_byte_is_not_confluent() -> None:
    with pytest.raises(ValueError, match="magic"):
        confluent_payload(json_value(1))


def test_per_core_divides_the_values_bytes_by_the_ingesting_cpu_alone() -> None:
    cpu_s = {"participant python": 3.0, "spark jvm": 1.0, "clickhouse": 8.0, "broker": 1.0, "other": 50.0}
    found = clickpipes.per_core("chtxn", rows=100_000, value_bytes=1_600, cpu_s=cpu_s, window_s=10.0)
    assert found["chtxn_mb_per_core_s"] == pytest.approx(160 / 4)
    assert found["chtxn_rows_per_core_s"] == pytest.approx(25_000)
    assert found["chtxn_clickhouse_mb_per_core_s"] == pytest.approx(160 / 8)
    assert found["chtxn_all_mb_per_core_s"] == pytest.approx(160 / 13)  # "other" is not the pipeline's
    assert found["chtxn_ingest_cores_busy"] == pytest.approx(0.4)
    plain = clickpipes.per_core("plain", rows=10, value_bytes=1, cpu_s={"clickhouse": 1.0}, window_s=1.0)
    assert plain["plain_mb_per_core_s"] is None  # no CPU of the loop measured: no figure
