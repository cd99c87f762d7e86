"""``chtxn dlq replay`` as an operator runs it, on letters the publisher put in the dead-letter topic: a dry
run by default, each letter produced once however often it runs, marked so that a replay is traceable."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial

import pytest
from confluent_kafka import Consumer, TopicPartition as KafkaTP
from confluent_kafka.admin import AdminClient

from clients.log_ends import CONSUMER_PROPERTIES, log_ends
from coordinator.dead_letters.replay import DeadLetterReplay, ReplayError
from participant.bad_records import TOMBSTONE, Letter
from protocol.dead_letters.replay import INTENT_KEY, Selection, replay_log_topic
from tests.helpers import REPO, create_topic, run_chtxn, unique_name, wait_until
from tests.integration.ledger_writes import publish_letters
from tests.integration.live_pipeline import coordinator, participants
from tests.pipelines import Pipeline, assert_exactly_once, make_pipeline
from tests.records import Rec

#: ``python -m cli`` of this checkout, without the session's ``CHTXN_*`` settings.
chtxn = partial(run_chtxn, timeout_s=120, inherit_chtxn_vars=False, env={"PYTHONPATH": str(REPO)})


@dataclass(frozen=True)
class RecWithHeaders(Rec):
    h: tuple[tuple[str, bytes], ...] = ()

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self.h)


def letters_of(pipeline: Pipeline) -> list[Letter]:
    """Letters of records 4 (a tombstone), 7 (with a header of its own) and 9 of partition 0, txn e1_t1."""
    topic = pipeline.topic
    return [
        Letter(Rec(topic, 0, 4, None, b"k4"), TOMBSTONE),
        Letter(RecWithHeaders(topic, 0, 7, b'{"id": "x"}', b"k7", (("trace", b"t-7"),)), "not a number", 27),
        Letter(Rec(topic, 0, 9, b"{broken", b"k9"), "not JSON", 26),
    ]


def read_all(bootstrap: str, topic: str) -> list:
    """Every record of partition 0 of ``topic`` (``read_committed``), in order, read to partition EOF."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "replay-read", **CONSUMER_PROPERTIES})
    try:
        end = log_ends(consumer, [(topic, 0)])[(topic, 0)]
        consumer.assign([KafkaTP(topic, 0, 0)])
        found: list = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    found.append(m)
                elif m.offset() >= end:
                    return found  # partition EOF at the end
        raise AssertionError(f"{topic}: no partition EOF at offset {end} within 30 s")
    finally:
        consumer.close()


def replay(config: str, *args: str) -> dict:
    done = chtxn("dlq", "replay", "--config", config, "--by", "tester", *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_dry_run_produces_nothing_and_execute_replays_each_letter_once(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("replay"), partitions=1)
    config, bootstrap, dlq = (
        str(pipeline.config_path),
        pipeline.cfg.kafka.bootstrap_servers,
        pipeline.cfg.dead_letter_topic,
    )
    publish_letters(pipeline, letters_of(pipeline))

    planned = replay(config, "--all")
    assert planned["dry_run"] is True and planned["counts"]["replay"] == 3
    assert [(x["offset"], x["to_topic"], x["to_partition"], x["result"]) for x in planned["letters"]] == [
        (4, pipeline.topic, 0, "replay"),
        (7, pipeline.topic, 0, "replay"),
        (9, pipeline.topic, 0, "replay"),
    ]
    assert read_all(bootstrap, pipeline.topic) == [], "a dry run produced records"

    done = replay(config, "--txn", "e1_t1", "--execute")
    assert done["dry_run"] is False and done["counts"]["replayed"] == 3
    records = read_all(bootstrap, pipeline.topic)
    assert [(m.key(), m.value()) for m in records] == [(b"k4", None), (b"k7", b'{"id": "x"}'), (b"k9", b"{broken")]
    letters = {x["offset"]: x for x in done["letters"]}
    for m in records:
        headers = dict(m.headers() or [])
        source = headers["chtxn.replay.source"].decode()
        x = letters[int(source.rsplit("/", 1)[1])]
        assert headers["chtxn.replay.of"].decode() == f"{dlq}/0/{x['position'].split(':')[1]}" == x["of"]
        assert headers["chtxn.replay.by"] == b"tester"
        assert x["replay"]["to"] == f"{pipeline.topic}/0/{m.offset()}"
    assert dict(records[1].headers())["trace"] == b"t-7", "the record's own headers stay"

    again = replay(config, "--all", "--execute")
    assert again["counts"]["already replayed"] == 3 and again["counts"]["replayed"] == 0
    assert [x["replay"]["by"] for x in again["letters"]] == ["tester"] * 3
    assert len(read_all(bootstrap, pipeline.topic)) == 3, "a second replay produced the letters again"
    log = [m.key() for m in read_all(bootstrap, replay_log_topic(dlq))]
    assert len([k for k in log if k != INTENT_KEY.encode()]) == 3, "one log record per letter"
    assert log.count(INTENT_KEY.encode()) == 1, "one intent per batch"

    table = chtxn("dlq", "replay", "--config", config, "--all")
    assert table.returncode == 0, table.stderr
    assert "dry run" in table.stdout and "already replayed" in table.stdout and "by tester at" in table.stdout


def letters_if(pipeline: Pipeline, n: int) -> dict | None:
    """The offsets in the dead-letter topic once partition 0 has ``n`` of them, else None."""
    found = pipeline.dead_letter_offsets()
    return found if len(found.get(pipeline.partitions[0], ())) == n else None


def test_once_the_replayed_records_are_committed_status_shows_no_lag(stack, tmp_path):
    """Issue 36, item 6b: a replay produces in a Kafka transaction, so the source partition ends in its
    marker. Once the replayed records are committed, the commit reaches past the marker: ``chtxn status``
    shows lag 0 (on main, 1 for good), and the oracle and ``chtxn verify --deep`` agree."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("replaylag"), partitions=1)
    config = str(pipeline.config_path)
    produced = pipeline.produce(20, bad_every=10)  # ids 9 and 19 are malformed: letters
    with coordinator(pipeline), participants(pipeline):
        wait_until(lambda: letters_if(pipeline, 2), 60, "the malformed records dead-lettered", interval_s=0.5)
        done = replay(config, "--all", "--execute")
        assert done["counts"]["replayed"] == 2, done
        last = max(int(x["replay"]["to"].rsplit("/", 1)[1]) for x in done["letters"])
        # The txn that commits the last replayed record may end just before the marker (the marker is
        # written after it); a partition read to its end then commits past the marker, not lag 1 for good.
        wait_until(
            lambda: pipeline.ledger().head()[1].get(pipeline.partitions[0], 0) >= last + 2,
            60,
            "the replayed records committed past the replay's marker",
        )
        status = chtxn("status", "--config", config, "--json")
        lags = {(p["partition"], p["log_end"]): p["lag"] for p in json.loads(status.stdout)["partitions"]}
        assert lags == {(0, last + 2): 0}, lags  # the replayed records, then the replay's marker
        letters = wait_until(lambda: letters_if(pipeline, 4), 60, "the replayed records dead-lettered", interval_s=0.5)
    assert_exactly_once(pipeline, produced - 2, letters)
    deep = chtxn("verify", "--config", config, "--deep", "--json")
    assert deep.returncode == 0 and json.loads(deep.stdout)["outcome"] == "OK", deep.stdout + deep.stderr


def test_a_range_replayed_to_another_topic_is_not_replayed_again_to_the_source(stack, tmp_path, kafka_admin):
    pipeline = make_pipeline(stack, tmp_path, unique_name("replayto"), partitions=1)
    config = str(pipeline.config_path)
    publish_letters(pipeline, letters_of(pipeline))
    retry = create_topic(kafka_admin, unique_name("retry"), 3)

    moved = replay(
        config, "--topic", pipeline.topic, "--partition", "0", "--offsets", "5-9", "--to", retry, "--execute"
    )
    assert [(x["offset"], x["result"]) for x in moved["letters"]] == [(7, "replayed"), (9, "replayed")]
    assert all(x["replay"]["to"].startswith(f"{retry}/") for x in moved["letters"])

    rest = replay(config, "--all", "--execute")
    assert [(x["offset"], x["result"]) for x in rest["letters"]] == [
        (4, "replayed"),
        (7, "already replayed"),
        (9, "already replayed"),
    ]
    assert [m.key() for m in read_all(pipeline.cfg.kafka.bootstrap_servers, pipeline.topic)] == [b"k4"]


def test_a_replay_refuses_what_it_cannot_do(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("replaybad"), partitions=1)
    config = str(pipeline.config_path)
    publish_letters(pipeline, letters_of(pipeline))
    admin = AdminClient({"bootstrap.servers": pipeline.cfg.kafka.bootstrap_servers})
    cases = {
        (): "choose the letters to replay: --all, or any of --txn",
        ("--all", "--txn", "e1_t1"): "(not both)",
        ("--offsets", "3-9"): "--offsets needs --partition",
        ("--partition", "0", "--offsets", "9-3"): "with N <= M",
        ("--txn", "e9_t9"): f"no letter in {pipeline.cfg.dead_letter_topic} matches txn e9_t9",
        ("--all", "--to", "no-such-topic", "--execute"): "no-such-topic: no such topic",
        ("--all", "--to", pipeline.cfg.control_topic, "--execute"): "it is one of chtxn's own topics",
    }
    for args, message in cases.items():
        done = chtxn("dlq", "replay", "--config", config, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("chtxn: ") and message in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    assert "no-such-topic" not in admin.list_topics(timeout=10).topics, "a replay created its destination"


class _CommitHook:
    """A producer whose second ``commit_transaction`` (the batch's; the first is its intent's) first runs
    ``before_commit`` (another replay), then commits."""

    def __init__(self, producer, before_commit) -> None:
        self._producer, self._before_commit = producer, before_commit
        self._commits = 0

    def commit_transaction(self, *args):
        self._commits += 1
        if self._commits == 2:
            self._before_commit()
        return self._producer.commit_transaction(*args)

    def __getattr__(self, name: str):
        return getattr(self._producer, name)


class ReplayOvertaken(DeadLetterReplay):
    """A replay that another replay of the pipeline overtakes between producing its batch and committing it."""

    def __init__(self, *args, overtake, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.overtake = overtake

    def _start(self) -> None:
        super()._start()
        self._producer = _CommitHook(self._producer, self.overtake)


def test_a_replay_started_while_another_runs_fences_it_and_each_letter_goes_once(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("replayrace"), partitions=1)
    publish_letters(pipeline, letters_of(pipeline))
    everything = Selection(everything=True)
    second: list = []

    def overtake() -> None:
        with DeadLetterReplay(pipeline.cfg, by="second") as other:
            second.extend(other.execute(everything))

    # a fenced commit fails at once on Kafka; on the embedded broker it times out
    overtaken = ReplayOvertaken(pipeline.cfg, by="first", overtake=overtake, timeout_s=5)
    with overtaken as first, pytest.raises(ReplayError) as failed:
        first.execute(everything)
    assert "run the same replay again" in str(failed.value)
    # Kafka hides the fenced replay's batch, and the second replays every letter; the embedded broker
    # shows it (aborted records stay visible there), and the second skips what the log shows done.
    # Either way each letter is in the source topic once, where the replay log says it is.
    with DeadLetterReplay(pipeline.cfg, by="third") as third:
        logged = {p.key: p.record for p in third.plan(everything) if p.action == "already replayed"}
    replayed = read_all(pipeline.cfg.kafka.bootstrap_servers, pipeline.topic)
    where = {dict(m.headers())["chtxn.replay.of"].decode(): m for m in replayed}
    assert len(replayed) == len(where) == len(logged) == 3
    for key, record in logged.items():
        m = where[key]
        assert record.to == f"{pipeline.topic}/0/{m.offset()}"
        assert record.by.encode() == dict(m.headers())["chtxn.replay.by"]
    expected = {"second"} if stack.external_kafka else {"first", "second"}
    assert {r.by for r in logged.values()} <= expected
    assert len(second) == 3


@pytest.mark.parametrize(
    "step", ["replay.after-intent", "replay.after-flush", "replay.before-commit", "replay.before-settle"]
)
def test_a_replay_killed_at_each_step_and_run_again_produces_each_letter_once(stack, tmp_path, step):
    """``chtxn dlq replay --execute`` SIGKILLed at ``step`` of its batch (or, for ``replay.before-settle``,
    of the run that settles such a batch), then run again to the end: each letter is in the source
    topic exactly once, where the replay log says. On main, killed after its flush and run again, each
    letter was there twice on the embedded broker (it shows the killed run's aborted records to
    ``read_committed`` readers; the log, aborted too, did not hold them, so they went out again)."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("replaykill"), partitions=1)
    config = str(pipeline.config_path)
    publish_letters(pipeline, letters_of(pipeline))
    first = "replay.after-flush" if step == "replay.before-settle" else step
    kills = [first, step] if step != first else [step]
    for point in kills:
        if point == "replay.before-settle" and stack.external_kafka:
            break  # Kafka hides the killed batch: nothing is found, nothing to settle
        killed = chtxn(
            "dlq",
            "replay",
            "--config",
            config,
            "--all",
            "--execute",
            env={"PYTHONPATH": str(REPO), "CHTXN_FAILPOINTS": f"{point}=crash"},
        )
        assert killed.returncode == -9, f"{point}: {killed.stdout}{killed.stderr}"
    replay(config, "--all", "--execute")
    replay(config, "--all", "--execute")  # a second run finds nothing left to do
    replayed = read_all(pipeline.cfg.kafka.bootstrap_servers, pipeline.topic)
    of = [dict(m.headers())["chtxn.replay.of"].decode() for m in replayed]
    assert len(of) == len(set(of)) == 3, f"letters in the source topic: {sorted(of)}"
    with DeadLetterReplay(pipeline.cfg, by="reader") as reader:
        plan = reader.plan(Selection(everything=True))
    assert {p.action for p in plan} == {"already replayed"}
    where = {dict(m.headers())["chtxn.replay.of"].decode(): m.offset() for m in replayed}
    for p in plan:
        assert p.record is not None and p.record.to == f"{pipeline.topic}/0/{where[p.key]}", (p.key, p.record)
