"""The Spark driver's pure parts: grouping partitions into tasks, the spark-submit command line."""

from __future__ import annotations

import zipfile
from pathlib import Path

from cli.participant import py_files_zip, spark_submit_command
from participant.job import group_partitions
from protocol.config.parse import parse_config
from protocol.messages import TopicPartition


def tps(*pairs: tuple[str, int]) -> list[TopicPartition]:
    return [TopicPartition(topic=t, partition=p) for t, p in pairs]


def test_groups_fit_the_slots_and_are_balanced_and_deterministic():
    parts = tps(*[("b", p) for p in range(3)], *[("a", p) for p in range(4)])
    groups = group_partitions(parts, 3)
    assert groups == [
        (("a", 0), ("a", 3), ("b", 2)),
        (("a", 1), ("b", 0)),
        (("a", 2), ("b", 1)),
    ]
    assert group_partitions(list(reversed(parts)), 3) == groups
    assert sorted(tp for g in groups for tp in g) == sorted((tp.topic, tp.partition) for tp in parts)


def test_never_more_groups_than_partitions_nor_fewer_than_one():
    assert group_partitions(tps(("a", 0), ("a", 1)), 8) == [(("a", 0),), (("a", 1),)]
    assert group_partitions(tps(("a", 0), ("a", 1)), 0) == [(("a", 0), ("a", 1))]


def test_the_spark_submit_command(tmp_path: Path):
    config = tmp_path / "p.toml"
    config.write_text('[pipeline]\nname = "pl"\ntopics = ["t"]\n[clickhouse]\ntarget_table = "events"\n')
    cfg = parse_config(config.read_text())
    command = spark_submit_command(cfg, config_path=str(config), master="local[3,4]", extra_conf=["spark.x=1"])
    assert command[0].endswith("pyspark/bin/spark-submit") and Path(command[0]).is_file()
    assert command[command.index("--master") + 1] == "local[3,4]"
    assert "spark.speculation=false" in command and "spark.x=1" in command
    assert command[-5].endswith("participant/job.py")
    assert command[-4:] == ["--config", str(config.resolve()), "--log-level", "WARNING"]
    with zipfile.ZipFile(command[command.index("--py-files") + 1]) as archive:
        names = set(archive.namelist())
    assert {"protocol/participant/state.py", "participant/runner.py", "clients/kafka.py"} <= names
    assert py_files_zip() == py_files_zip(), "the same sources give the same zip"
