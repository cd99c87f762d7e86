"""An offset reset racing the leader's commit for one slot (failpoint ``leader.before-commit``): the
reset takes the slot, the held commit loses it, the leader hands over, and after the resume every
record is committed as the chain says: the rewound offsets exactly twice, the rest exactly once."""

from __future__ import annotations

import json
import threading

import pytest

from clients import failpoints
from coordinator.ledger.store import LedgerStore
from coordinator.offsets.reset import ResetDone, ResetTo, claim
from protocol.messages import TopicPartition
from tests.helpers import run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import make_pipeline


def hold_new_records_and_pause(pipeline, participants, held, cut, first: int) -> tuple[int, int]:
    """Produce 200 records after the committed ends ``cut``, wait until a commit holding them is held
    at ``leader.before-commit`` (``held``, armed by the caller, who releases it), then pause the
    pipeline; returns the records produced and the commit slot the held commit claims (the one
    after the pause's, which took the slot it was going to claim)."""
    more = pipeline.produce(200, start_id=first)
    wait_until(lambda: any(s.end_offset > cut[s.tp] for s in participants.statuses), 60, "new records staged")
    assert held.reached.wait(60), "no commit reached the failpoint"
    assert run_chtxn("pause", "--config", str(pipeline.config_path)).returncode == 0
    return more, pipeline.ledger().commits()[-1].commit_seq + 1


@pytest.mark.parametrize("commit_point", ["token", "keeper"])
def test_a_reset_takes_the_slot_of_a_held_commit_and_the_rewound_records_are_committed_once_more(
    request, tmp_path, commit_point
):
    stack = request.getfixturevalue("keeper_stack" if commit_point == "keeper" else "stack")
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetrace"), settings={"ledger.commit_point": commit_point})
    config = str(pipeline.config_path)
    first = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, ServiceThread(pipeline.cfg, "c1"):
        ledger = pipeline.ledger()
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        cut = {r.tp: r.end for c in ledger.commits() for r in c.ranges}
        held = failpoints.arm("leader.before-commit", "pause*1", who="c1")
        try:
            more, slot = hold_new_records_and_pause(pipeline, participants, held, cut, first)
            reset = run_chtxn("reset", "--config", config, "--all-partitions", "--to-earliest", "--json")
            assert reset.returncode == 0, reset.stderr
            assert json.loads(reset.stdout)["commit_seq"] == slot, "the reset did not take the held commit's slot"
        finally:
            failpoints.release("leader.before-commit")
        assert pipeline.target_count() == first, "the held commit published after losing its slot"
        wait_until(lambda: ledger.commits()[-1].commit_seq > slot, 60, "a take-over sealed after the reset")
        assert run_chtxn("resume", "--config", config).returncode == 0
        wait_until(lambda: pipeline.target_count() == 2 * first + more, 90, "every record committed again")
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    counts = (
        pipeline.client()
        .query(f"SELECT _partition, _offset, count() FROM `{db}`.`{table}` GROUP BY _partition, _offset")
        .result_rows
    )
    times = {(int(p), int(o)): int(n) for p, o, n in counts}
    expected = {}
    for tp in pipeline.partitions:
        end = max(o for p, o in times if p == tp.partition) + 1
        expected.update({(tp.partition, o): 2 if o < cut[tp] else 1 for o in range(end)})
    assert times == expected, "not every offset as often as the chain commits it"
    assert sum(times.values()) == 2 * first + more
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    assert sum(c.replayed for c in report.partitions) == first
    verified = run_chtxn("verify", "--config", config, "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout
    shown = run_chtxn("verify", "--config", config, "--deep")  # the replayed rows said in the table too
    assert f"({first} of them read again after offset resets, as the resets asked)" in shown.stdout, shown.stdout
    assert "replayed" in shown.stdout.splitlines()[1] or "replayed" in shown.stdout


def test_a_commit_that_lands_before_the_resets_claim_pushes_the_reset_to_the_next_slot(stack, tmp_path):
    """The reset read the head (slot s free), then the held commit took s: the reset's claim of s
    loses and it claims s + 1 from the offsets that commit ended at. No ``Reset`` message is sent:
    the resumed leader's next claim loses s + 1 to the reset, and the take-over starts from it."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetlate"))
    config = str(pipeline.config_path)
    first = pipeline.produce(300)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions) as participants, ServiceThread(pipeline.cfg, "c1"):
        ledger = pipeline.ledger()
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        cut = {r.tp: r.end for c in ledger.commits() for r in c.ranges}
        held = failpoints.arm("leader.before-commit", "pause*1", who="c1")
        reading = failpoints.arm("reset.before-claim", "pause*1", who="ops")
        done: list[ResetDone] = []
        try:
            more, slot = hold_new_records_and_pause(pipeline, participants, held, cut, first)
            store = LedgerStore.of(pipeline.cfg, pipeline.client())
            to = ResetTo(to="earliest")
            resetter = threading.Thread(
                target=lambda: done.append(
                    claim(pipeline.cfg, store, pipeline.partitions, to, who="ops", reason="late")
                ),
                daemon=True,
            )
            resetter.start()
            assert reading.reached.wait(30), "the reset never reached its claim"
            # The txn after the held one (opened by its END, ended by the pause) would commit into
            # slot + 1 as soon as the held one is in: hold it before its check until the reset claimed.
            failpoints.arm("leader.before-count", "pause*1", who="c1")
            failpoints.release("leader.before-commit")
            wait_until(lambda: ledger.commits()[-1].commit_seq == slot, 30, "the held commit took its slot")
            ended = {r.tp: r.end for r in ledger.commits()[-1].ranges}
            failpoints.release("reset.before-claim")
            resetter.join(30)
        finally:
            failpoints.disarm()
        [result] = done
        assert result.row is not None and result.row.commit_seq == slot + 1
        assert {tp: start for tp, (start, _) in _moves(result).items()} == {**cut, **ended}
        assert run_chtxn("resume", "--config", config).returncode == 0
        total = first + more + sum(ended[tp] if tp in ended else cut[tp] for tp in pipeline.partitions)
        wait_until(lambda: pipeline.target_count() == total, 90, "every record committed again from the start")
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    assert sum(c.replayed for c in report.partitions) == total - first - more
    assert int(pipeline.client().command(_count_twice(pipeline))) == total - first - more


def _moves(done: ResetDone) -> dict[TopicPartition, tuple[int, int]]:
    return {
        TopicPartition(topic=name.rpartition("/")[0], partition=int(name.rpartition("/")[2])): move
        for name, move in done.moves.items()
    }


def _count_twice(pipeline) -> str:
    db, table = pipeline.cfg.clickhouse.database, pipeline.cfg.clickhouse.target_table
    return (
        f"SELECT count() FROM (SELECT _partition, _offset, count() AS n FROM `{db}`.`{table}` "
        "GROUP BY _partition, _offset HAVING n = 2)"
    )
