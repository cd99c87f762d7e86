"""The sections of ``pipeline.toml``: one frozen Struct per section, each field with its type,
default and description.

The descriptions are ``msgspec.Meta(description=...)`` on the fields, so the code that decodes a
field and the text that documents it stand together: ``tools/docgen.py`` reads them
(``typing.get_type_hints(..., include_extras=True)``) to write ``docs/configuration.md``. A
``Meta(extra={"brief": ...})`` is the short remark printed beside the field in that page's complete
example (and appended to its description). ``Annotated`` changes nothing in decoding, encoding or
defaults. ``protocol.config.parse`` loads and validates the file and re-exports these Structs.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from protocol import secrets

# fmt: off
# One line of type and default per field, its description under it: the formatter would spread
# each described field over eight lines.


class PipelineSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(description="Required. Letters, digits and `_`, not starting with a digit.")] = ""
    topics: Annotated[tuple[str, ...], Meta(
        description="Required. The source topics; every partition of each is ingested. An entry "
        "re:<regex> stands for every topic whose whole name the expression matches, including topics created "
        "while the pipeline runs (internal topics, names starting with __, never match).")] = ()
    control_topic: Annotated[str, Meta(
        description="The control topic: exactly one partition (`chtxn init` creates it so).",
        extra={"brief": 'default "<name>.chtxn-control"'})] = ""
    dead_letter_topic: Annotated[str, Meta(
        description="Where records ClickHouse refuses are published, once their txn commits.",
        extra={"brief": 'default "<name>.chtxn-dlq"'})] = ""
    start_from: Annotated[Literal["earliest", "latest"], Meta(description=(
        "Where a never-committed partition starts, decided per topic the first time the pipeline sees it: a topic "
        "seen at the pipeline's first start (its first leader's take-over, even one that saw no topic) starts here; "
        "every topic or partition first seen later (created, matched by a `re:` pattern or added to `topics` since) "
        "starts from `earliest`, as all its records came after the pipeline started. Each choice is recorded once "
        "in the ledger (INITIAL rows)."))] = "earliest"
    on_gap: Annotated[Literal["fail", "skip"], Meta(description=(
        "When offsets a partition still needs are gone (retention): `fail` stops the coordinator naming the gap, "
        "`skip` goes on from the earliest offset left. Either way the gap is recorded as a GAP row and `chtxn verify` "
        "reports it."))] = "fail"


class RouteSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One ``[[route]]``: the topics whose records go to ``table``."""

    topics: Annotated[tuple[str, ...], Meta(description=(
        "Required. Topic names, or re:<regex> for every topic whose whole name matches, as in `pipeline.topics`. A "
        "topic matched by no route, or by two, is an error naming it."))] = ()
    table: Annotated[str, Meta(description="Required. The target table of these topics, in `clickhouse.database`.")] = ""
    publish_mode: Annotated[Literal["", "move", "insert-select"], Meta(description=(
        "How this table's rows are published, as `transaction.publish_mode` (empty: that setting): a table with "
        "materialized views takes `insert-select` while the others keep `move`. Routes of one table must agree."
    ))] = ""


class KafkaSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    bootstrap_servers: Annotated[str, Meta(description="Comma-separated `host:port` list.")] = "localhost:9092"
    properties: Annotated[dict[str, str], Meta(
        description="librdkafka properties for every client, passed through untouched.")] = {}
    control_fetch_wait_ms: Annotated[int, Meta(description=(
        "Each protocol hop (START, END, WRITE-STATUS, ACK) is a control-topic message, so this bounds how late one is "
        "seen when the broker holds a fetch for its whole wait (the embedded broker does; Kafka answers as soon as a "
        "message arrives, so there it only spaces out idle fetches: raise it to cut idle requests from many "
        "participant tasks). `[kafka.properties]` does not override it for the control topic."),
        extra={"brief": "fetch.wait.max.ms of every control-topic consumer"})] = 25

    def __repr__(self) -> str:  # sasl.password, ssl.key.password, ...secret never reach a log
        shown = secrets.masked("properties", self.properties)
        return f"KafkaSection(bootstrap_servers={self.bootstrap_servers!r}, properties={shown!r})"


class ClickHouseSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    url: Annotated[str, Meta(description=(
        "`http://` or `https://` URL of the HTTP interface (port 8123 or 8443 when not given). Credentials in it "
        "(`https://user:password@host:8443`, percent-encoded) are used as `user` and `password`; a URL whose user or "
        "password differs from one also set on its own is refused."))] = "http://localhost:8123"
    database: Annotated[str, Meta(description="Database of the target, the ledger and the stage tables.")] = "default"
    user: Annotated[str, Meta(description="ClickHouse user.")] = "default"
    password: Annotated[str, Meta(
        description="Never logged and never shown in `repr`. Prefer `CHTXN_CLICKHOUSE_PASSWORD`.")] = ""
    target_table: Annotated[str, Meta(description=(
        "Required. A MergeTree-family table in `database`, or a `Distributed` table over one: chtxn then loads its "
        "local table on every shard of its cluster, learnt from `system.clusters` at start unless `shards` lists them "
        "(see [clusters](clusters.md#a-distributed-target)). Optional columns `_topic`, `_partition`, `_offset` are "
        "filled by ClickHouse from each record's coordinates and enable the row-level checks."))] = ""
    input_format: Annotated[str, Meta(description=(
        "ClickHouse input format of the record values, which go to ClickHouse untouched, one record per row. With "
        "metadata columns: JSONEachRow (and its aliases), CSV, TSV, the JSONCompact kinds, RowBinary, AvroConfluent "
        "(set `format_avro_schema_registry_url` in `insert_settings`) or Protobuf (records unframed, one message "
        "each; set `format_schema`)."))] = "JSONEachRow"
    insert_settings: Annotated[dict[str, str | int | float | bool], Meta(description=(
        "Extra ClickHouse settings for every request. Settings that would skip, invent or merge rows, or turn off "
        "synchronous deduplicated inserts, are refused (`input_format_allow_errors_*`, header detection and skipped "
        "first lines of CSV/TSV, `async_insert = 1`, `insert_deduplicate = 0`, `insert_deduplication_token`)."))] = {}
    cluster: Annotated[str, Meta(description=(
        "A replicated ClickHouse: the cluster (`system.clusters`) whose replicas hold the target. chtxn's own tables "
        "(the ledger, the dead letters) are then `ReplicatedMergeTree`, created `ON CLUSTER`, their inserts wait for "
        "a quorum and their reads see every quorum insert. A cluster of several shards, with `shards` empty, is "
        "loaded on every shard (learnt from `system.clusters` at start). See [clusters](clusters.md)."),
        extra={"brief": '"": a single server, or ClickHouse Cloud'})] = ""
    shards: Annotated[list[str], Meta(description=(
        "A sharded ClickHouse: the `http://` or `https://` URL of one server of every shard, in shard order, each "
        "holding the local `target_table`. Each source partition's rows go to one shard (by topic and partition), a "
        "txn stages on every shard and commits once, in the ledger at `url`. Users and passwords are `user` and "
        "`password`, never in these URLs. See [clusters](clusters.md#a-sharded-cluster)."),
        extra={"brief": "[]: every row to the server at `url`, or a Distributed target's cluster's shards"})] = []
    placement: Annotated[Literal["partition", "sharding-key"], Meta(description=(
        "With `shards`, which shard a row is staged on. `partition`: all of a source partition's rows on one shard "
        "(by topic and partition; no record parsed). `sharding-key`: each row where a Distributed table with "
        "`sharding_key` and `shard_weights` would put it, evaluated by ClickHouse. "
        "See [clusters](clusters.md#a-sharded-cluster)."))] = "partition"
    sharding_key: Annotated[str, Meta(description=(
        "With `placement = \"sharding-key\"`: the Distributed table's sharding key, a ClickHouse expression of "
        "an integer over the target's columns, e.g. `cityHash64(customer_id)`; when empty, a Distributed target's own. "
        "Functions whose value changes between tries (`rand()`, `now()`) are refused."))] = ""
    shard_weights: Annotated[list[int], Meta(description=(
        "With `placement = \"sharding-key\"`: each shard's weight, in shard order, as the cluster's "
        "`<weight>`s; when empty, those of a Distributed target's cluster (when `shards` is empty too), else all 1."))] = []
    connect_timeout_s: Annotated[float, Meta(description="Seconds to connect to ClickHouse.")] = 10.0
    send_receive_timeout_s: Annotated[float, Meta(description="Seconds a ClickHouse request may take.")] = 300.0

    def __repr__(self) -> str:  # the password never reaches a log
        fields = ", ".join(
            f"{name}={'***' if name == 'password' and self.password else repr(getattr(self, name))}"
            for name in self.__struct_fields__
        )
        return f"ClickHouseSection({fields})"


class LedgerSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    commit_point: Annotated[Literal["token", "keeper"], Meta(description=(
        "How a leader claims a commit slot. `token`: an insert into the ledger whose deduplication token names the "
        "slot, so ClickHouse keeps one row per slot while it remembers the token (a single server). `keeper`: a "
        "strict-mode insert into a KeeperMap table, which fails when the slot's key exists: no deduplication "
        "window, so a leader stalled for any time still cannot claim a slot twice (replicated ClickHouse and "
        "ClickHouse Cloud; the server needs Keeper or ZooKeeper). See [clusters](clusters.md)."),
        extra={"brief": '"token" or "keeper"'})] = "token"
    keeper_path: Annotated[str, Meta(description=(
        "The Keeper path of the KeeperMap table of commit and epoch claims with `commit_point = \"keeper\"`, "
        "under the server's `keeper_map_path_prefix`; every pipeline of the database shares it (keys start with "
        "the pipeline name)."),
        extra={"brief": 'default "/chtxn/<clickhouse.database>"'})] = ""


class TransactionSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    interval_s: Annotated[float, Meta(description=(
        "END-COMMIT goes out this long after START-COMMIT... A shorter interval buys freshness with ClickHouse CPU: "
        "every txn costs a fixed amount of work (its stage table, three ledger rows, the commit point, a move per "
        "ClickHouse partition), and each partition's chunks are a quarter of what it reads in one. While chtxn keeps "
        "up, a row is visible in the target about one interval after it was produced at the median, and about two "
        "at p99 (measured: see [benchmarks/README.md](../benchmarks/README.md#a-2-s-interval))."))] = 2.0
    idle_interval_s: Annotated[float, Meta(description=(
        "...but a txn with nothing to read (no row read in it, and no partition's log end past its committed "
        "offset, as the participants' heartbeats tell) stays open past `interval_s` until its first record "
        "arrives, and then ends at once, or until this long after its START. An idle pipeline thus commits "
        "once per `idle_interval_s` instead of once per `interval_s`, each empty txn being three ledger rows, "
        "a stage table and about 100 ms of ClickHouse CPU; a record arriving in the open txn waits about one "
        "heartbeat, not an interval. At or below `interval_s` (0 included), every txn ends at `interval_s`, idle "
        "or not."),
        extra={"brief": "0: end idle txns at interval_s too"})] = 30.0
    size_trigger_rows: Annotated[int, Meta(
        description="...or once the participants report this many rows read for the txn.")] = 1_000_000
    write_status_timeout_s: Annotated[float, Meta(
        description="A txn whose WRITE-STATUS set is not complete this long after END aborts.")] = 30.0
    heartbeat_interval_s: Annotated[float, Meta(description="How often participants heartbeat.")] = 0.5
    heartbeat_misses: Annotated[int, Meta(
        description="A txn's participant silent for this many intervals is dead: the txn aborts at once.")] = 6
    publish_mode: Annotated[Literal["move", "insert-select"], Meta(description=(
        "`move`: `ALTER TABLE ... MOVE PARTITION` from the stage table (zero-copy; refused when the target has "
        "materialized views, which do not fire on a move). `insert-select`: a deduplicated `INSERT ... SELECT` (fires "
        "views; the target must deduplicate)."))] = "move"


class ParticipantSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    chunk_rows: Annotated[int, Meta(description=(
        "A chunk is cut after this many records at most... Each START lowers it for its txn to about a quarter of "
        "what the busiest partition reads in one (never below 1,000), so that END leaves little to insert at any "
        "rate; this is the upper bound, for partitions catching up. With `clickhouse.placement = \"sharding-key\"` "
        "this bound and the START's are multiplied by the number of shards: each chunk is split over every shard, "
        "and each shard's part of it keeps about this size."))] = 20_000
    chunk_bytes: Annotated[int, Meta(
        description="...or before the record that would take it past this many bytes of values.")] = 8 * 1024 * 1024
    poll_batch: Annotated[int, Meta(description="Most records taken from Kafka in one poll.")] = 5_000
    insert_backlog_rows: Annotated[int, Meta(description=(
        "Rows cut into chunks but not yet staged, at most, per task; reading waits above it. It bounds what is left "
        "to insert at END. By default one chunk per partition the task is reading, at the size of the txn's chunks "
        "(the START's `chunk_rows` when it is below `chunk_rows`), so the bound follows the chunks when the "
        "coordinator makes them small at a low rate."),
        extra={"brief": "0: one chunk per partition being read, at the txn's chunk size"})] = 0
    insert_retries: Annotated[int, Meta(
        description="Tries of one chunk insert on retryable ClickHouse errors (same token each time).")] = 8
    task_slots: Annotated[int, Meta(
        description="How many Spark tasks the partitions are grouped into (every task runs at once).",
        extra={"brief": "0: ask Spark (defaultParallelism)"})] = 0
    outage_timeout_s: Annotated[float, Meta(gt=0, description=(
        "How long the participant job rides out ClickHouse or the Kafka broker being unreachable (retrying with "
        "back-off, one log line per attempt) before it fails naming the cause, with exit code 4. Counted at start-up "
        "and while the job runs (its driver checks both every 10 s)."),
        extra={"brief": "then the job exits 4, so a supervisor restarts it or pages"})] = 180.0


class SchemaSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    evolve: Annotated[Literal["off", "add-columns"], Meta(description=(
        "`add-columns`: before a chunk is inserted, each top-level field of its records that the stage table lacks "
        "becomes a column of the target, then of the stage table (`ALTER TABLE ... ADD COLUMN IF NOT EXISTS`, `ON "
        "CLUSTER` with `clickhouse.cluster`), its type inferred from the chunk's values, so no row loses the field. "
        "JSON object input formats only (JSONEachRow and its aliases). The rules: "
        "[architecture](architecture.md#schema-evolution)."),
        extra={"brief": '"off" or "add-columns"'})] = "off"
    unknown_fields: Annotated[Literal["ignore", "dead-letter"], Meta(description=(
        "With `evolve = \"off\"`, what becomes of a record carrying a top-level field the target has no column "
        "for: `ignore` stores the row without it (ClickHouse's `input_format_skip_unknown_fields`, on by default), "
        "`dead-letter` sends the record to the dead-letter topic naming the field. A field whose value is null "
        "counts as absent. `dead-letter` needs a JSON object input format."),
        extra={"brief": '"ignore" or "dead-letter"'})] = "ignore"


class CoordinatorSection(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Annotated[str, Meta(
        description="This replica's id in the ledger, logs and control messages.",
        extra={"brief": 'default "<hostname>-<pid>"'})] = ""
    leader_lease_s: Annotated[float, Meta(
        description="The leader heartbeats every third of this, from a thread of its own.",
        extra={"brief": "a standby claims leadership after this much leader silence"})] = 2.0
    metrics_port: Annotated[int, Meta(
        description="Port of the Prometheus endpoint (`--metrics-port` overrides it).",
        extra={"brief": "0: no Prometheus endpoint"})] = 0
    metrics_address: Annotated[str, Meta(description=(
        "Address the metrics port (`/metrics`, `/ready`) binds (`--metrics-address` overrides it). The endpoint has "
        "no authentication, so by default only this host reaches it."),
        extra={"brief": '"0.0.0.0" or "::" for a Prometheus on another host or container'})] = "127.0.0.1"
    clickhouse_retries: Annotated[int, Meta(
        description="Tries of one coordinator ClickHouse operation on retryable errors.")] = 8
    clickhouse_nice: Annotated[int, Meta(description=(
        "The nice value (ClickHouse's `os_thread_priority`) of the coordinator's queries, so that the commit path's "
        "small reads and inserts run ahead of the participants' bulk inserts on a busy server. A server applies it "
        "only when it has `CAP_SYS_NICE`; otherwise nothing changes. Copies made by `insert-select` publishing run "
        "at 0."),
        extra={"brief": "-20 runs first, 19 last; 0 sends no setting"})] = -10
    ledger_checkpoint_every: Annotated[int, Meta(description=(
        "The leader winning every this-many-th commit slot, and every new leader, writes a ledger checkpoint: the "
        "head of the settled part of the commit chain. Take-over, `chtxn status` and `chtxn txn list` read from the "
        "latest one, so their cost does not grow with the ledger."),
        extra={"brief": "commit slots between ledger checkpoints (reads start from the latest)"})] = 1000
    ledger_retention_days: Annotated[float, Meta(description=(
        "Ledger history older than this is deleted by the leader, but only below the newest checkpoint older than "
        "this: the head, the commits after it, and every EPOCH, INITIAL, GAP and LOST row stay, so a pipeline stopped "
        "for longer restarts exactly where it stopped."),
        extra={"brief": "ledger history older than this expires; the head never does"})] = 30.0


# fmt: on
