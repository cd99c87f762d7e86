"""The ClickPipes-like workloads of ``make bench`` (``--workload clickpipes-json|clickpipes-avro``).

ClickHouse publishes ClickPipes' (at-least-once) Kafka ingestion per vCPU: about 63 MB/s of JSON
and 99 MB/s of Avro, for messages of about 1.6 KB of nested JSON, the same data as Avro. These
workloads produce such messages (``benchmarks.clickpipes_data``) and report the figures that
compare with those: MB/s and rows/s per core of the ingesting processes alone.

- ``clickpipes-json``: the records as JSON (``clickhouse.input_format`` JSONEachRow);
- ``clickpipes-avro``: the same records in the Confluent wire format (AvroConfluent), the schema
  served from files by ``embedded.schema_registry`` in the benchmark's process (``serving``).

Both insert into one table shape (``target_ddl``): nested objects as named ``Tuple``, arrays as
``Array``, the string map as ``Map(String, String)``: types both formats fill field by field, so
the two runs write the same rows into the same columns.

``per_core`` gives the figures, from the CPU seconds by component (``benchmarks.cpu``) and the
bytes of the record values (the MB of "MB/s": 10^6 bytes of Kafka values, Avro's own bytes for
Avro). chtxn's ingesting processes are the participant's Python workers and Spark's JVM; the
plain loop's are its own processes; ClickHouse's CPU is given apart, and so is everything's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rich.table import Table

from benchmarks import clickpipes_data
from embedded.schema_registry import schema_registry

WORKLOADS = ("demo", "clickpipes-json", "clickpipes-avro")
#: The input format of each ClickPipes-like workload.
FORMATS = {"clickpipes-json": "JSONEachRow", "clickpipes-avro": "AvroConfluent"}
#: ClickPipes' published throughput per vCPU, MB/s, for the format of each workload.
PUBLISHED_MB_PER_VCPU = {"clickpipes-json": 63.0, "clickpipes-avro": 99.0}
#: The components (``benchmarks.cpu``) that do the ingesting, on each side.
INGESTING = {"chtxn": ("participant python", "spark jvm"), "plain": ("plain loop",)}
#: Components that are not the pipeline's (as ``benchmarks.bench.NOT_MEASURED``).
NOT_PIPELINE = ("other", "paced producer", "benchmark driver")


def values(workload: str) -> Callable[[int], bytes]:
    """Record ``i``'s Kafka value of ``workload`` (a ClickPipes-like one)."""
    if workload == "clickpipes-avro":
        return clickpipes_data.avro_value
    if workload == "clickpipes-json":
        return clickpipes_data.json_value
    raise ValueError(f"not a ClickPipes-like workload: {workload!r}")


def target_ddl(database: str, table: str) -> str:
    """``CREATE TABLE database.table``: the records' fields as nested columns, then the metadata columns."""
    return (
        f"CREATE TABLE {database}.{table} ({clickpipes_data.TABLE_COLUMNS}) "
        "ENGINE = MergeTree ORDER BY (event_type, ts_ms)"
    )


@contextmanager
def serving(workload: str, directory: Path) -> Iterator[dict[str, str]]:
    """The ``[clickhouse.insert_settings]`` of ``workload``, with the schema registry they name running.

    For ``clickpipes-avro`` the schema is written to ``directory`` as ``<SCHEMA_ID>.avsc`` and served
    until the block ends (``format_avro_schema_registry_url``); other workloads need no setting.
    """
    if workload != "clickpipes-avro":
        yield {}
        return
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{clickpipes_data.SCHEMA_ID}.avsc").write_text(json.dumps(clickpipes_data.SCHEMA))
    with schema_registry(directory) as url:
        yield {"format_avro_schema_registry_url": url}


def per_core(
    side: str, rows: int, value_bytes: float, cpu_s: Mapping[str, float], window_s: float
) -> dict[str, float | None]:
    """The figures of one side (``chtxn`` or ``plain``) for ``rows`` rows of ``value_bytes`` each.

    ``cpu_s`` is CPU seconds by component over ``window_s`` seconds. Per core means per CPU second
    of the components named: ``<side>_mb_per_core_s`` (ingesting processes, ``INGESTING``),
    ``<side>_rows_per_core_s``, ``<side>_clickhouse_mb_per_core_s`` (ClickHouse's CPU alone),
    ``<side>_all_mb_per_core_s`` (every component of the pipeline: broker, coordinator and
    ClickHouse included); and the cores each kept busy over the window. None where a figure's CPU
    is zero (not measured).
    """
    mb = rows * value_bytes / 1e6
    ingest = sum(cpu_s.get(c, 0.0) for c in INGESTING[side])
    clickhouse = cpu_s.get("clickhouse", 0.0)
    everything = sum(s for c, s in cpu_s.items() if c not in NOT_PIPELINE)

    def per(amount: float, seconds: float) -> float | None:
        return amount / seconds if seconds > 0 else None

    return {
        f"{side}_mb_per_core_s": per(mb, ingest),
        f"{side}_rows_per_core_s": per(rows, ingest),
        f"{side}_clickhouse_mb_per_core_s": per(mb, clickhouse),
        f"{side}_all_mb_per_core_s": per(mb, everything),
        f"{side}_ingest_cores_busy": per(ingest, window_s),
        f"{side}_clickhouse_cores_busy": per(clickhouse, window_s),
    }


def table(workload: str, found: Mapping[str, object]) -> Table:
    """The per-core figures of one repetition beside ClickPipes' published MB/s per vCPU."""
    published = PUBLISHED_MB_PER_VCPU[workload]
    title = (
        f"{workload}: per core (CPU second) of the ingesting processes; ClickPipes publishes "
        f"{published:g} MB/s per vCPU (mean value {found.get('value_bytes_mean') or 0:,.0f} bytes)"
    )
    out = Table(title=title)
    out.add_column("figure")
    for column in ("chtxn", "plain loop"):
        out.add_column(column, justify="right")
    for label, key, digits in (
        ("MB/s per ingesting core (chtxn: participant python + spark jvm)", "mb_per_core_s", 1),
        ("rows/s per ingesting core", "rows_per_core_s", 0),
        ("x ClickPipes' published MB/s per vCPU", None, 2),
        ("MB/s per ClickHouse core (its CPU apart)", "clickhouse_mb_per_core_s", 1),
        ("MB/s per core of every pipeline process", "all_mb_per_core_s", 1),
        ("cores busy: ingesting / ClickHouse", None, 2),
        ("MB/s (wall)", "mb_per_s", 1),
    ):
        cells = []
        for side in ("chtxn", "plain"):
            if key is None and label.startswith("x "):
                value = found.get(f"{side}_mb_per_core_s")
                cells.append(f"{value / published:.{digits}f}" if isinstance(value, float) else "-")
            elif key is None:
                a, b = found.get(f"{side}_ingest_cores_busy"), found.get(f"{side}_clickhouse_cores_busy")
                cells.append(f"{a or 0:.2f} / {b or 0:.2f}")
            else:
                value = found.get(f"{side}_{key}")
                cells.append(f"{value:,.{digits}f}" if isinstance(value, (int, float)) else "-")
        out.add_row(label, *cells)
    return out
