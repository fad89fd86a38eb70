"""The local cache's index (no I/O) and its directory's checks at start."""

from __future__ import annotations

import json
import os

import pytest

from rapidmount.shared.checksums import crc32c_of, file_crc32c
from rapidmount.localcache.directory import CacheDirectory, CacheDirError
from rapidmount.localcache.index import Entry, EntryKey, Index, IndexFormatError


def entry(name: str, size: int, generation: int = 1) -> Entry:
    return Entry(EntryKey("b", name, generation), size, 0, (1, 2, 3))


def test_reserving_evicts_the_least_recently_used_until_the_fill_fits():
    index = Index(100)
    for name in "abc":
        assert index.reserve(30) == []
        index.add(entry(name, 30), reserved=30)
    index.touch(index.get("b", "a"))  # a is the most recently used now
    evicted = index.reserve(50)
    assert [e.key.name for e in evicted or []] == ["b", "c"]
    assert (index.used, index.reserved) == (30, 50)
    index.release(50)
    assert index.reserved == 0


def test_a_fill_that_never_fits_evicts_nothing():
    index = Index(100)
    index.add(entry("a", 60))
    assert index.reserve(101) is None
    assert index.reserve(30) == []  # 60 + 30 fit
    assert index.reserve(80) is None, "the fill under way holds the rest: nothing is evicted for nothing"
    assert index.get("b", "a") is not None and index.reserved == 30


def test_one_entry_per_name_the_new_generation_replaces_the_old():
    index = Index(100)
    index.add(entry("a", 10, generation=1))
    old = index.add(entry("a", 20, generation=2))
    assert old is not None and old.key.generation == 1
    assert len(index) == 1 and index.used == 20


def test_the_index_round_trips_in_its_order_of_use():
    index = Index(1000)
    for name in "xyz":
        index.add(entry(name, 10))
    index.touch(index.get("b", "x"))
    again = Index(1000)
    again.load(json.loads(json.dumps(index.to_json())))
    assert [e.key.name for e in again] == ["y", "z", "x"]
    assert all(not e.verified for e in again), "a loaded entry is checked before it is served"
    assert again.over_budget() == []
    smaller = Index(15)
    smaller.load(index.to_json())
    assert [e.key.name for e in smaller.over_budget()] == ["y", "z"]


@pytest.mark.parametrize("document", [
    [], {"version": 99, "entries": []}, {"version": 1}, {"version": 1, "entries": [1]},
    {"version": 1, "entries": [{"bucket": "b"}]},
    {"version": 1, "entries": [{"bucket": "b", "name": "n", "generation": 1, "size": -1, "crc32c": 0,
                                "signature": [1, 2, 3]}]},
    {"version": 1, "entries": [{"bucket": "b", "name": "n", "generation": 1, "size": 1, "crc32c": 1 << 32,
                                "signature": [1, 2, 3]}]},
])
def test_a_malformed_index_is_refused(document):
    with pytest.raises(IndexFormatError):
        Index(10).load(document)


def test_file_names_hide_object_names():
    key = EntryKey("bucket", "secret/path name.bin", 7)
    assert "secret" not in key.file_name and len(key.file_name) == 64
    assert key.file_name != EntryKey("bucket", "secret/path name.bin", 8).file_name


def test_a_directory_with_an_unreadable_index_starts_empty_and_clears_strays(tmp_path):
    root = tmp_path / "c"
    directory = CacheDirectory(root, 1 << 20)
    directory.open()
    directory.close()
    (root / "index.json").write_text("{not json")
    (root / "objects" / "stray").write_bytes(b"x")
    (root / "partial" / "half").write_bytes(b"x")
    again = CacheDirectory(root, 1 << 20)
    again.open()
    assert len(again.index) == 0
    assert not list((root / "objects").iterdir()) and not list((root / "partial").iterdir())
    assert root.stat().st_mode & 0o777 == 0o700


def test_a_directory_of_another_user_is_refused(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    os.chown(root, 12345, 12345)
    with pytest.raises(CacheDirError, match="belongs to uid 12345"):
        CacheDirectory(root, 1 << 20).open()


def test_the_check_reads_the_whole_file(tmp_path):
    path = tmp_path / "f"
    data = os.urandom(3 * (8 << 20) + 5)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert file_crc32c(fd, len(data)) == crc32c_of(data)
        assert file_crc32c(fd, len(data) + 1) is None
    finally:
        os.close(fd)
