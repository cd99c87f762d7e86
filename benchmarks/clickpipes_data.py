"""The ClickPipes-like workload's records: nested JSON events of about 1.6 KB, and the same as Avro. Pure.

ClickHouse publishes ClickPipes' Kafka throughput per vCPU for messages of about 1.6 KB of nested
JSON, and for the same data as Avro. ``record(i)`` is event ``i`` of such a stream: objects within
objects (``user``, ``device.screen``), an array of objects (``items``), an array of strings, a
string map, strings, integers, floats and a boolean.

Guarantees:

- ``record(i, seed)`` depends on ``i`` and ``seed`` alone: runs repeat, in any order;
- ``json_value(i)`` is that record as compact JSON, 1.5-1.7 KB (1.6 KB on average);
- ``avro_value(i)`` is the same record in the Confluent wire format: byte 0, ``SCHEMA_ID`` as 4
  bytes big-endian, then the record's Avro binary encoding under ``SCHEMA`` (``benchmarks.avro``);
- ``TABLE_COLUMNS`` are columns that both JSONEachRow and AvroConfluent insert the record into,
  field by field: a nested object is a named ``Tuple``, an array ``Array``, the string map a
  ``Map(String, String)``; the metadata columns ``_topic``, ``_partition``, ``_offset`` follow.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import msgspec

from benchmarks import avro

SEED = 7
SCHEMA_ID = 1
#: Items per event: a fixed count, so that every record's size stays near 1.6 KB.
ITEMS = 4
TAGS = 5
ATTRIBUTES = 4

EVENT_TYPES = ("page_view", "add_to_cart", "checkout", "purchase", "refund", "search")
COUNTRIES = ("US", "DE", "FR", "GB", "JP", "BR", "IN", "NL", "ES", "CA")
SEGMENTS = ("new", "returning", "loyal", "dormant")
OSES = (("iOS", "17.5.1"), ("Android", "14.0.2"), ("Windows", "11.23H2"), ("macOS", "14.4.1"), ("Linux", "6.8.0"))
MODELS = ("iPhone 15 Pro", "Pixel 8", "Galaxy S24", "ThinkPad X1", "MacBook Air", "Surface Pro 9")
CITIES = (
    ("Berlin", "BE", "Europe/Berlin"),
    ("Paris", "IDF", "Europe/Paris"),
    ("Austin", "TX", "America/Chicago"),
    ("Osaka", "27", "Asia/Tokyo"),
    ("Recife", "PE", "America/Recife"),
    ("Pune", "MH", "Asia/Kolkata"),
)
CATEGORIES = ("books", "garden", "kitchen", "toys", "sports", "audio", "outdoor", "beauty")
PAYMENTS = ("card", "paypal", "bank_transfer", "gift_card")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "BRL", "INR")
WORDS = (
    "quick",
    "delivery",
    "arrived",
    "packaging",
    "intact",
    "colour",
    "matches",
    "the",
    "photos",
    "battery",
    "lasts",
    "long",
    "enough",
    "for",
    "a",
    "weekend",
    "trip",
    "customer",
    "support",
    "answered",
    "within",
    "the",
    "hour",
    "would",
    "order",
    "again",
    "from",
    "this",
    "seller",
)

_ITEM = {
    "type": "record",
    "name": "item",
    "fields": [
        {"name": "sku", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "category", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "unit_price", "type": "double"},
        {"name": "discount", "type": "double"},
    ],
}


def _record(name: str, fields: list[tuple[str, Any]]) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


#: The Avro schema of every record (the registry serves it as ``SCHEMA_ID``).
SCHEMA: dict[str, Any] = _record(
    "clickpipes_event",
    [
        ("id", "long"),
        ("ts_ms", "long"),
        ("event_type", "string"),
        ("session_id", "string"),
        (
            "user",
            _record(
                "user",
                [
                    ("id", "long"),
                    ("name", "string"),
                    ("email", "string"),
                    ("country", "string"),
                    ("segment", "string"),
                    ("age", "int"),
                    ("score", "double"),
                    ("premium", "boolean"),
                ],
            ),
        ),
        (
            "device",
            _record(
                "device",
                [
                    ("os", "string"),
                    ("os_version", "string"),
                    ("model", "string"),
                    ("ip", "string"),
                    ("user_agent", "string"),
                    ("screen", _record("screen", [("width", "int"), ("height", "int")])),
                ],
            ),
        ),
        (
            "geo",
            _record(
                "geo",
                [
                    ("lat", "double"),
                    ("lon", "double"),
                    ("city", "string"),
                    ("region", "string"),
                    ("timezone", "string"),
                ],
            ),
        ),
        ("items", {"type": "array", "items": _ITEM}),
        ("tags", {"type": "array", "items": "string"}),
        ("attributes", {"type": "map", "values": "string"}),
        (
            "payment",
            _record(
                "payment",
                [("method", "string"), ("currency", "string"), ("amount", "double"), ("installments", "int")],
            ),
        ),
        ("review", "string"),
    ],
)

#: The target's columns, in the order of the record's fields, then the metadata columns.
TABLE_COLUMNS = """
    id Int64,
    ts_ms Int64,
    event_type LowCardinality(String),
    session_id String,
    user Tuple(id Int64, name String, email String, country LowCardinality(String), segment String,
        age Int32, score Float64, premium Bool),
    device Tuple(os String, os_version String, model String, ip String, user_agent String,
        screen Tuple(width Int32, height Int32)),
    geo Tuple(lat Float64, lon Float64, city String, region String, timezone String),
    items Array(Tuple(sku String, name String, category String, quantity Int32, unit_price Float64,
        discount Float64)),
    tags Array(String),
    attributes Map(String, String),
    payment Tuple(method String, currency String, amount Float64, installments Int32),
    review String,
    _topic LowCardinality(String),
    _partition UInt32,
    _offset UInt64
"""

_JSON = msgspec.json.Encoder()


def record(i: int, seed: int = SEED) -> dict[str, Any]:
    """Event ``i`` of the stream ``seed``: the same dict for the same arguments, every time."""
    rng = random.Random(seed * 1_000_003 + i)
    pick = rng.choice
    user_id = rng.randrange(1, 2_000_000)
    os_name, os_version = pick(OSES)
    city, region, zone = pick(CITIES)
    items: list[dict[str, Any]] = [
        {
            "sku": f"SKU-{rng.randrange(10**7):07d}-{pick(CATEGORIES)[:3].upper()}",
            "name": " ".join(rng.sample(WORDS, 4)),
            "category": pick(CATEGORIES),
            "quantity": rng.randrange(1, 6),
            "unit_price": round(rng.uniform(1, 500), 2),
            "discount": round(rng.random() * 0.3, 3),
        }
        for _ in range(ITEMS)
    ]
    total = sum(item["quantity"] * item["unit_price"] * (1 - item["discount"]) for item in items)
    return {
        "id": i,
        "ts_ms": 1_764_000_000_000 + i * 7 + rng.randrange(7),
        "event_type": pick(EVENT_TYPES),
        "session_id": "-".join(f"{rng.getrandbits(b):0{b // 4}x}" for b in (32, 16, 16, 16, 48)),
        "user": {
            "id": user_id,
            "name": f"user {user_id:07d} {pick(WORDS)}",
            "email": f"user{user_id:07d}@example-{rng.randrange(100):02d}.com",
            "country": pick(COUNTRIES),
            "segment": pick(SEGMENTS),
            "age": rng.randrange(18, 90),
            "score": round(rng.random() * 100, 4),
            "premium": rng.random() < 0.2,
        },
        "device": {
            "os": os_name,
            "os_version": os_version,
            "model": pick(MODELS),
            "ip": ".".join(str(rng.randrange(1, 255)) for _ in range(4)),
            "user_agent": f"Mozilla/5.0 ({os_name} {os_version}; {pick(MODELS)}) AppleWebKit/537.36 "
            f"(KHTML, like Gecko) Chrome/{rng.randrange(110, 130)}.0.{rng.randrange(1000, 9999)}.0 Safari/537.36",
            "screen": {"width": pick((390, 412, 1280, 1440, 1920)), "height": pick((844, 915, 800, 900, 1080))},
        },
        "geo": {
            "lat": round(rng.uniform(-60, 70), 6),
            "lon": round(rng.uniform(-180, 180), 6),
            "city": city,
            "region": region,
            "timezone": zone,
        },
        "items": items,
        "tags": rng.sample(WORDS, TAGS),
        "attributes": {
            f"attr_{k}": f"{pick(WORDS)}-{rng.randrange(10_000):04d}" for k in rng.sample(range(20), ATTRIBUTES)
        },
        "payment": {
            "method": pick(PAYMENTS),
            "currency": pick(CURRENCIES),
            "amount": round(total, 2),
            "installments": pick((1, 1, 1, 3, 6, 12)),
        },
        "review": " ".join(rng.choice(WORDS) for _ in range(30)),
    }


def json_value(i: int, seed: int = SEED) -> bytes:
    """Record ``i`` as one compact JSON object (a JSONEachRow record)."""
    return _JSON.encode(record(i, seed))


_HEADER = b"\x00" + struct.pack(">I", SCHEMA_ID)


def avro_value(i: int, seed: int = SEED) -> bytes:
    """Record ``i`` in the Confluent wire format under ``SCHEMA`` (an AvroConfluent record)."""
    return _HEADER + avro.encode(SCHEMA, record(i, seed))


def confluent_payload(value: bytes) -> tuple[int, bytes]:
    """The schema id and the Avro body of a Confluent wire-format value; ValueError if it is not one."""
    if len(value) < 5 or value[0] != 0:
        raise ValueError("not a Confluent wire-format value: no magic byte 0")
    return struct.unpack(">I", value[1:5])[0], value[5:]
