"""The verdicts of ``chtxn doctor``: from what was found (``protocol.doctor.facts``) and the pipeline's
config, one ``Check`` per question, saying whether exactly-once holds there and what to change. Pure.

Versions (ClickHouse's changelogs, ``docs/changelogs/`` of ClickHouse/ClickHouse):
``insert_deduplication_token`` came in 22.2 (#32304), on which every chunk, ledger row and
``insert-select`` publish rests; ``keeper_map_strict_mode`` in 23.4 (#48293), on which the keeper
commit point rests. A server that lacks a setting chtxn sends refuses the request, so the settings
are checked by name as well.
"""

from __future__ import annotations

from protocol import chcodes, naming, topic_patterns
from protocol.checks import Check
from protocol.config.parse import PipelineConfig
from protocol.doctor.facts import ClickHouseFacts, KafkaFacts, KeeperProbe, merge_tree, version_tuple
from protocol.doctor.tables import (
    ledger_window_check,
    macros_check,
    metadata_check,
    on_cluster,
    publish_check,
    replication_check,
    stage_window_check,
    target_check,
    target_window_check,
    views_check,
)
from protocol.ledger import claims as ledger_claims

#: The oldest ClickHouse chtxn works with, and the oldest for ``ledger.commit_point = "keeper"``.
TOKEN_VERSION = (22, 2)
KEEPER_VERSION = (23, 4)


def evaluate(cfg: PipelineConfig, ch: ClickHouseFacts, kafka: KafkaFacts) -> list[Check]:
    """Every check, in the order the report shows them."""
    return [*clickhouse_checks(cfg, ch), *kafka_checks(cfg, kafka)]


def failed(checks: list[Check]) -> list[Check]:
    return [c for c in checks if c.status == "fail"]


def clickhouse_checks(cfg: PipelineConfig, ch: ClickHouseFacts) -> list[Check]:
    if ch.error:
        fix = (
            chcodes.CREDENTIALS_FIX if ch.error_code in chcodes.CREDENTIALS else "start the server or fix [clickhouse]"
        )
        return [Check(name="clickhouse", status="fail", found=ch.error, fix=fix)]
    checks = [version_check(cfg, ch), target_check(cfg, ch)]
    target = ch.target
    usable = target is not None and merge_tree(target.engine)
    if usable:
        checks += [replication_check(cfg, ch), macros_check(cfg, ch)]
    checks.append(ledger_window_check(ch))
    if usable:
        checks += [stage_window_check(cfg, ch), target_window_check(cfg, ch), publish_check(cfg, ch)]
    checks += [commit_point_check(cfg, ch), keeper_check(cfg, ch.keeper), quorum_check(cfg, ch), async_insert_check(ch)]
    if usable:
        checks += [views_check(cfg, ch), metadata_check(cfg, ch)]
    return checks


def version_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    keeper = cfg.ledger.commit_point == "keeper"
    needed = KEEPER_VERSION if keeper else TOKEN_VERSION
    wanted = "22.2+" + ("; 23.4+ for ledger.commit_point = keeper" if keeper else "")
    sends = ["insert_deduplication_token", *(ledger_claims.CLAIM_SETTINGS if keeper else ())]
    unknown = [s for s in sends if s not in ch.settings]
    found = f"ClickHouse {ch.version} (chtxn needs {wanted})"
    have = version_tuple(ch.version)
    if have is not None and have < needed:
        why = "insert_deduplication_token" if needed == TOKEN_VERSION else "keeper_map_strict_mode"
        fix = f"upgrade ClickHouse to {needed[0]}.{needed[1]} or later, the first with {why}"
        return Check(name="server version", status="fail", found=found, fix=fix)
    if unknown:
        found += f"; the server knows no setting {', '.join(unknown)}, which chtxn sends"
        return Check(name="server version", status="fail", found=found, fix="upgrade ClickHouse")
    if have is None:
        return Check(name="server version", status="warn", found=found, fix="check that this is ClickHouse")
    return Check(name="server version", status="ok", found=found)


def commit_point_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    if cfg.ledger.commit_point == "keeper":
        found = f"keeper: a strict-mode KeeperMap insert per slot under {cfg.keeper_path} (no window)"
        return Check(name="commit point", status="ok", found=found)
    if on_cluster(cfg, ch):
        return Check(
            name="commit point",
            status="fail",
            found="token on a replicated ClickHouse: a slot is claimed by deduplication, which a replicated table "
            "keeps for a bounded number of blocks and seconds, so a leader stalled past them can claim a slot twice",
            fix='set ledger.commit_point = "keeper" (a strict-mode KeeperMap insert per slot: no window)',
        )
    return Check(name="commit point", status="ok", found="token: the ledger's deduplication, on one server")


def keeper_check(cfg: PipelineConfig, probe: KeeperProbe | None) -> Check:
    needed = cfg.ledger.commit_point == "keeper"
    if probe is None:
        return Check(name="keeper", status="ok", found="not probed: ledger.commit_point = token")
    at = f"KeeperMap probe at {probe.path}"
    if probe.outcome == "ok":
        found = f"{at}: a strict insert took a key, a second was refused, the key read back ({probe.seconds:.1f} s)"
        if probe.leftover:
            return Check(name="keeper", status="warn", found=found, fix=f"DROP TABLE {probe.leftover} SYNC by hand")
        return Check(name="keeper", status="ok", found=found)
    instead = '; or set ledger.commit_point = "token" (one server only)' if needed else ""
    fixes = {
        "disabled": "configure <zookeeper> (or <keeper>) and <keeper_map_path_prefix> in the server config" + instead,
        "unreachable": "start Keeper (or ZooKeeper), or fix <zookeeper> in the server config: no commit while it is down",
        "not-strict": f"upgrade ClickHouse to {KEEPER_VERSION[0]}.{KEEPER_VERSION[1]}+ (keeper_map_strict_mode)",
        "failed": "check the user's grants (CREATE TABLE, INSERT, DROP TABLE) and the server log",
    }
    outcomes = {
        "disabled": "the server has no KeeperMap",
        "unreachable": "Keeper did not answer",
        "not-strict": "a second strict-mode insert of one key was taken",
        "failed": "failed",
    }
    found = f"{at}: {outcomes[probe.outcome]} after {probe.seconds:.1f} s" + (
        f": {probe.detail}" if probe.detail else ""
    )
    return Check(name="keeper", status="fail" if needed else "warn", found=found, fix=fixes[probe.outcome])


def quorum_check(cfg: PipelineConfig, ch: ClickHouseFacts) -> Check:
    profile = ", ".join(
        f"{s} = {ch.settings[s].value}" for s in ("insert_quorum", "select_sequential_consistency") if s in ch.settings
    )
    found = f"profile: {profile or 'neither setting known'}"
    if cfg.clickhouse.cluster:
        found += "; chtxn: insert_quorum = 'auto' on ledger inserts, select_sequential_consistency = 1 on ledger reads"
        return Check(name="quorum", status="ok", found=found)
    if on_cluster(cfg, ch):
        found += "; chtxn sets neither: clickhouse.cluster is not set, so its own tables are not replicated"
        return Check(name="quorum", status="warn", found=found, fix="set clickhouse.cluster to the target's cluster")
    return Check(name="quorum", status="ok", found=found + "; not needed on one server")


def async_insert_check(ch: ClickHouseFacts) -> Check:
    setting = ch.settings.get("async_insert")
    if setting is None:
        return Check(name="async_insert", status="ok", found="the server has no async inserts")
    found = f"profile: async_insert = {setting.value}; chtxn sends async_insert = 0 with every request"
    if setting.readonly and setting.value != "0":
        fix = "the profile forbids changing it: set async_insert = 0 in the user's profile or lift the constraint"
        return Check(name="async_insert", status="fail", found=found, fix=fix)
    return Check(name="async_insert", status="ok", found=found)


def kafka_checks(cfg: PipelineConfig, kafka: KafkaFacts) -> list[Check]:
    if kafka.error:
        return [Check(name="kafka broker", status="fail", found=kafka.error, fix="start the broker or fix [kafka]")]
    return [control_topic_check(cfg, kafka), source_topics_check(cfg, kafka), transactions_check(cfg, kafka)]


def control_topic_check(cfg: PipelineConfig, kafka: KafkaFacts) -> Check:
    topic = cfg.control_topic
    if topic not in kafka.topics:
        found = f"{topic} does not exist yet"
        return Check(name="control topic", status="warn", found=found, fix="run chtxn init: it creates it")
    found = f"{topic}: {kafka.topics[topic]} partition(s)"
    if kafka.control_problem:
        return Check(name="control topic", status="fail", found=found, fix=kafka.control_problem)
    return Check(name="control topic", status="ok", found=found)


def source_topics_check(cfg: PipelineConfig, kafka: KafkaFacts) -> Check:
    topics = topic_patterns.matching(cfg.source_topics, kafka.topics)
    missing = [t for t in topics if t not in kafka.topics]
    found = ", ".join(f"{t} ({kafka.topics[t]} partitions)" for t in topics if t in kafka.topics)
    if missing:
        return Check(
            name="source topics",
            status="fail",
            found=f"missing: {', '.join(missing)}" + (f"; found {found}" if found else ""),
            fix=f"create them (e.g. kafka-topics.sh --create --topic {missing[0]} --partitions N) or fix pipeline.topics",
        )
    return Check(name="source topics", status="ok", found=found)


def transactions_check(cfg: PipelineConfig, kafka: KafkaFacts) -> Check:
    dlq = cfg.dead_letter_topic
    if kafka.transactions is None:
        return Check(name="dead-letter transactions", status="warn", found="not probed", fix="run chtxn doctor again")
    if kafka.transactions:
        return Check(
            name="dead-letter transactions",
            status="fail",
            found=f"a transactional producer failed: {kafka.transactions}",
            fix="dead letters are published in Kafka transactions: use a broker with transactions (Kafka 0.11+) and "
            f"grant WRITE on transactional id {naming.dead_letter_transactional_id(cfg.name)} and READ on group "
            f"{naming.dead_letter_marker_group(cfg.name)}",
        )
    found = f"init_transactions answered ({kafka.transactions_s:.1f} s)"
    if dlq not in kafka.topics:
        return Check(
            name="dead-letter transactions",
            status="warn",
            found=f"{found}; {dlq} does not exist yet",
            fix="run chtxn init: it creates it",
        )
    return Check(name="dead-letter transactions", status="ok", found=f"{found}, with an offset commit on {dlq}")
