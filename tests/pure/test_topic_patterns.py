"""``pipeline.topics`` entries ``re:<regex>``: what they match, and the config errors they get."""

from __future__ import annotations

import pytest

from protocol import topic_patterns
from tests.pure.test_config import BASE, error_of


def test_a_pattern_matches_whole_names_and_never_an_internal_topic() -> None:
    existing = ["orders-eu-1", "orders-eu-2", "orders-us-1", "xorders-eu-3", "__consumer_offsets", "orders-eu"]
    specs = ["payments", "re:orders-eu-.*"]
    assert topic_patterns.matching(specs, existing) == ["orders-eu-1", "orders-eu-2", "payments"]
    assert topic_patterns.matching(["re:.*"], existing, exclude=["orders-eu"]) == [
        "orders-eu-1",
        "orders-eu-2",
        "orders-us-1",
        "xorders-eu-3",
    ]
    assert topic_patterns.names(specs) == ["payments"]


@pytest.mark.parametrize(
    ("topics", "why"),
    [
        ('["re:orders-(eu"]', "not a regular expression after re: (missing ), unterminated subpattern"),
        ('["re:orders.*"]', "matches orders.chtxn-control, the pipeline's own control or dead-letter topic"),
        ('["bad topic!"]', "not a valid Kafka topic name (or re:<regex> for every topic it matches)"),
    ],
)
def test_a_bad_topic_entry_is_refused_naming_it(topics: str, why: str) -> None:
    err = error_of(BASE.replace('topics = ["src-a", "src-b"]', f"topics = {topics}"))
    assert err.key == "pipeline.topics" and why in str(err), str(err)


def test_a_pattern_that_leaves_the_pipelines_own_topics_alone_is_accepted() -> None:
    from protocol.config.parse import parse_config

    cfg = parse_config(BASE.replace('topics = ["src-a", "src-b"]', 'topics = ["src-a", "re:src-[0-9]+"]'), {})
    assert cfg.pipeline.topics == ("src-a", "re:src-[0-9]+")
