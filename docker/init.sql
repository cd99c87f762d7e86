CREATE TABLE IF NOT EXISTS default.events
(
    id UInt64,
    payload String,
    _topic LowCardinality(String),
    _partition Int32,
    _offset Int64
)
ENGINE = MergeTree
ORDER BY (_topic, _partition, _offset);
