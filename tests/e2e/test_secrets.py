"""Secrets never leave a process: a pipeline whose ClickHouse URL and Kafka properties hold
passwords runs end to end (coordinator and Spark job as an operator starts them), the operator's
commands run against it, text and ``--json``, and their failures too; not one output or log
holds a password (issue 29, defect 6)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tests.e2e.processes import committed, running
from tests.helpers import REPO, run_chtxn, unique_name
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline

URL_PASSWORD = "Url-Pw-5521-secret"
KAFKA_PASSWORD = "Sasl-Pw-7717-secret"
PROPERTIES_PASSWORD = "Key-Pw-3309-secret"
SECRETS = (URL_PASSWORD, KAFKA_PASSWORD, PROPERTIES_PASSWORD)


def chtxn(*args: str, env: dict[str, str] | None = None) -> str:
    """Everything ``python -m cli ARGS`` printed, stdout and stderr."""
    done = run_chtxn(*args, env={"PYTHONPATH": str(REPO), "COLUMNS": "200", **(env or {})})
    return f"$ chtxn {' '.join(args)} -> {done.returncode}\n{done.stdout}{done.stderr}"


def with_secrets(stack, tmp_path: Path) -> Pipeline:  # TestStack
    url = urlsplit(stack.clickhouse_url)
    pipeline = make_pipeline(
        stack,
        tmp_path,
        unique_name("secrets"),
        settings={
            "clickhouse.url": f"{url.scheme}://chtxn_user:{URL_PASSWORD}@{url.hostname}:{stack.clickhouse_port}",
        },
    )
    config = pipeline.config_path.read_text()
    pipeline.config_path.write_text(config + f'[kafka.properties]\n"ssl.key.password" = "{PROPERTIES_PASSWORD}"\n')
    return pipeline


def test_no_output_or_log_holds_a_password(stack, tmp_path):
    pipeline = with_secrets(stack, tmp_path)
    cfg = str(pipeline.config_path)
    outputs = [chtxn("init", "--config", cfg)]
    produced = pipeline.produce(2_000, bad_every=500)
    logs = tmp_path / "logs"
    logs.mkdir()
    with running(pipeline, logs, slots=2) as procs:
        committed(pipeline, produced - produced // 500, procs)
        for command in (("status",), ("txn", "list"), ("verify", "--deep"), ("dlq", "list")):
            outputs += [chtxn(*command, "--config", cfg), chtxn(*command, "--json", "--config", cfg)]
        outputs.append(chtxn("--log-level", "DEBUG", "txn", "list", "--config", cfg))
    assert_exactly_once(pipeline, produced - produced // 500, pipeline.dead_letter_offsets())

    # Failures: ClickHouse unreachable, a forbidden Kafka property beside a secret one, a password
    # of the wrong type, and a URL password that disagrees with clickhouse.password.
    down = tmp_path / "down.toml"
    down.write_text(pipeline.config_path.read_text().replace(f":{stack.clickhouse_port}", ":1"))
    forbidden = tmp_path / "forbidden.toml"
    forbidden.write_text(
        pipeline.config_path.read_text() + f'"group.id" = "mine"\n"sasl.password" = "{KAFKA_PASSWORD}"\n'
    )
    numeric = tmp_path / "numeric.toml"
    numeric.write_text(
        pipeline.config_path.read_text().replace("[clickhouse]\n", "[clickhouse]\npassword = 55219977\n")
    )
    both = tmp_path / "both.toml"
    both.write_text(
        pipeline.config_path.read_text().replace("[clickhouse]\n", f'[clickhouse]\npassword = "{KAFKA_PASSWORD}"\n')
    )
    failures = [
        chtxn("status", "--config", str(down)),
        chtxn("init", "--config", str(down)),
        chtxn("status", "--config", str(forbidden)),
        chtxn("status", "--json", "--config", str(numeric)),
        chtxn("txn", "list", "--config", str(both)),
    ]
    everything = outputs + failures + [p.read_text(errors="replace") for p in sorted(logs.glob("*.log"))]
    assert len(everything) > len(outputs) + len(failures), "the processes wrote their logs"
    leaks = [(secret, text[:120]) for text in everything for secret in (*SECRETS, "55219977") if secret in text]
    assert leaks == [], leaks
    assert all(" -> 0\n" not in f for f in failures), failures
    assert "chtxn_user:***@" in "".join(failures), "a connection failure names the URL, masked"
