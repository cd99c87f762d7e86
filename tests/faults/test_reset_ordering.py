"""An offset reset is ordered against resumes and commits by the commit slot it claims.

``chtxn reset`` held at ``reset.before-claim`` (after it read the head, the pause and the log) while
the pipeline changes under it: a resume and a commit of new records, or the paused leader's last
txn committing records past the reset's look-up. Either way the reset must not move a partition
back over records committed after it looked: it is refused (the pipeline runs again) or it moves
from where the chain is when its claim lands, to offsets looked up after that. Each ends with the
oracle and ``chtxn verify --deep``."""

from __future__ import annotations

import json
import threading

from cli import build_parser, reset as reset_cmd
from clients import failpoints
from coordinator.ledger import pauses
from coordinator.ledger.store import LedgerStore
from protocol.ledger.resets import is_reset
from tests.helpers import last_txn, run_chtxn, unique_name, wait_until
from tests.integration.scripted_participants import ScriptedParticipants
from tests.integration.test_coordinator_publish import ServiceThread
from tests.pipelines import make_pipeline


class HeldReset:
    """``chtxn reset ARGS`` on a thread of this process, held at ``reset.before-claim`` until ``release``."""

    def __init__(self, config: str, *args: str) -> None:
        self.gate = failpoints.arm("reset.before-claim", "pause*1", who="ops")
        self.args = build_parser().parse_args(["reset", "--config", config, "--by", "ops", "--json", *args])
        self.outcome: list[object] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.outcome.append(reset_cmd.run(self.args))
        except Exception as exc:  # the refusal is the outcome under test
            self.outcome.append(exc)

    def start_and_hold(self) -> None:
        self.thread.start()
        assert self.gate.reached.wait(60), "the reset never reached its claim"

    def release(self) -> object:
        failpoints.release("reset.before-claim")
        self.thread.join(60)
        assert not self.thread.is_alive(), "the reset did not finish"
        [outcome] = self.outcome
        return outcome


def _committed(pipeline) -> dict:
    ends: dict = {}
    for commit in pipeline.ledger().commits():
        for r in commit.ranges:
            ends[r.tp] = r.end
    return ends


def _oracle_and_verify(pipeline) -> None:
    report = pipeline.oracle()
    assert report.ok, report.anomalies
    verified = run_chtxn("verify", "--config", str(pipeline.config_path), "--deep", "--json")
    assert verified.returncode == 0 and json.loads(verified.stdout)["ok"], verified.stdout


def test_a_reset_held_across_a_resume_and_a_commit_is_refused(stack, tmp_path):
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetresume"))
    config = str(pipeline.config_path)
    first = pipeline.produce(100)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        ledger = pipeline.ledger()
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        assert run_chtxn("pause", "--config", config).returncode == 0
        wait_until(lambda: last_txn(ledger).state == "PUBLISHED", 30, "the open txn done")
        skipped = pipeline.produce(50, start_id=first)  # what --to-latest would skip, were it still paused
        held = HeldReset(config, "--all-partitions", "--to-latest")
        try:
            held.start_and_hold()
            assert run_chtxn("resume", "--config", config).returncode == 0
            more = pipeline.produce(60, start_id=first + skipped)
            total = first + skipped + more
            wait_until(lambda: pipeline.target_count() == total, 60, "the resumed pipeline committed everything")
            before = _committed(pipeline)
        finally:
            outcome = held.release()
        assert isinstance(outcome, Exception), f"a reset held across a resume still took effect: {outcome}"
        assert "is not paused" in str(outcome), outcome
        assert not [c for c in ledger.commits() if is_reset(c)], "a refused reset is in the ledger"
        assert _committed(pipeline) == before
        extra = pipeline.produce(20, start_id=total)
        wait_until(lambda: pipeline.target_count() == total + extra, 60, "the pipeline still flowing")
    _oracle_and_verify(pipeline)
    assert sum(c.replayed for c in pipeline.oracle().partitions) == 0


def test_a_paused_leaders_last_txn_past_the_resets_look_up_is_never_moved_back(stack, tmp_path):
    """The pause reached the ledger, not yet the leader (its message is late): the leader's open txn
    reads records produced after the reset looked up the log end, and commits them while the reset
    is held. The reset then moves nothing back over them."""
    pipeline = make_pipeline(stack, tmp_path, unique_name("resetlookup"))
    config = str(pipeline.config_path)
    first = pipeline.produce(100)
    with ScriptedParticipants(pipeline.cfg, pipeline.partitions), ServiceThread(pipeline.cfg, "c1"):
        ledger = pipeline.ledger()
        wait_until(lambda: pipeline.target_count() == first, 60, "the first records committed")
        commit = failpoints.arm("leader.before-commit", "pause*1", who="c1")
        waiting = pipeline.produce(40, start_id=first)  # in the log, not committed: the reset would skip them
        held = HeldReset(config, "--all-partitions", "--to-latest")
        try:
            assert commit.reached.wait(60), "no commit reached the failpoint"
            record_pause_without_telling_the_leader(pipeline)
            held.start_and_hold()
            more = waiting + pipeline.produce(60, start_id=first + waiting)
            failpoints.release("leader.before-commit")
            wait_until(lambda: pipeline.target_count() == first + more, 60, "the leader's last txns committed")
            assert run_chtxn("pause", "--config", config).returncode == 0  # the leader hears of it now
            before = _committed(pipeline)
        finally:
            outcome = held.release()
        assert outcome == 0, outcome
        for reset in [c for c in ledger.commits() if is_reset(c)]:
            backward = [r for r in reset.ranges if r.end < r.start]
            assert not backward, f"the reset moved committed records back: {reset.ranges}"
        after = _committed(pipeline)
        assert all(after[tp] >= end for tp, end in before.items()), (before, after)
        assert run_chtxn("resume", "--config", config).returncode == 0
        extra = pipeline.produce(20, start_id=first + more)
        wait_until(lambda: pipeline.target_count() == first + more + extra, 60, "the pipeline flowing again")
    _oracle_and_verify(pipeline)
    assert sum(c.replayed for c in pipeline.oracle().partitions) == 0


def record_pause_without_telling_the_leader(pipeline) -> None:
    """The pause as ``chtxn pause`` records it in the ledger, with its control message not sent."""
    ledger = LedgerStore.of(pipeline.cfg, pipeline.client())
    pauses.record(ledger, paused=True, who="ops", reason="the message is late")
