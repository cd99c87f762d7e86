"""``[[route]]`` tables: the config's routes, its errors naming the topic, and which table a topic goes to."""

from __future__ import annotations

import pytest

from protocol import routing
from protocol.config.parse import parse_config
from protocol.errors import SetupError
from tests.pure.test_config import BASE, error_of

ROUTED = """
[pipeline]
name = "shop"

[[route]]
topics = ["orders", "re:orders-eu-.*"]
table = "orders"

[[route]]
topics = ["clicks"]
table = "clicks"
"""


def test_the_one_table_form_is_one_route() -> None:
    cfg = parse_config(BASE, {})
    assert [(r.topics, r.table) for r in cfg.routes] == [(("src-a", "src-b"), "events")]
    assert cfg.source_topics == ("src-a", "src-b") and cfg.tables == ("events",)


def test_routes_give_the_topics_and_tables_of_the_pipeline() -> None:
    cfg = parse_config(ROUTED, {})
    assert cfg.source_topics == ("orders", "re:orders-eu-.*", "clicks")
    assert cfg.tables == ("orders", "clicks")
    assert routing.table_map(["orders-eu-1", "clicks", "orders", "other"], cfg.routes) == {
        "orders-eu-1": "orders",
        "clicks": "clicks",
        "orders": "orders",
    }


@pytest.mark.parametrize(
    ("text", "key", "why"),
    [
        (ROUTED + '[clickhouse]\ntarget_table = "x"\n', "clickhouse.target_table", "set either [[route]] tables"),
        (ROUTED + '[[route]]\ntopics = ["clicks"]\ntable = "more"\n', "route", "goes to more than one table"),
        (ROUTED + '[[route]]\ntopics = ["orders-eu-9"]\ntable = "eu"\n', "route", "(orders, eu)"),
        (ROUTED + '[[route]]\ntopics = []\ntable = "eu"\n', "route[2].topics", "list at least one source topic"),
        (ROUTED + '[[route]]\ntopics = ["x"]\ntable = "bad-name"\n', "route[2].table", "a plain table name"),
    ],
)
def test_a_bad_route_is_refused_naming_it(text: str, key: str, why: str) -> None:
    err = error_of(text)
    assert err.key == key and why in str(err), str(err)


def test_a_topic_two_tables_patterns_match_is_refused_when_the_partitions_are_listed() -> None:
    cfg = parse_config(ROUTED + '[[route]]\ntopics = ["re:.*-eu-.*"]\ntable = "eu"\n', {})
    with pytest.raises(SetupError, match="topic orders-eu-1 matches the routes of 2 tables \\(orders, eu\\)"):
        routing.table_map(["orders-eu-1"], cfg.routes)


def test_route_holds_a_topic_two_tables_patterns_match_apart_and_routes_the_others() -> None:
    """Issue 35 item 10: the leader's listing takes ``route``, which never raises, so one ambiguous topic
    is held on its own while the others are routed."""
    cfg = parse_config(ROUTED + '[[route]]\ntopics = ["re:.*-eu-.*"]\ntable = "eu"\n', {})
    routed = routing.route(["orders-eu-1", "clicks", "other", "clicks-eu-2"], cfg.routes)
    assert routed.tables == {"clicks": "clicks", "clicks-eu-2": "eu"}
    assert routed.ambiguous == {"orders-eu-1": ("orders", "eu")}
    assert routing.ambiguity("orders-eu-1", ("orders", "eu")) == (
        "topic orders-eu-1 matches the routes of 2 tables (orders, eu): narrow the route patterns so that each "
        "topic goes to one table"
    )


def test_a_route_publishes_its_table_its_own_way_and_routes_of_one_table_must_agree() -> None:
    cfg = parse_config(ROUTED.replace('table = "clicks"', 'table = "clicks"\npublish_mode = "insert-select"'), {})
    assert (cfg.publish_mode_of("orders"), cfg.publish_mode_of("clicks")) == ("move", "insert-select")
    assert cfg.for_table("clicks").transaction.publish_mode == "insert-select"
    err = error_of(
        ROUTED + '[[route]]\ntopics = ["orders-us"]\ntable = "orders"\npublish_mode = "insert-select"\n'
        '[[route]]\ntopics = ["orders-ca"]\ntable = "orders"\npublish_mode = "move"\n'
    )
    assert err.key == "route" and "different publish_mode values (insert-select, move)" in str(err), str(err)
