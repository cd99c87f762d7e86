"""One txn across several tables (``[[route]]``), one commit point: a leader stalled or dead between
two tables' publishes is rolled forward by the next, a stage table of one table failing step 5
aborts the txn in every table, and a table with no records waiting gets no stage table in a txn
(its first records after idling commit once, in a later txn), and a topic whose route was removed
is in no txn and staged into no table.

Real ``Leader``s in threads against the embedded stack, with test code playing the participants;
failpoints hold a leader at a chosen step. Every test ends with the exactly-once oracle per table.
"""

from __future__ import annotations

import json

from confluent_kafka import KafkaError, KafkaException

from clients import failpoints
from clients.kafka import KafkaClientFactory
from coordinator.leader import Leader
from protocol import naming
from protocol.config.parse import parse_config
from tests.helpers import crash_a_coordinator_at, run_chtxn, unique_name, wait_until
from tests.integration.live_pipeline import coordinator, participants
from tests.integration.scripted_participants import ScriptedParticipants
from tests.leaders import LeaderThread, leaders
from tests.pipelines import Pipeline
from tests.routed import (
    assert_exactly_once_per_table,
    make_routed_pipeline,
    produce_to,
    stage_tables_left,
    table_count,
)

WAIT_S = 60.0


def test_a_leader_stalled_between_two_tables_publishes_is_rolled_forward_by_the_next(stack, tmp_path):
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtpub"), tables=3)
    produced = {f"t{i}": produce_to(pipeline, f"{pipeline.cfg.name}_t{i}", 200 + 100 * i) for i in range(3)}
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as scripted, leaders(e1, e2):
        between = failpoints.arm("leader.between-table-publishes", "pause*1", who="E1")
        e1.start()
        assert between.reached.wait(WAIT_S), "E1 never published a first table"
        k = next(s.txn for s in reversed(scripted.statuses) if s.rows)
        assert table_count(pipeline, "t0") > 0 and table_count(pipeline, "t1") == table_count(pipeline, "t2") == 0
        assert pipeline.ledger().txn(k).state == "COMMITTED", "the txn is committed, half published"
        e2.start()  # seals, then rolls k forward: t0's stage table is empty, t1's and t2's are moved
        wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by E2")
        failpoints.release("leader.between-table-publishes")  # E1 goes on: the rest is gone, published
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), WAIT_S, "every record committed"
        )
        wait_until(lambda: isinstance(e1.outcome, str), WAIT_S, "E1 stepped down")
    assert_exactly_once_per_table(pipeline, produced)
    assert stage_tables_left(pipeline) == []
    commit = next(c for c in pipeline.ledger().commits() if c.txn == k)
    assert commit.target == "t0,t1,t2" and {r.topic for r in commit.ranges if r.rows} == {
        f"{pipeline.cfg.name}_t{i}" for i in range(3)
    }


def test_a_leader_killed_between_two_tables_publishes_is_rolled_forward_by_the_next(stack, tmp_path):
    """The coordinator process SIGKILLs itself (failpoint ``crash``) with one of three tables published."""
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtkill"), tables=3)
    produced = {f"t{i}": produce_to(pipeline, f"{pipeline.cfg.name}_t{i}", 300) for i in range(3)}
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions):
        crash_a_coordinator_at(pipeline.config_path, "leader.between-table-publishes", WAIT_S * 2)
        (k,) = [t.txn for t in pipeline.ledger().history(limit=50, state="COMMITTED")]
        assert table_count(pipeline, "t0") > 0 and table_count(pipeline, "t1") == table_count(pipeline, "t2") == 0
        with coordinator(pipeline, coordinator_id="next"):
            wait_until(lambda: pipeline.ledger().txn(k).state == "PUBLISHED", WAIT_S, f"{k} published by the next")
            wait_until(
                lambda: all(table_count(pipeline, t) == n for t, n in produced.items()),
                WAIT_S,
                "every record committed",
            )
    assert_exactly_once_per_table(pipeline, produced)
    assert stage_tables_left(pipeline) == []


def test_a_table_with_no_records_waiting_gets_no_stage_table_and_its_first_records_commit_once(stack, tmp_path):
    """Real participant tasks (their heartbeats carry log ends): idle tables are in no txn's stage
    tables, and records arriving in an idle table are read again and committed by a later txn."""
    # idle txns end at the interval, as before idle_interval_s: empty txns show which tables get stage tables
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtidle"), tables=3, idle_interval_s=0.5)
    name = pipeline.cfg.name
    produced = {"t0": produce_to(pipeline, f"{name}_t0", 300), "t1": 0, "t2": 0}

    def landed() -> bool:
        return all(table_count(pipeline, t) == n for t, n in produced.items())

    def commits() -> list:
        """Committed txns, seals left out."""
        return [c for c in pipeline.ledger().commits() if naming.parse_txn_id(c.txn)[1]]

    with coordinator(pipeline) as service, participants(pipeline, tasks=2):
        wait_until(landed, WAIT_S, "t0's records committed")
        seen = len(commits())
        wait_until(lambda: len(commits()) >= seen + 6, WAIT_S, "six more txns, every table idle")
        # The first txns may still have stage tables: t0's, made one txn ahead while its last rows were
        # not yet committed; the others', made before the heartbeats told their log ends.
        idle = commits()[-3:]
        assert all(c.stage_table == "" and c.target == "" for c in idle), [(c.txn, c.target) for c in idle]
        quiet = len(commits()) - 3
        produced["t2"] = produce_to(pipeline, f"{name}_t2", 200)
        wait_until(landed, WAIT_S, "t2's records committed")
        status = json.loads(run_chtxn("status", "--config", str(pipeline.config_path), "--json").stdout)
        metric = service.metrics.registry.get_sample_value
    # per table: status (the pipeline's own partitions and commits), the metric, txn show
    assert {t["table"]: (t["partitions"], t["lag"]) for t in status["tables"]} == {t: (2, 0) for t in produced}
    assert {p["table"] for p in status["partitions"]} == set(produced)
    assert status["tables"][1]["rows_per_s"] in (0.0, None), status["tables"]
    assert {t: metric("chtxn_table_rows_committed_total", {"pipeline": name, "table": t}) for t in produced} == {
        t: float(n) for t, n in produced.items()
    }
    with_rows = [c for c in commits() if c.total_rows]
    assert with_rows[-1].target == "t2" and naming.split_stages(with_rows[-1].stage_table) == [
        naming.stage_table("t2", name, with_rows[-1].txn)
    ]
    shown = json.loads(
        run_chtxn("txn", "show", with_rows[-1].txn, "--config", str(pipeline.config_path), "--json").stdout
    )
    assert shown["rows_by_table"] == {"t0": 0, "t1": 0, "t2": with_rows[-1].total_rows}
    later = commits()[quiet:]
    assert not any("t1" in c.target.split(",") for c in later), [(c.txn, c.target, c.total_rows) for c in later]
    assert_exactly_once_per_table(pipeline, produced)
    assert stage_tables_left(pipeline) == []


def test_one_tables_stage_table_failing_step_5_aborts_the_txn_in_every_table(stack, tmp_path):
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtcheck"), tables=3)
    produced = {f"t{i}": produce_to(pipeline, f"{pipeline.cfg.name}_t{i}", 300) for i in range(3)}
    db = pipeline.cfg.clickhouse.database
    with (
        ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants,
        leaders(e1 := LeaderThread(pipeline, 1, "E1")),
    ):
        counting = failpoints.arm("leader.before-count", "pause*1", who="E1")
        e1.start()
        assert counting.reached.wait(WAIT_S)
        k = next(s.txn for s in reversed(participants.statuses) if s.rows)
        pipeline.client().command(f"DROP TABLE `{db}`.`{naming.stage_table('t1', pipeline.cfg.name, k)}`")
        failpoints.release("leader.before-count")
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), WAIT_S, "every record committed"
        )
    aborted = {t.txn: t.reason for t in pipeline.ledger().history(limit=100, state="ABORTED")}
    assert "does not exist" in aborted.get(k, ""), aborted
    assert_exactly_once_per_table(pipeline, produced)


def test_a_table_with_a_view_is_published_by_insert_select_and_the_others_by_move(stack, tmp_path):
    """Per-table publish modes (``[[route]] publish_mode``): t1 has a materialized view, which fires
    on INSERT only; its route takes insert-select while t0 keeps move. The view counts every row once,
    also when the leader dies between the two tables' publishes and the next one publishes t1."""
    pipeline = make_routed_pipeline(stack, tmp_path, unique_name("mtmode"), tables=2, insert_select=("t1",))
    db = f"`{pipeline.cfg.clickhouse.database}`"
    client = pipeline.client()
    client.command(
        f"CREATE TABLE {db}.t1_counts (_partition Int32, rows UInt64) ENGINE = MergeTree ORDER BY _partition "
        "SETTINGS non_replicated_deduplication_window = 1000"
    )
    client.command(
        f"CREATE MATERIALIZED VIEW {db}.t1_mv TO {db}.t1_counts AS "
        f"SELECT _partition, count() AS rows FROM {db}.t1 GROUP BY _partition"
    )
    produced = {t: produce_to(pipeline, f"{pipeline.cfg.name}_{t}", 400) for t in ("t0", "t1")}
    e1, e2 = LeaderThread(pipeline, 1, "E1"), LeaderThread(pipeline, 2, "E2")
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), leaders(e1, e2):
        between = failpoints.arm("leader.between-table-publishes", "pause*1", who="E1")
        e1.start()
        assert between.reached.wait(WAIT_S), "E1 never published a first table"
        assert table_count(pipeline, "t0") > 0 and table_count(pipeline, "t1") == 0
        e2.start()  # rolls t1 forward by insert-select; E1, released, finds it done
        wait_until(
            lambda: all(table_count(pipeline, t) == n for t, n in produced.items()), WAIT_S, "every record committed"
        )
        failpoints.release("leader.between-table-publishes")
        wait_until(lambda: isinstance(e1.outcome, str), WAIT_S, "E1 stepped down")
    assert_exactly_once_per_table(pipeline, produced)
    counted = int(client.command(f"SELECT sum(rows) FROM {db}.t1_counts"))
    assert counted == produced["t1"], f"the view on t1 counted {counted} rows, t1 holds {produced['t1']}"
    assert stage_tables_left(pipeline) == []


class _AdminListingFailsOnce:
    """A real admin client whose second cluster listing fails, as a broker that does not answer once:
    the leader's first partition check, right after its take-over listed the partitions."""

    def __init__(self, admin) -> None:
        self._admin, self._listings = admin, 0

    def list_topics(self, *args, **kwargs):
        self._listings += 1
        if self._listings == 2:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "test: the broker did not answer"))
        return self._admin.list_topics(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._admin, name)


class _ListingFailsOnce(KafkaClientFactory):
    def admin(self):
        return _AdminListingFailsOnce(super().admin())


class LeaderWhoseListingFailsOnce(Leader):
    def __init__(self, cfg, **kwargs) -> None:
        super().__init__(cfg, kafka=_ListingFailsOnce(cfg), **kwargs)


def test_a_topic_whose_route_was_removed_is_never_started_or_staged_into_another_table(stack, tmp_path):
    """Issue 35 item 8. Topic t2 leaves the routes; the restarted leader's first partition check
    fails, and the participants (not restarted: the old config) still hold t2's partitions. The
    leader STARTs none of t2's partitions, none of t2's new records land in t1 (the txn's only stage
    table), and the leader goes on committing (no KeyError in its metrics step)."""
    # idle txns end at the interval: the restarted leader must go on committing without t2's records
    old = make_routed_pipeline(stack, tmp_path, unique_name("mtgone"), tables=3, idle_interval_s=0.5)
    name = old.cfg.name
    produced = {f"t{i}": produce_to(old, f"{name}_t{i}", 100) for i in range(3)}
    counts = lambda: {t: table_count(old, t) for t in produced}  # noqa: E731
    with participants(old, tasks=2):
        with leaders(e1 := LeaderThread(old, 1, "E1")):
            e1.start()
            wait_until(lambda: counts() == produced, WAIT_S, "every record committed")
            e1.stop.set()
            assert e1.ended(WAIT_S) == "stopped"
        text = old.config_path.read_text()
        gone = f'\n[[route]]\ntopics = ["{name}_t2"]\ntable = "t2"\n'
        assert gone in text
        path = tmp_path / f"{name}-without-t2.toml"
        path.write_text(text.replace(gone, ""))
        new = Pipeline(parse_config(path.read_text(), source=str(path)), path, old.partitions[:4])
        produced["t1"] += produce_to(old, f"{name}_t1", 40, start_id=100)
        produce_to(old, f"{name}_t2", 30, start_id=100)  # of no route now: never read
        seq_before = new.ledger().head()[0]
        with leaders(e2 := LeaderThread(new, 2, "E2", leader_class=LeaderWhoseListingFailsOnce)):
            e2.start()
            wait_until(lambda: counts()["t1"] >= produced["t1"], WAIT_S, "t1's new records committed")
            seq = new.ledger().head()[0]
            wait_until(lambda: new.ledger().head()[0] >= seq + 3, WAIT_S, "three more txns")
            assert e2.outcome is None, e2.outcome
            e2.stop.set()
            assert e2.ended(WAIT_S) == "stopped"
    assert counts() == produced, "t2's records landed in another table"
    later = [c for c in old.ledger().commits() if c.commit_seq > seq_before]
    assert later and not [c.txn for c in later if any(r.topic == f"{name}_t2" for r in c.ranges)]
    assert_exactly_once_per_table(old, produced)
    verified = run_chtxn("verify", "--config", str(old.config_path), "--deep", "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
