"""The participant job stops cleanly (issue 26, item 1), started as an operator starts it
(``chtxn participant``) on the embedded stack with real Spark.

Each failure ends the job within a bound, with its exit code (``participant.job_errors.ExitCode``),
one line ``chtxn: <message>`` (the last of stderr), no traceback, and a bounded number of log lines,
every one of chtxn's a JSON object on stderr; nothing on stdout, whoever found the error (the
launcher, or the job's driver under spark-submit):

- setup errors (a control topic of 3 partitions, a missing topic or table, a bad config) in seconds,
  from the launcher's checks, and from the driver's when spark-submit runs the job by hand;
- a setup error only a task finds (the target table dropped under a running job, then a task
  restarted) crosses Spark as chtxn's line;
- ClickHouse or the broker unreachable at start: one line per attempt, then exit 4 after
  ``participant.outage_timeout_s``; ClickHouse cut under a running job: the same, from the driver;
- a Spark master that refuses connections, accepts them and never answers, or is another server
  (an HTTP server, as ClickHouse's port 8123): exit 5.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients.kafka import create_topics
from procs import free_port
from protocol.messages import Heartbeat
from tests.e2e.processes import REPO, Processes, descendants
from tests.faults.tcp_proxy import TcpProxy
from tests.helpers import unique_name, wait_until
from tests.pipelines import Pipeline, control_messages, make_pipeline

pytestmark = pytest.mark.e2e

OUTAGE_S = 6.0
#: A setup error found before Spark starts (no JVM): the launcher's own checks.
LAUNCHER_BOUND_S = 30.0
#: A JVM start on a busy 2-core machine, then the driver's checks.
SPARK_START_S = 60.0


@dataclass
class Ended:
    code: int
    seconds: float
    stderr: str
    stdout: str

    @property
    def lines(self) -> list[str]:
        """The lines of stderr."""
        return self.stderr.splitlines()


def participant_job(pipeline: Pipeline, *args: str, env: dict[str, str] | None = None, timeout_s: float) -> Ended:
    """``chtxn participant --config <pipeline>`` until it exits (its stderr and its stdout apart)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cli", "participant", "--config", str(pipeline.config_path), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,  # the bound is asserted below, with the output
    )
    return Ended(done.returncode, time.monotonic() - started, done.stderr, done.stdout)


def assert_ended(ended: Ended, *, code: int, says: str, within_s: float, max_lines: int) -> str:
    """The job ended as an operator should see it; returns its ``chtxn:`` line, the last of stderr."""
    shown = (
        f"exit {ended.code} after {ended.seconds:.0f} s, {len(ended.lines)} lines on stderr:\n{ended.stderr}\n"
        f"stdout:\n{ended.stdout}"
    )
    assert ended.code == code, shown
    assert ended.seconds < within_s, shown
    messages = [line for line in ended.lines if line.startswith("chtxn: ")]
    assert len(messages) == 1 and ended.lines[-1] == messages[0], shown
    assert says in messages[0], shown
    assert ended.stdout == "", f"chtxn participant prints nothing on stdout: {shown}"
    assert "Traceback" not in ended.stderr and "\tat " not in ended.stderr and "py4j" not in ended.stderr, shown
    assert len(ended.lines) <= max_lines, shown
    for line in ended.lines:
        if "chtxn." in line and not line.startswith("chtxn"):  # a chtxn logger's line: JSON
            assert json.loads(line)["logger"].startswith("chtxn."), line
    return messages[0]


def task_workers(job: subprocess.Popen) -> list[int]:
    """The PySpark Python workers of this job only (forked by its ``pyspark.daemon``), never another's."""
    mine = [p for p in descendants(job.pid) if "pyspark.daemon" in p.args]
    daemons = {p.pid for p in mine}
    return sorted(p.pid for p in mine if p.ppid in daemons)


def heartbeating(pipeline: Pipeline) -> int:
    """How many participant tasks have heartbeated: they are past their start-up checks."""
    return len({m.sender for m in control_messages(pipeline) if isinstance(m, Heartbeat)})


def json_lines(ended: Ended, logger: str) -> list[dict]:
    found = []
    for line in ended.lines:
        if line.startswith("{"):
            entry = json.loads(line)
            if entry["logger"] == logger:
                found.append(entry)
    return found


@pytest.fixture(scope="module")
def archive_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("executor-archives")


@pytest.fixture
def silent_master() -> Iterator[str]:
    """A ``spark://`` address that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"spark://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def http_master() -> Iterator[str]:
    """A ``spark://`` address of another server: each connection is answered at once with an HTTP
    400, as a ClickHouse HTTP port (8123) answers what is not HTTP, and closed."""
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at teardown
                return
            with conn:
                try:
                    conn.settimeout(5)
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    pass

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"spark://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        thread.join(10)


# ---- setup errors --------------------------------------------------------------------------


def control_topic_of_three_partitions(stack, tmp_path: Path, name: str) -> Pipeline:
    from confluent_kafka.admin import AdminClient

    control = f"{name}.ctl3"
    create_topics(AdminClient({"bootstrap.servers": stack.kafka_bootstrap}), {control: 3})
    return make_pipeline(stack, tmp_path, name, settings={"pipeline.control_topic": control})


def missing_topic(stack, tmp_path: Path, name: str) -> Pipeline:
    pipeline = make_pipeline(stack, tmp_path, name)
    text = pipeline.config_path.read_text().replace(f'["{name}_events"]', f'["{name}_nowhere"]')
    pipeline.config_path.write_text(text)
    return pipeline


def missing_table(stack, tmp_path: Path, name: str) -> Pipeline:
    return make_pipeline(stack, tmp_path, name, settings={"clickhouse.target_table": "nowhere"})


def misspelt_setting(stack, tmp_path: Path, name: str) -> Pipeline:
    pipeline = make_pipeline(stack, tmp_path, name)
    pipeline.config_path.write_text(
        pipeline.config_path.read_text().replace("[participant]\n", "[participant]\nchunk_rowz = 5\n")
    )
    return pipeline


@pytest.mark.parametrize(
    ("make", "code", "says"),
    [
        (control_topic_of_three_partitions, 3, "has 3 partitions; chtxn needs exactly 1"),
        (missing_topic, 3, "_nowhere' does not exist"),
        (missing_table, 3, "target table"),
        (misspelt_setting, 2, "config error:"),
    ],
    ids=["control-topic-of-3-partitions", "missing-source-topic", "missing-target-table", "unknown-setting"],
)
def test_a_setup_error_ends_the_job_in_seconds_with_one_line(stack, tmp_path, make, code, says):
    pipeline = make(stack, tmp_path, unique_name("pjsetup"))
    ended = participant_job(pipeline, timeout_s=LAUNCHER_BOUND_S)
    line = assert_ended(ended, code=code, says=says, within_s=LAUNCHER_BOUND_S, max_lines=1)
    if make is missing_table:
        assert f"{pipeline.cfg.clickhouse.database}.nowhere does not exist" in line


def test_the_driver_checks_the_same_when_spark_submit_runs_the_job_by_hand(stack, tmp_path):
    pipeline = control_topic_of_three_partitions(stack, tmp_path, unique_name("pjdriver"))
    dry = subprocess.run(
        [sys.executable, "-m", "cli", "participant", "--config", str(pipeline.config_path), "--dry-run", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    command = json.loads(dry.stdout)["command"]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    ended = Ended(done.returncode, time.monotonic() - started, done.stderr, done.stdout)
    # The JVM's own start-up warnings (a hostname on loopback, incubator modules) are all it adds.
    assert_ended(ended, code=3, says="has 3 partitions", within_s=SPARK_START_S, max_lines=6)
    assert " INFO " not in ended.stderr, ended.stderr


def test_a_setup_error_a_task_finds_crosses_spark_as_one_line(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjtask"), partitions=2)
    procs = Processes(pipeline, tmp_path)
    try:
        job = procs.participants(2, stdout_apart=True)
        workers = wait_until(
            lambda: procs.alive() or (len(found := task_workers(job)) >= 2 and found), SPARK_START_S * 2, "both tasks"
        )
        db = pipeline.cfg.clickhouse.database
        pipeline.client().command(f"DROP TABLE `{db}`.`events`")  # the running tasks do not look again...
        os.kill(workers[0], signal.SIGKILL)  # ...until Spark restarts one
        killed = time.monotonic()
        code = job.wait(180)
        seconds = time.monotonic() - killed
    finally:
        procs.stop_all()
    ended = Ended(code, seconds, (tmp_path / "participant.log").read_text(), procs.stdout("participant"))
    line = assert_ended(ended, code=3, says=f"target table {db}.events does not exist", within_s=120, max_lines=20)
    assert line.startswith("chtxn: target table"), "the task's line, not Spark's wording around it"
    assert " INFO " not in ended.stderr, ended.stderr


# ---- outages -------------------------------------------------------------------------------


def test_clickhouse_unreachable_is_retried_one_line_per_attempt_then_exit_4(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjnoch"))
    address = f"http://127.0.0.1:{free_port()}"
    env = {"CHTXN_CLICKHOUSE_URL": address, "CHTXN_PARTICIPANT_OUTAGE_TIMEOUT_S": str(OUTAGE_S)}
    ended = participant_job(pipeline, env=env, timeout_s=OUTAGE_S + 30)
    line = assert_ended(
        ended, code=4, says=f"cannot connect to ClickHouse at {address}", within_s=OUTAGE_S + 30, max_lines=8
    )
    assert f"gave up after {OUTAGE_S:.0f} s" in line and "participant.outage_timeout_s = 6" in line
    attempts = json_lines(ended, "chtxn.participant.outage")
    assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1)) and len(attempts) >= 3, ended.stderr
    assert len(ended.lines) == len(attempts) + 1, "one line per attempt, then the cause"


def test_the_broker_unreachable_is_retried_then_exit_4(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjnokafka"))
    address = f"127.0.0.1:{free_port()}"
    # Each attempt waits 10 s for metadata: a timeout of 25 s gives it three.
    env = {"CHTXN_KAFKA_BOOTSTRAP_SERVERS": address, "CHTXN_PARTICIPANT_OUTAGE_TIMEOUT_S": "25"}
    ended = participant_job(pipeline, env=env, timeout_s=70)
    line = assert_ended(ended, code=4, says=f"cannot reach a Kafka broker at {address}", within_s=70, max_lines=12)
    assert "participant.outage_timeout_s = 25" in line
    attempts = json_lines(ended, "chtxn.participant.outage")
    assert [a["attempt"] for a in attempts] == [1, 2], ended.stderr
    assert len(ended.lines) == len(attempts) + 1, "one line per attempt, then the cause: no librdkafka repeats"


def test_clickhouse_cut_under_a_running_job_ends_it_with_exit_4(stack, tmp_path):
    with TcpProxy(stack.clickhouse_host, stack.clickhouse_port) as proxy:
        pipeline = make_pipeline(stack, tmp_path, unique_name("pjcut"), partitions=2)
        pipeline.config_path.write_text(pipeline.config_path.read_text().replace(stack.clickhouse_url, proxy.url))
        procs = Processes(pipeline, tmp_path)
        try:
            job = procs.participants(2, env={"CHTXN_PARTICIPANT_OUTAGE_TIMEOUT_S": str(OUTAGE_S)}, stdout_apart=True)
            wait_until(lambda: procs.alive() or heartbeating(pipeline) >= 2, SPARK_START_S * 2, "both tasks started")
            proxy.cut()
            cut = time.monotonic()
            code = job.wait(120)
            seconds = time.monotonic() - cut
        finally:
            procs.stop_all()
    ended = Ended(code, seconds, (tmp_path / "participant.log").read_text(), procs.stdout("participant"))
    # The driver checks every 10 s: the outage is seen within one check, and ends the job at the
    # first check OUTAGE_S after that.
    line = assert_ended(ended, code=4, says="ClickHouse", within_s=OUTAGE_S + 2 * 10 + 20, max_lines=14)
    assert "participant.outage_timeout_s = 6" in line
    assert json_lines(ended, "chtxn.participant.outage"), ended.stderr


# ---- Spark ---------------------------------------------------------------------------------


def test_a_spark_master_that_refuses_connections_is_one_line_in_seconds(stack, tmp_path, archive_cache):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjrefuse"))
    master = f"spark://127.0.0.1:{free_port()}"
    ended = participant_job(pipeline, "--master", master, "--cache-dir", str(archive_cache), timeout_s=LAUNCHER_BOUND_S)
    assert_ended(
        ended, code=5, says=f"cannot reach the Spark master at {master}", within_s=LAUNCHER_BOUND_S, max_lines=1
    )


def test_a_spark_master_that_never_answers_is_one_line_within_its_bound(stack, tmp_path, archive_cache, silent_master):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjsilent"))
    ended = participant_job(pipeline, "--master", silent_master, "--cache-dir", str(archive_cache), timeout_s=150)
    # The executors' archive may be built first (one progress line per distribution).
    line = assert_ended(
        ended, code=5, says=f"the Spark master {silent_master} did not start", within_s=150, max_lines=24
    )
    assert "within 30 s" in line
    assert " INFO " not in ended.stderr, ended.stderr


def test_a_spark_master_address_of_another_server_is_one_line_within_its_bound(
    stack, tmp_path, archive_cache, http_master
):
    pipeline = make_pipeline(stack, tmp_path, unique_name("pjhttp"))
    ended = participant_job(pipeline, "--master", http_master, "--cache-dir", str(archive_cache), timeout_s=150)
    # Spark's own line per failed registration attempt (no JVM stack), then chtxn's.
    line = assert_ended(ended, code=5, says=f"the Spark master {http_master} did not start", within_s=150, max_lines=24)
    assert "within 30 s" in line
    assert "Too large frame" in ended.stderr, "the fixture answered as another server does"
    assert " INFO " not in ended.stderr, ended.stderr
