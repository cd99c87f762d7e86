"""Every failing ``chtxn`` command says why in one ``chtxn:`` line on stderr, with no traceback and
without librdkafka's own log lines; ``init`` creates nothing when a check fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from functools import partial
from importlib import metadata
from pathlib import Path

import pytest

from clients.clickhouse import make_client
from coordinator.ledger.store import LedgerStore
from protocol.config.parse import load_config
from tests.helpers import REPO, create_topic, run_chtxn, unique_name
from tests.integration.test_cli_init_txn import write_config

#: ``python -m cli`` of this checkout, without the session's ``CHTXN_*`` settings.
chtxn = partial(run_chtxn, timeout_s=120, inherit_chtxn_vars=False)


def closed_address() -> str:
    """``127.0.0.1:PORT`` where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def failure_line(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The one ``chtxn:`` error line of a failed command (the last line of stderr), checked."""
    assert result.returncode == code, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("chtxn: ") and not line.startswith("chtxn: warning:")]
    assert errors == [lines[-1]], result.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def target(ch_client, ch_database: str) -> str:  # clickhouse-connect client
    """A target table without the metadata columns, and the ledger table beside it."""
    ch_client.command(f"CREATE TABLE `{ch_database}`.events (id UInt64, body String) ENGINE = MergeTree ORDER BY id")
    return "events"


@pytest.fixture
def config(stack, ch_database: str, target: str, tmp_path: Path) -> Path:  # TestStack
    """A pipeline on the session's stack, with its ledger table in place."""
    path = write_config(tmp_path / "p.toml", stack, ch_database, topics='["src"]', target=target)
    cfg = load_config(str(path), {})
    LedgerStore(make_client(cfg.clickhouse), ch_database, cfg.name).ensure_tables()
    return path


def test_status_with_the_broker_down_is_one_line(stack, ch_database: str, config: Path) -> None:
    closed = closed_address()
    result = chtxn("status", "--config", str(config), env={"CHTXN_KAFKA_BOOTSTRAP_SERVERS": closed})
    line = failure_line(result)
    assert line.startswith(f"chtxn: cannot reach a Kafka broker at {closed} within "), line
    assert "CHTXN_KAFKA_BOOTSTRAP_SERVERS" in line
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_verify_deep_without_the_metadata_columns(config: Path, ch_database: str) -> None:
    line = failure_line(chtxn("verify", "--config", str(config), "--deep"))
    assert line.startswith(f"chtxn: verify --deep needs the columns _topic, _partition and _offset in {ch_database}.")
    assert "no _topic, _partition, _offset" in line


def test_an_unknown_log_level_is_a_usage_error(config: Path) -> None:
    result = chtxn("--log-level", "FOO", "status", "--config", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "chtxn: error: argument --log-level: invalid choice: 'FOO'" in result.stderr


def test_a_property_librdkafka_refuses(config: Path) -> None:
    with config.open("a") as fh:
        fh.write('[kafka.properties]\n"no.such.property" = "1"\n')
    for command in ("init", "status"):  # a config error: exit 2, as the participant job says it
        line = failure_line(chtxn(command, "--config", str(config)), code=2)
        assert line == (
            "chtxn: config error: the Kafka client refused its configuration: No such configuration property: "
            '"no.such.property"; check [kafka.properties]'
        )


def test_an_unreachable_spark_master(config: Path) -> None:
    master = f"spark://{closed_address()}"
    line = failure_line(chtxn("participant", "--config", str(config), "--master", master), code=5)
    assert line.startswith(f"chtxn: cannot reach the Spark master at {master} within "), line


def test_a_bad_env_value_names_the_variable(config: Path) -> None:
    result = chtxn("status", "--config", str(config), env={"CHTXN_TRANSACTION_INTERVAL_S": "soon"})
    line = failure_line(result, code=2)
    assert line.startswith("chtxn: config error: CHTXN_TRANSACTION_INTERVAL_S='soon': Expected `float`"), line


def test_a_misspelled_variable_is_a_warning(tmp_path: Path) -> None:
    result = chtxn("status", "--config", str(tmp_path / "none.toml"), env={"CHTXN_CLICKHOUSE_UR": "http://h:8123"})
    assert result.stderr.splitlines()[0] == (
        "chtxn: warning: CHTXN_CLICKHOUSE_UR is not a variable chtxn reads, ignored; did you mean CHTXN_CLICKHOUSE_URL?"
    )
    assert "none.toml" in failure_line(result, code=2)


BUGGY_STATUS = """
import sys
import cli, cli.status

def run(args):
    raise KeyError("boom")

cli.status.run = run
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("debug", [False, True])
def test_a_bug_is_one_line_and_its_traceback_needs_debug(config: Path, debug: bool) -> None:
    argv = [sys.executable, "-c", BUGGY_STATUS, *(["--debug"] if debug else []), "status", "--config", str(config)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "chtxn: internal error: KeyError: 'boom' (run with --debug for the traceback)"
    )
    assert ("Traceback" in result.stderr) is debug, result.stderr


def test_version() -> None:
    result = chtxn("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"chtxn {metadata.version('chtxn')}")


def in_directory(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``chtxn ARGS`` run in ``cwd``, without the session's ``CHTXN_*`` settings."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("CHTXN_")}
    argv = [sys.executable, "-m", "cli", *args]
    environ["PYTHONPATH"] = str(REPO)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**environ, **env}, timeout=60)


def test_the_config_defaults_to_chtxn_config_then_pipeline_toml(tmp_path: Path) -> None:
    bad = '[pipeline]\nname = "p"\ntopics = ["t"]\n[clickhouse]\ntarget_table = "x"\n[transaction]\ninterval_s = -1\n'
    line = failure_line(in_directory(tmp_path, "status", env={}), code=2)
    assert line == (
        f"chtxn: config error: no pipeline config: --config not given, CHTXN_CONFIG not set, and no "
        f"./pipeline.toml in {tmp_path}; pass --config FILE"
    )
    (tmp_path / "pipeline.toml").write_text(bad)
    line = failure_line(in_directory(tmp_path, "status", env={}), code=2)
    assert line.startswith("chtxn: config error: pipeline.toml: transaction.interval_s = -1.0: "), line
    (tmp_path / "elsewhere.toml").write_text(bad.replace("-1", "0"))
    line = failure_line(in_directory(tmp_path, "status", env={"CHTXN_CONFIG": "elsewhere.toml"}), code=2)
    assert line.startswith("chtxn: config error: elsewhere.toml: transaction.interval_s = 0.0: "), line


def topics_of(kafka_admin) -> set[str]:  # AdminClient
    return set(kafka_admin.list_topics(timeout=30).topics)


def test_a_failed_init_creates_no_topic(stack, kafka_admin, ch_database: str, target: str, tmp_path: Path) -> None:
    name = unique_name("noinit")
    path = write_config(tmp_path / "p.toml", stack, ch_database, name=name, topics=json.dumps([unique_name("nosuch")]))
    result = chtxn("init", "--config", str(path), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["problems"][-1] == "created nothing: fix the problems above, then run chtxn init again"
    assert not {f"{name}.chtxn-control", f"{name}.chtxn-dlq"} & topics_of(kafka_admin)


def test_init_refuses_a_wide_control_topic_before_creating(
    stack, kafka_admin, ch_database: str, target: str, tmp_path: Path
) -> None:
    name = unique_name("wide")
    source = create_topic(kafka_admin, unique_name("src"), 1)
    create_topic(kafka_admin, f"{name}.chtxn-control", 2)
    path = write_config(tmp_path / "p.toml", stack, ch_database, name=name, topics=json.dumps([source]))
    result = chtxn("init", "--config", str(path), "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    problems = json.loads(result.stdout)["problems"]
    assert any("has 2 partitions; chtxn needs exactly 1" in p for p in problems), problems
    assert f"{name}.chtxn-dlq" not in topics_of(kafka_admin)


@pytest.mark.parametrize("blocked", [False, True], ids=["sigpipe", "sigpipe-blocked"])
def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(blocked: bool) -> None:
    """``chtxn ... | head -1``: the command dies of SIGPIPE as cat does, or exits 141 when whoever
    started it blocks SIGPIPE (a CI runner may), with no internal error either way."""
    how = signal.SIG_BLOCK if blocked else signal.SIG_UNBLOCK  # the child would inherit this process's mask

    def block() -> None:
        signal.pthread_sigmask(how, [signal.SIGPIPE])

    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "completion", "bash"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=block,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line
    said = proc.stderr.read()
    assert proc.wait(60) == (128 + signal.SIGPIPE if blocked else -signal.SIGPIPE) and said == "", said
