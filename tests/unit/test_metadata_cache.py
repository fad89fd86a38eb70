"""Unit tests for the metadata and dirent cache (rapidmount.superblock.metadata_cache)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.storage.model import ObjectMeta
from rapidmount.superblock.metadata_cache import (
    ABSENT,
    DIR_MARKER,
    KERNEL_FOREVER,
    DirMarker,
    MetadataCache,
)
from rapidmount.superblock.names import EntryKind, HiddenNames, ListedEntry, entries_from_listing
from tests.clock import FakeClock


def meta(name: str, generation: int = 1, size: int = 10) -> ObjectMeta:
    return ObjectMeta(name, generation, 1, size, 0, 0, True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cache(clock: FakeClock, **kw) -> MetadataCache:
    return MetadataCache(clock=clock, **kw)


def test_object_meta_is_immutable_and_hashable() -> None:
    raw = {"k": "v"}
    m = ObjectMeta("a", 1, 1, 0, 0, 0, True, metadata=raw)
    raw["k"] = "changed"
    assert m.metadata == {"k": "v"}
    with pytest.raises(TypeError):
        m.metadata["k"] = "x"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.size = 5  # type: ignore[misc]
    assert hash(m) == hash(ObjectMeta("a", 1, 1, 0, 0, 0, True, metadata={"k": "v"}))
    assert meta("a").metadata == {} and DirMarker() is DIR_MARKER


def test_put_get_object_dir_and_absent(clock: FakeClock) -> None:
    c = cache(clock)
    c.put_object(meta("a/b"))
    c.put_dir("a/")
    c.put_absent("a/c")
    assert c.get("a/b") == meta("a/b")
    assert c.get("a/") is DIR_MARKER
    assert c.get("a/c") is ABSENT
    assert c.get("a/b/") is None  # a file and a directory are different keys
    assert (c.stats.hits, c.stats.misses) == (3, 1)
    with pytest.raises(ValueError):
        c.put_dir("a")


def test_ttl_expiry(clock: FakeClock) -> None:
    c = cache(clock, ttl=60, negative_ttl=5)
    c.put_object(meta("f"))
    c.put_absent("g")
    clock.now += 4.9
    assert c.get("f") is not None and c.get("g") is ABSENT
    clock.now += 0.1
    assert c.get("g") is None  # negative entries expire first
    clock.now += 54.9
    assert c.get("f") is not None
    clock.now += 0.1
    assert c.get("f") is None
    assert len(c) == 0 and c.bytes_in_use == 0  # expired entries are freed when seen


def test_ttl_forever_and_zero(clock: FakeClock) -> None:
    forever = cache(clock, ttl=-1, negative_ttl=-1)
    forever.put_object(meta("f"))
    forever.put_absent("g")
    clock.now += 10 * 365 * 86400
    assert forever.get("f") is not None and forever.get("g") is ABSENT
    assert forever.entry_timeout() == forever.attr_timeout() == KERNEL_FOREVER
    assert forever.negative_timeout() == KERNEL_FOREVER

    off = cache(clock, ttl=0, negative_ttl=0)
    off.put_object(meta("f"))
    off.put_absent("g")
    assert off.get("f") is None and off.get("g") is None and len(off) == 0
    assert off.entry_timeout() == 0 and off.negative_timeout() == 0


def test_kernel_timeouts_follow_flags(clock: FakeClock) -> None:
    c = cache(clock, ttl=30, negative_ttl=2)
    assert (c.entry_timeout(), c.attr_timeout(), c.negative_timeout()) == (30, 30, 2)


def test_put_replaces_negative_entry(clock: FakeClock) -> None:
    c = cache(clock)
    c.put_absent("f")
    c.put_object(meta("f"))
    assert c.get("f") == meta("f")
    c.put_absent("f")
    assert c.get("f") is ABSENT and len(c) == 1


def test_budget_is_enforced_with_lru_eviction(clock: FakeClock) -> None:
    one = 200 + 2 * len("f0")  # the documented estimate
    c = cache(clock, budget_bytes=3 * one)
    for i in range(3):
        c.put_object(meta(f"f{i}"))
    c.get("f0")  # f1 becomes least recently used
    c.put_object(meta("f3"))
    assert c.get("f1") is None
    assert all(c.get(f"f{i}") is not None for i in (0, 2, 3))
    assert c.stats.evictions == 1 and c.bytes_in_use == 3 * one


def test_entry_larger_than_budget_is_not_cached(clock: FakeClock) -> None:
    c = cache(clock, budget_bytes=300)
    c.put_object(meta("f"))
    c.put_object(meta("x" * 100))
    assert c.get("x" * 100) is None and c.get("f") is not None


def test_listing_and_lookup(clock: FakeClock) -> None:
    c = cache(clock, ttl=60, listing_ttl=10)
    entries = [ListedEntry("a", EntryKind.FILE, meta("d/a")), ListedEntry("s", EntryKind.DIR, None)]
    assert c.get_listing("d/") is None and c.lookup_in_listing("d/", "a") is None
    c.put_listing("d/", entries)
    assert c.get_listing("d/") == entries
    assert c.lookup_in_listing("d/", "a") == entries[0]
    assert c.lookup_in_listing("d/", "nope") is ABSENT
    # Per-entry metadata came along, so getattr after readdir needs no RPC.
    assert c.get("d/a") == meta("d/a") and c.get("d/s/") is DIR_MARKER
    clock.now += 10
    assert c.get_listing("d/") is None and c.lookup_in_listing("d/", "a") is None
    assert c.get("d/a") is not None  # stat entries keep their own TTL


def test_invalidate_below_forgets_a_whole_subtree_and_nothing_beside_it(clock: FakeClock) -> None:
    c = cache(clock, ttl=60, listing_ttl=60)
    c.put_listing("d/", [ListedEntry("a", EntryKind.FILE, meta("d/a")), ListedEntry("s", EntryKind.DIR, None)])
    c.put_listing("d/s/", [ListedEntry("b", EntryKind.FILE, meta("d/s/b"))])
    c.put_absent("d/s/gone")
    c.put_listing("", [ListedEntry("d", EntryKind.DIR, None), ListedEntry("dd", EntryKind.DIR, None)])
    c.put_object(meta("dd/x"))
    used = c.bytes_in_use
    c.invalidate_below("d/")
    for key in ("d/", "d/a", "d/s/", "d/s/b", "d/s/gone"):
        assert c.get(key) is None, key
    assert c.get_listing("d/") is None and c.get_listing("d/s/") is None
    assert c.get_listing("") is None, "the parent's listing named it"
    assert c.get("dd/x") == meta("dd/x") and c.get("dd/") is DIR_MARKER, "a sibling sharing the first letter"
    assert 0 < c.bytes_in_use < used
    with pytest.raises(ValueError):
        c.invalidate_below("d")


def test_a_listings_silence_is_trusted_for_the_negative_ttl_only(clock: FakeClock) -> None:
    """Names the listing holds keep its TTL; a name it lacks is a negative
    answer only while one would be (another client may have made it since)."""
    c = cache(clock, ttl=60, listing_ttl=60, negative_ttl=5)
    c.put_listing("d/", [ListedEntry("a", EntryKind.FILE, meta("d/a"))])
    assert c.lookup_in_listing("d/", "new") is ABSENT
    assert c.absent_for("d/", "new") == 5 and c.absent_for("d/", "a") == 0
    clock.now += 4
    assert c.lookup_in_listing("d/", "new") is ABSENT and c.absent_for("d/", "new") == 1
    clock.now += 1
    assert c.lookup_in_listing("d/", "new") is None  # ask the bucket
    assert c.absent_for("d/", "new") == 0
    assert c.lookup_in_listing("d/", "a") == ListedEntry("a", EntryKind.FILE, meta("d/a"))
    assert c.get_listing("d/") is not None  # readdir still answers from it
    # The bucket said no: that answer holds for a negative TTL of its own.
    c.put_absent("d/new")
    c.put_absent("d/new/")
    assert c.absent_for("d/", "new") == 5


def test_a_listings_silence_ends_with_the_listing(clock: FakeClock) -> None:
    c = cache(clock, ttl=3, negative_ttl=30)
    c.put_listing("d/", [])
    assert c.absent_for("d/", "x") == 3
    clock.now += 3
    assert c.lookup_in_listing("d/", "x") is None and c.absent_for("d/", "x") == 0


def test_a_listings_silence_with_negative_ttl_zero_and_forever(clock: FakeClock) -> None:
    c = cache(clock, ttl=60, negative_ttl=0)
    c.put_listing("d/", [])
    assert c.lookup_in_listing("d/", "x") is None and c.absent_for("d/", "x") == 0
    c = cache(clock, ttl=-1, negative_ttl=-1)
    c.put_listing("d/", [], listed_at=clock.now - 1000)
    clock.now += 50
    assert c.lookup_in_listing("d/", "x") is ABSENT and c.absent_for("d/", "x") == KERNEL_FOREVER


def test_listing_ttl_defaults_to_stat_ttl(clock: FakeClock) -> None:
    c = cache(clock, ttl=20)
    c.put_listing("", [])
    clock.now += 19
    assert c.get_listing("") == []
    clock.now += 1
    assert c.get_listing("") is None


def test_new_listing_drops_stats_of_deleted_names(clock: FakeClock) -> None:
    c = cache(clock)
    c.put_listing("d/", [ListedEntry("a", EntryKind.FILE, meta("d/a")), ListedEntry("s", EntryKind.DIR, None)])
    c.put_listing("d/", [])
    assert c.get("d/a") is None and c.get("d/s/") is None


def test_listing_showing_a_file_drops_a_cached_directory_of_that_name(clock: FakeClock) -> None:
    c = cache(clock)
    c.put_dir("d/x/")
    c.put_listing("d/", [ListedEntry("x", EntryKind.FILE, meta("d/x"))])
    assert c.get("d/x/") is None and c.get("d/x") == meta("d/x")


def test_invalidate_drops_entry_and_parent_listing(clock: FakeClock) -> None:
    c = cache(clock)
    c.put_listing("d/", [ListedEntry("a", EntryKind.FILE, meta("d/a"))])
    c.put_listing("d/sub/", [])
    c.put_listing("e/", [])
    c.invalidate("d/a")
    assert c.get("d/a") is None and c.get_listing("d/") is None
    assert c.get_listing("d/sub/") == [] and c.get_listing("e/") == []
    c.invalidate("d/sub/")  # a directory: its own listing goes too
    assert c.get_listing("d/sub/") is None and c.get_listing("e/") == []
    c.invalidate_listing("e/")
    assert c.get_listing("e/") is None
    c.clear()
    assert len(c) == 0 and c.bytes_in_use == 0


def test_warm_ls_of_10000_objects_needs_no_rpc(clock: FakeClock) -> None:
    """A readdir + lookup + getattr of every entry, served from the cache."""
    c = MetadataCache(clock=clock)  # default 64 MiB budget
    objects = [(f"big/file{i:05d}", meta(f"big/file{i:05d}", size=i)) for i in range(10_000)]
    entries, hidden = entries_from_listing("big/", objects, ["big/sub/"], HiddenNames())
    assert hidden == []
    c.put_listing("big/", entries)
    misses = c.stats.misses
    listed = c.get_listing("big/")
    assert listed is not None and len(listed) == 10_001
    for entry in listed:
        found = c.lookup_in_listing("big/", entry.name)
        assert found is entry
        path = f"big/{entry.name}/" if entry.kind is EntryKind.DIR else f"big/{entry.name}"
        assert c.get(path) is not None
    assert c.stats.misses == misses and c.stats.evictions == 0
    assert c.bytes_in_use <= c.budget_bytes


@settings(max_examples=150, deadline=None)
@given(
    budget=st.integers(1, 3000),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["obj", "dir", "absent", "listing", "get", "invalidate", "tick"]),
            st.integers(0, 12),
        ),
        max_size=60,
    ),
)
def test_budget_never_exceeded(budget: int, ops) -> None:
    clock = FakeClock()
    c = MetadataCache(ttl=10, negative_ttl=3, listing_ttl=5, budget_bytes=budget, clock=clock)
    for op, n in ops:
        name = f"p{n}"
        if op == "obj":
            c.put_object(meta(name))
        elif op == "dir":
            c.put_dir(name + "/")
        elif op == "absent":
            c.put_absent(name)
        elif op == "listing":
            c.put_listing(name + "/", [ListedEntry(f"e{i}", EntryKind.FILE, meta(f"{name}/e{i}")) for i in range(n)])
        elif op == "get":
            c.get(name)
        elif op == "invalidate":
            c.invalidate(name)
        else:
            clock.now += n
        assert 0 <= c.bytes_in_use <= budget
        assert c.bytes_in_use == sum(size for _, _, size in c._entries.values())
