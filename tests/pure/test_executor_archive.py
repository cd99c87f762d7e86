"""The executors' packed environment and the spark-submit command for cluster masters.

Builds real archives in a temporary cache dir (about a second each) and runs the unpacked
environment's Python once; starts no Spark and no service.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import cli
from cli.packaging import (
    EXECUTOR_PYTHON,
    SHIPPED_PACKAGES,
    EnvironmentSpec,
    archive_path,
    distribution_closure,
    ensure_archive,
    executor_spec,
)
from cli.participant import is_local, spark_submit_command
from participant.job import too_few_slots
from protocol.config.parse import parse_config
from protocol.errors import SetupError
from tests.pure.test_layering import imported_packages, modules_of

CONFIG = '[pipeline]\nname = "pl"\ntopics = ["t"]\n[clickhouse]\ntarget_table = "events"\n'


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, fresh = ensure_archive(tmp_path_factory.mktemp("cache"))
    assert fresh
    return path


def test_every_module_the_executors_import_is_shipped() -> None:
    imported = set().union(
        *(imported_packages(p.read_text(), str(p)) for pkg in SHIPPED_PACKAGES for p in modules_of(pkg))
    )
    third_party = imported - set(sys.stdlib_module_names) - set(SHIPPED_PACKAGES) - {"pyspark"}  # Spark brings pyspark
    shipped = {d.metadata["Name"] for d in distribution_closure()}
    providers = importlib.metadata.packages_distributions()
    missing = {name for name in third_party if not set(providers.get(name, ())) & shipped}
    assert not missing, f"imported on executors but not in the archive: {missing}"


def test_the_archive_holds_the_project_and_its_runtime_dependencies_only(built: Path) -> None:
    with tarfile.open(built) as archive:
        names = set(archive.getnames())
        python = archive.getmember(f"bin/python{sys.version_info.major}.{sys.version_info.minor}")
    site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    assert {
        f"{site}/participant/job.py",
        f"{site}/protocol/participant/state.py",
        f"{site}/clients/kafka.py",
        f"{site}/confluent_kafka/__init__.py",
        f"{site}/clickhouse_connect/__init__.py",
    } <= names
    tops = {n.split("/")[3] for n in names if n.startswith(site + "/") and n.count("/") > 3}  # site-packages/<top>/...
    assert not {"pyspark", "chdb", "pytest", "pandas", "pyarrow", "rich", "coordinator", "cli", "embedded"} & tops
    assert not [n for n in names if "__pycache__" in n]
    assert python.issym() and Path(python.linkname).is_absolute()


def test_the_unpacked_archive_imports_the_participant_in_a_clean_environment(built: Path, tmp_path: Path) -> None:
    with tarfile.open(built) as archive:
        archive.extractall(tmp_path / "environment", filter="tar")
    code = "import sys, participant.job, clients.kafka, clients.clickhouse; print(sys.prefix)"
    out = subprocess.run(
        [str(tmp_path / "environment/bin/python"), "-c", code],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == tmp_path / "environment"


def test_archives_are_cached_by_content(built: Path, tmp_path: Path) -> None:
    assert ensure_archive(built.parent) == (built, False)
    spec = executor_spec()
    assert archive_path(spec, built.parent) == built
    changed = tmp_path / "x.py"
    changed.write_text("x = 1\n")
    assert (
        EnvironmentSpec(
            distributions=spec.distributions, sources=(*spec.sources, ("participant/x.py", changed)), python=spec.python
        ).digest()
        != spec.digest()
    )
    assert executor_spec("/usr/bin/python3.11").digest() != spec.digest()
    name, version, record = spec.distributions[0]
    for changed_dist in ((name, "0.0.1", record), (name, version, "another-record")):
        assert (
            EnvironmentSpec(
                distributions=(changed_dist, *spec.distributions[1:]), sources=spec.sources, python=spec.python
            ).digest()
            != spec.digest()
        )


def test_another_executor_python(tmp_path: Path) -> None:
    path, _ = ensure_archive(tmp_path, python="/opt/python/bin/python3.11")
    with tarfile.open(path) as archive:
        link = archive.getmember(f"bin/python{sys.version_info.major}.{sys.version_info.minor}").linkname
        cfg = archive.extractfile("pyvenv.cfg").read().decode()
    assert link == "/opt/python/bin/python3.11"
    assert "home = /opt/python/bin\n" in cfg and "executable = /opt/python/bin/python3.11\n" in cfg


def test_a_cluster_master_gets_the_archive_and_a_local_one_this_python(tmp_path: Path) -> None:
    config = tmp_path / "p.toml"
    config.write_text(CONFIG)
    cfg = parse_config(CONFIG)
    archive = tmp_path / "env.tar.gz"
    command = spark_submit_command(
        cfg, config_path=str(config), master="spark://h:7077", archive=archive, startup_timeout_s=30
    )
    assert command[command.index("--archives") + 1] == f"{archive}#environment"
    assert f"spark.pyspark.python={EXECUTOR_PYTHON}" in command and EXECUTOR_PYTHON == "./environment/bin/python"
    assert f"spark.pyspark.driver.python={sys.executable}" in command
    assert "--py-files" not in command and command[-2:] == ["--startup-timeout", "30"]
    in_cluster = spark_submit_command(
        cfg, config_path=str(config), master="yarn", archive=archive, extra_conf=["spark.submit.deployMode=cluster"]
    )
    assert not [c for c in in_cluster if c.startswith("spark.pyspark.driver.python=")]
    with pytest.raises(SetupError, match="packed environment"):
        spark_submit_command(cfg, config_path=str(config), master="k8s://https://h:6443")
    local = spark_submit_command(cfg, config_path=str(config), master="local[2,4]")
    assert "--archives" not in local and f"spark.pyspark.python={sys.executable}" in local
    assert [is_local(m) for m in ("local", "local[4]", "local[2,4]", "local-cluster[2,1,1024]", "spark://h:7077")] == [
        True,
        True,
        True,
        False,
        False,
    ]


def test_dry_run_json_builds_the_archive_and_prints_the_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "p.toml"
    config.write_text(CONFIG)
    argv = [
        "participant",
        "--config",
        str(config),
        "--master",
        "spark://h:7077",
        "--cache-dir",
        str(tmp_path / "c"),
        "--json",
    ]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert cli.main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["archive_built"] and not second["archive_built"] and first["archive"] == second["archive"]
    assert Path(first["archive"]).is_file() and first["executor_python"] == EXECUTOR_PYTHON
    assert f"{first['archive']}#environment" in first["command"] and first["master"] == "spark://h:7077"


@pytest.mark.parametrize(
    ("master", "says"),
    [
        ("local[2,4]", "--master local[6,4]"),
        ("spark://h:7077", "--conf spark.cores.max=6"),
        ("yarn", "spark.executor.instances=E"),
        ("k8s://https://h:6443", "spark.dynamicAllocation.enabled=false"),
    ],
)
def test_too_few_slots_says_what_to_do_for_each_master(master: str, says: str) -> None:
    message = too_few_slots(master, 6, 4, 120)
    assert message.startswith(
        "the participant job needs 6 task slots running at once but only 4 started within 120 s: "
    )
    assert says in message and "participant.task_slots to 4 or fewer" in message
