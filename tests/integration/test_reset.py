"""``chtxn reset`` against a running pipeline (a coordinator replica on a thread, test code playing
the participants, the embedded stack): refused unless paused or within the log; a skip to the log
end recorded in the ledger with who and why, the leader handing over at once, and after the
resume every record not skipped committed exactly once."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from confluent_kafka import Producer

from protocol.ledger.resets import is_reset
from tests.helpers import last_txn, run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_cli_errors import failure_line
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import make_pipeline


def test_a_reset_is_refused_unless_paused_and_its_offset_is_within_the_log(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetno"))
    config = str(pipeline.config_path)
    pipeline.produce(10)
    running = failure_line(run_chtxn("reset", "--config", config, "--partition", "0", "--to-offset", "0"))
    assert f"pipeline {pipeline.cfg.name} is not paused" in running and "chtxn pause" in running
    assert run_chtxn("pause", "--config", config).returncode == 0
    beyond = failure_line(run_chtxn("reset", "--config", config, "--partition", "0", "--to-offset", "999"))
    assert f"offset 999 is outside the log of {pipeline.topic}/0 [0, " in beyond
    unknown = failure_line(run_chtxn("reset", "--config", config, "--partition", "7", "--to-earliest"))
    assert f"{pipeline.topic}/7: not a partition of the pipeline's topics" in unknown
    bad_time = failure_line(run_chtxn("reset", "--config", config, "--all-partitions", "--to-time", "noon"), code=2)
    assert "--to-time 'noon' is not an ISO 8601 time" in bad_time
    assert [c.txn for c in pipeline.ledger().commits()] == ["pause_s1"], "a refused reset wrote to the ledger"


def test_a_skip_to_the_log_end_while_paused_commits_everything_else_exactly_once(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetskip"))
    config = str(pipeline.config_path)
    before = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        ledger = pipeline.ledger()
        wait_until(lambda: pipeline.target_count() == before, 60, "the first records committed")
        assert run_chtxn("pause", "--config", config, "--by", "bob").returncode == 0
        wait_until(lambda: last_txn(ledger).state == "PUBLISHED", 30, "the open txn done")
        skipped = pipeline.produce(200, start_id=before)
        epoch = ledger.max_epoch()
        planned = run_chtxn("reset", "--config", config, "--all-partitions", "--to-latest", "--dry-run", "--json")
        assert planned.returncode == 0, planned.stderr
        assert json.loads(planned.stdout)["commit_seq"] is None and ledger.commits()[-1].txn.startswith("e")

        done = run_chtxn(
            "reset", "--config", config, "--all-partitions", "--to-latest", "--by", "bob", "--reason", "bad batch"
        )
        assert done.returncode == 0, done.stderr
        [reset] = [c for c in ledger.commits() if is_reset(c)]
        assert reset.txn == f"reset_s{reset.commit_seq}" and reset.coordinator == "bob"
        assert reset.reason == "offset reset --to-latest: bad batch"
        assert sum(r.end - r.start for r in reset.ranges) == skipped
        assert f"offset reset --to-latest: bad batch by bob in commit slot {reset.commit_seq}" in done.stdout
        # The leader hands over at once; the take-over (epoch + 1) seals after the reset.
        wait_until(lambda: ledger.commits()[-1].commit_seq > reset.commit_seq, 30, "a take-over sealed after it")
        assert ledger.max_epoch() == epoch + 1
        again = run_chtxn("reset", "--config", config, "--all-partitions", "--to-latest")
        assert "every partition is already there: nothing recorded" in again.stdout, again.stderr
        listed = run_chtxn("txn", "list", "--config", config)  # an offset reset is never folded away
        assert reset.txn in listed.stdout, listed.stdout

        assert run_chtxn("resume", "--config", config).returncode == 0
        after = pipeline.produce(100, start_id=before + skipped)
        wait_until(lambda: pipeline.target_count() == before + after, 60, "the records after the skip committed")
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    assert report.rows_in_target == before + after
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    skipped_ids = f"SELECT count() FROM `{db}`.`{table}` WHERE id >= {before} AND id < {before + skipped}"
    assert int(pipeline.client().command(skipped_ids)) == 0, "a skipped record was committed"
    verified = run_chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout


def test_to_time_finds_the_first_record_at_or_after_the_time_whatever_the_broker_answers(stack, tmp_path):
    """The embedded broker answers a look-up by time with offset 0 for any time: the answer is
    checked against the records' own timestamps, and searched for when it is wrong."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("resettime"))
    config = str(pipeline.config_path)
    base_ms = 1_700_000_000_000
    producer = Producer({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
    for i in range(100):  # record i: partition i % 2, offset i // 2, a second after record i - 1
        producer.produce(pipeline.topic, value=b'{"id": %d}' % i, partition=i % 2, timestamp=base_ms + i * 1000)
    assert producer.flush(30) == 0
    assert run_chtxn("pause", "--config", config).returncode == 0

    def planned(when_ms: int) -> dict[str, int]:
        when = datetime.fromtimestamp(when_ms / 1000, tz=timezone.utc).isoformat()
        done = run_chtxn("reset", "--config", config, "--all-partitions", "--to-time", when, "--dry-run", "--json")
        assert done.returncode == 0, done.stderr
        return {p["partition"].rpartition("/")[2]: p["reset_to"] for p in json.loads(done.stdout)["partitions"]}

    assert planned(base_ms + 60_000) == {"0": 30, "1": 30}
    assert planned(base_ms + 60_500) == {"0": 31, "1": 30}  # record 61 (partition 1, offset 30), record 62 (0, 31)
    assert planned(base_ms - 1) == {"0": 0, "1": 0}
    assert planned(base_ms + 100_000) == {"0": 50, "1": 50}  # nothing that late: the log end
