"""The listings of the embedded broker's S3 folder, from memory (``embedded.kafka_storage``).

Tansu lists every batch of a partition on each fetch that has something to read, so a listing's
cost is paid by every consumer for every record. LocalBucket walks the whole bucket, builds a
``Path`` and an XML element per object and serialises them; at a thousand batches that is 40 ms a
page. ``BucketIndex`` keeps each listed folder's objects sorted, each with its ``<Contents>``
element already written, so a page is two bisections and a join.

Coherence: every write goes through this process. A write drops the index of each folder above
the object after the file is in place, before the writer is answered, and bumps that folder's
generation; an index built from a scan that a write overtook is not kept (its generation moved).
"""

from __future__ import annotations

import bisect
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import localbucket


@dataclass(frozen=True)
class Page:
    """One page of a listing: ``(key, <Contents> element)`` pairs, and whether more follow."""

    entries: list[tuple[str, str]]
    truncated: bool


@dataclass
class _Folder:
    """A folder's objects: their keys' bytes (sorted, for bisection) and their listing entries."""

    key_prefix: str
    keys: list[bytes]
    entries: list[tuple[str, str]]

    def put(self, path: Path) -> None:
        """``path``, an object right in this folder, was written (or deleted): its entry follows."""
        key = self.key_prefix + path.name
        at = bisect.bisect_left(self.keys, key.encode())
        present = at < len(self.keys) and self.keys[at] == key.encode()
        try:
            entry = (key, _contents(key, str(path)))
        except FileNotFoundError:
            if present:
                del self.keys[at], self.entries[at]
            return
        if present:
            self.entries[at] = entry
        else:
            self.keys.insert(at, key.encode())
            self.entries.insert(at, entry)


class BucketIndex:
    """Sorted objects of each folder listed so far, under one bucket directory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._folders: dict[Path, _Folder] = {}
        self._generations: dict[Path, int] = {}

    def page(self, bucket_dir: Path, folder: str, prefix: str, after: str, max_keys: int) -> Page:
        """Objects under ``bucket_dir/folder`` whose key starts with ``prefix`` and sorts after
        ``after``, at most ``max_keys``; ``prefix`` starts with ``folder + "/"``."""
        index = self._folder(bucket_dir / folder, folder + "/")
        with self._lock:  # a write updates the folder in place
            keys, entries = index.keys, index.entries
            start = max(bisect.bisect_left(keys, prefix.encode()), bisect.bisect_right(keys, after.encode()))
            chosen: list[tuple[str, str]] = []
            for i in range(start, len(keys)):
                if not entries[i][0].startswith(prefix):
                    return Page(chosen, truncated=False)
                if len(chosen) == max_keys:
                    return Page(chosen, truncated=max_keys > 0)
                chosen.append(entries[i])
        return Page(chosen, truncated=False)

    def written(self, path: Path) -> None:
        """``path`` was written or deleted: its own folder's index takes it in; the index of each
        folder further up is forgotten (rarely listed: rebuilt when it is)."""
        with self._lock:
            for folder in path.parents:
                self._generations[folder] = self._generations.get(folder, 0) + 1
                index = self._folders.get(folder)
                if index is None:
                    continue
                if folder == path.parent and not path.name.startswith(localbucket.TEMP_PREFIX):
                    index.put(path)
                else:
                    del self._folders[folder]

    def _folder(self, directory: Path, key_prefix: str) -> _Folder:
        with self._lock:
            known = self._folders.get(directory)
            generation = self._generations.get(directory, 0)
        if known is not None:
            return known
        entries = []
        for key, path in _scan(directory, key_prefix):
            try:
                entries.append((key, _contents(key, path)))
            except FileNotFoundError:
                continue  # deleted while scanned: that write's generation keeps this index out
        built = _Folder(key_prefix, [key.encode() for key, _ in entries], entries)
        with self._lock:
            if self._generations.get(directory, 0) == generation:  # no write overtook the scan
                self._folders[directory] = built
        return built


def _scan(directory: Path, key_prefix: str) -> list[tuple[str, str]]:
    """``(key, path)`` of every object below ``directory``; LocalBucket's temporary files are not objects."""
    found = []
    for parent, _, files in os.walk(directory):
        relative = os.path.relpath(parent, directory)
        base = key_prefix if relative == "." else f"{key_prefix}{relative.replace(os.sep, '/')}/"
        found += [
            (base + name, os.path.join(parent, name)) for name in files if not name.startswith(localbucket.TEMP_PREFIX)
        ]
    found.sort(key=lambda item: item[0].encode())  # S3 orders keys by their UTF-8 bytes
    return found


def _contents(key: str, path: str) -> str:
    stat = os.stat(path)
    return (
        f"<Contents><Key>{escape(key)}</Key><LastModified>{localbucket.iso_timestamp(stat.st_mtime)}</LastModified>"
        f'<ETag>"{localbucket.object_etag(Path(path))}"</ETag><Size>{stat.st_size}</Size>'
        "<StorageClass>STANDARD</StorageClass></Contents>"
    )
