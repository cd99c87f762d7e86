"""A pipeline whose processes reach a server through a ``TcpProxy``, while the test reads it directly."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import msgspec

from tests.faults.tcp_proxy import TcpProxy
from tests.pipelines import Pipeline


@dataclass(frozen=True)
class Addresses:
    """What ``make_pipeline`` reads from a stack: where the pipeline's processes connect."""

    kafka_bootstrap: str
    clickhouse_url: str


def via(url: str, proxy: TcpProxy) -> str:
    """``url`` with its host and port replaced by the proxy's (credentials kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{proxy.address}" if userinfo else proxy.address
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def direct(pipeline: Pipeline, clickhouse_url: str) -> Pipeline:
    """The same pipeline, read through a ClickHouse client that bypasses the proxy."""
    ch = msgspec.structs.replace(pipeline.cfg.clickhouse, url=clickhouse_url)
    return Pipeline(msgspec.structs.replace(pipeline.cfg, clickhouse=ch), pipeline.config_path, pipeline.partitions)
