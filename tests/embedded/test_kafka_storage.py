"""The embedded broker's S3 folder (``embedded.kafka_storage``) answers a listing from its index
(``embedded.bucket_index``) exactly as LocalBucket's walk of the whole bucket does, and a write is
in every listing made after its writer was answered."""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

import localbucket
import pytest

from embedded import kafka_storage
from embedded.bucket_index import BucketIndex

RECORDS = "clusters/c/topics/{topic}/partitions/{partition:010d}/records/"
NS = {"s3": localbucket.S3_NAMESPACE}


def batch(topic: str, partition: int, index: int) -> str:
    return RECORDS.format(topic=topic, partition=partition) + f"{index * 3:020d}.batch"


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[str, str, Path]]:
    """Ours and LocalBucket's own, over one folder: two topics' batches, a watermark beside each
    partition's records, a temporary file and a key that needs escaping."""
    root = tmp_path_factory.mktemp("s3")
    bucket = root / kafka_storage.BUCKET
    for topic, partition, batches in (("orders", 0, 7), ("orders", 1, 3), ("orders.chtxn-control", 0, 40)):
        records = bucket / RECORDS.format(topic=topic, partition=partition)
        records.mkdir(parents=True)
        for index in range(batches):
            (bucket / batch(topic, partition, index)).write_bytes(b"x" * (index + 1))
        (records.parent / "watermark.json").write_text("{}")
    (bucket / RECORDS.format(topic="orders", partition=0) / ".localbucket-tmp").write_bytes(b"half written")
    (bucket / "clusters/c/a&b<c>.json").write_text("{}")
    ours = kafka_storage.serve(root)
    plain = ThreadingHTTPServer(("127.0.0.1", 0), type("Plain", (localbucket.S3Handler,), {"data_root": root}))
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{ours.server_port}", f"http://127.0.0.1:{plain.server_port}", bucket
    ours.shutdown()
    plain.shutdown()


def request(url: str, method: str = "GET", body: bytes | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=10) as answer:
        return answer.read()


def listing(server: str, **query: str) -> ET.Element:
    return ET.fromstring(request(f"{server}/{kafka_storage.BUCKET}?" + urlencode({"list-type": "2", **query})))


def pages(server: str, prefix: str, max_keys: int) -> Iterator[ET.Element]:
    """Every page of a listing, following continuation tokens as Tansu's S3 client does."""
    query = {"prefix": prefix, "max-keys": str(max_keys)}
    while True:
        page = listing(server, **query)
        yield page
        token = page.findtext("s3:NextContinuationToken", namespaces=NS)
        if token is None:
            return
        query["continuation-token"] = token


def shape(page: ET.Element) -> list[tuple[str, str]]:
    return [(element.tag, (element.text or "").strip()) for element in page.iter()]


def keys(page: ET.Element) -> list[str]:
    return [key.text or "" for key in page.iterfind("s3:Contents/s3:Key", NS)]


PREFIXES = [
    RECORDS.format(topic="orders", partition=0),
    RECORDS.format(topic="orders", partition=1),
    RECORDS.format(topic="orders.chtxn-control", partition=0),
    RECORDS.format(topic="orders", partition=0)[:-1],  # no trailing slash: "records" and beyond
    "clusters/c/topics/orders",  # both "orders/" and "orders.chtxn-control/"
    "clusters/c/topics/",
    "clusters/c/a",
    "clusters/",
    "",
    "clusters/c/topics/missing/partitions/",
]


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("max_keys", [0, 1, 6, 1000])
def test_every_page_is_the_one_localbucket_answers(servers, prefix: str, max_keys: int) -> None:
    ours, plain, _ = servers
    assert [shape(p) for p in pages(ours, prefix, max_keys)] == [shape(p) for p in pages(plain, prefix, max_keys)]


def test_pages_of_a_partition_chain_to_every_batch_in_order(servers) -> None:
    ours, _, _ = servers
    prefix = RECORDS.format(topic="orders.chtxn-control", partition=0)
    listed = [key for page in pages(ours, prefix, 7) for key in keys(page)]
    assert listed == [batch("orders.chtxn-control", 0, i) for i in range(40)]


def test_a_write_is_in_every_listing_after_its_writer_is_answered(servers) -> None:
    ours, _, _ = servers
    prefix = RECORDS.format(topic="orders", partition=1)
    url = f"{ours}/{kafka_storage.BUCKET}/{batch('orders', 1, 3)}"
    assert keys(listing(ours, prefix=prefix)) == [batch("orders", 1, i) for i in range(3)]  # now indexed
    request(url, "PUT", b"new batch")
    assert keys(listing(ours, prefix=prefix)) == [batch("orders", 1, i) for i in range(4)]
    request(url, "PUT", b"a longer batch")  # overwritten: the entry's size follows
    assert listing(ours, prefix=prefix).findall("s3:Contents/s3:Size", NS)[-1].text == "14"
    request(url, "DELETE")
    assert keys(listing(ours, prefix=prefix)) == [batch("orders", 1, i) for i in range(3)]


def test_a_listing_reads_only_the_folder_its_prefix_names(servers, monkeypatch) -> None:
    _, _, bucket = servers
    walked: list[Path] = []
    walk = os.walk
    monkeypatch.setattr("embedded.bucket_index.os.walk", lambda top: walked.append(Path(top)) or walk(top))
    prefix = RECORDS.format(topic="orders", partition=1)
    page = BucketIndex().page(bucket, prefix.rstrip("/"), prefix, "", 1000)
    assert [key for key, _ in page.entries] == [batch("orders", 1, i) for i in range(3)]
    assert walked == [bucket / prefix.rstrip("/")]


def test_a_token_of_another_server_is_refused_as_localbucket_refuses_it(servers) -> None:
    ours, plain, _ = servers
    answers = []
    for server in (ours, plain):
        with pytest.raises(urllib.error.HTTPError) as refused:
            listing(server, prefix=PREFIXES[0], **{"continuation-token": "bm9wZQ=="})
        answers.append((refused.value.code, b"InvalidArgument" in refused.value.read()))
    assert answers[0] == answers[1] == (400, True)
