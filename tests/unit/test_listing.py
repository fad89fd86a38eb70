"""Key-range splitting, work stealing and tree regrouping (sans-I/O)."""

from __future__ import annotations

import bisect

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from rapidmount.listing.ranges import RangePlan, choose_boundaries, midpoint, prefix_end
from rapidmount.listing.tree import TreeListing
from rapidmount.storage.model import DirectoryMeta, FolderMeta, ObjectMeta, directory_meta
from rapidmount.superblock.metadata_cache import MetadataCache
from rapidmount.superblock.names import (
    REASON_DOT, REASON_EMPTY, HiddenNames, entries_from_listing, split_object_name)
from tests.clock import FakeClock

# Small alphabets make collisions, shared prefixes and adjacent keys likely.
key_text = st.text(alphabet="ab/\x00z\u00e9\U0010ffff", min_size=0, max_size=6)


class FakeServer:
    """Sorted keys; a page is what ListObjects without delimiter returns."""

    def __init__(self, keys: list[str], root: str) -> None:
        self.keys = sorted(k for k in set(keys) if k.startswith(root))

    def between(self, low: str, high: str | None) -> list[str]:
        return [k for k in self.keys if low <= k and (high is None or k < high)]

    def page(self, start: str, end: str | None, size: int) -> tuple[list[str], bool]:
        first = bisect.bisect_left(self.keys, start)
        last = len(self.keys) if end is None else bisect.bisect_left(self.keys, end)
        taken = self.keys[first:min(last, first + size)]
        return taken, first + size < last


def run_plan(data, keys: list[str], root: str) -> tuple[RangePlan, list[str], list[str]]:
    """Drive a plan with workers acting in an order hypothesis picks."""
    server = FakeServer(keys, root)
    boundaries = data.draw(st.lists(key_text.map(lambda k: root + k), max_size=6), label="boundaries")
    plan = RangePlan(root, None, boundaries)
    workers = data.draw(st.integers(1, 5), label="workers")
    page_size = data.draw(st.integers(1, 4), label="page size")
    state: list[list] = [[None, None] for _ in range(workers)]  # [range, in-flight bounds]
    listed: list[str] = []
    for _ in range(20_000):
        if plan.finished:
            break
        worker = state[data.draw(st.integers(0, workers - 1), label="worker")]
        key_range, in_flight = worker
        if key_range is None or key_range.done and in_flight is None:
            worker[0] = plan.assign()
            if worker[0] is None and all(w[0] is None or w[0].done for w in state):
                pytest.fail("idle workers, unfinished plan, and nothing to assign")
        elif in_flight is None:
            worker[1] = plan.request(key_range)
            if worker[1] is None:
                worker[0] = None
        else:
            keys_page, truncated = server.page(*in_flight, page_size)
            listed.extend(plan.page_done(key_range, keys_page, truncated))
            worker[1] = None
            # A covered interval is really listed: it is what installs a directory early.
            low = root + data.draw(key_text, label="low")
            high = data.draw(st.one_of(st.none(), key_text.map(lambda k: low + k)), label="high")
            if plan.covers(low, high):
                assert set(server.between(low, high)) <= set(listed)
    assert plan.finished, "the plan did not finish"
    assert plan.steals <= workers * sum(r.pages for r in plan.ranges)  # splitting is bounded by pages
    return plan, listed, server.keys


@settings(max_examples=300, deadline=None)
@given(data=st.data(), keys=st.lists(key_text, max_size=40), root=st.sampled_from(["", "a/", "z"]))
def test_every_key_listed_exactly_once(data, keys, root):
    plan, listed, expected = run_plan(data, [root + k for k in keys] + keys, root)
    assert sorted(listed) == expected
    assert len(listed) == len(set(listed))
    # The ranges still partition [root, unbounded): no gap, no overlap.
    ranges = sorted(plan.ranges, key=lambda r: r.start)
    assert ranges[0].start == root
    for left, right in zip(ranges, ranges[1:]):
        assert left.end == right.start
    assert ranges[-1].end is None


@settings(max_examples=500, deadline=None)
@given(low=key_text, high=st.one_of(st.none(), key_text), alphabet=st.sets(st.sampled_from("ab/z0\u00e9")))
def test_midpoint_is_strictly_between(low, high, alphabet):
    split = midpoint(low, high, sorted(alphabet))
    if split is not None:
        assert low < split
        assert high is None or split < high


def test_midpoint_splits_where_keys_are():
    alphabet = sorted(set("0123456789/abcdefghijklmnopqrstuvwxyz"))
    split = midpoint("dir042/file0500", "dir060/", alphabet)
    assert "dir042/file0500" < split < "dir060/"
    assert split.startswith("dir05")
    assert midpoint("a", "a\x00") is None
    assert midpoint("b", "a") is None


def test_stealing_splits_a_busy_range():
    plan = RangePlan("p/")
    first = plan.assign()
    assert plan.request(first) == ("p/", None)
    plan.page_done(first, ["p/dir001/a", "p/dir002/a"], truncated=True)
    stolen = plan.assign()
    assert stolen is not None and plan.steals == 1
    assert first.end == stolen.start and "p/dir002/a" < stolen.start
    # A page in flight before the steal: keys past the new end are the thief's.
    owned = plan.page_done(first, ["p/dir003/a", stolen.start + "x"], truncated=True)
    assert owned == ["p/dir003/a"] and first.done


def test_covers_and_prefix_end():
    assert prefix_end("a/") == "a0" and prefix_end("") is None and prefix_end("\U0010ffff") is None
    assert prefix_end("a\U0010ffff") == "b"
    plan = RangePlan("", None, ["m"])
    low_half, high_half = plan.assign(), plan.assign()
    plan.page_done(low_half, ["a/1", "a/2", "b/1"], truncated=True)
    assert plan.covers("a/", prefix_end("a/")) and not plan.covers("b/", prefix_end("b/"))
    assert not plan.covers("", None)
    plan.page_done(low_half, ["c"], truncated=False)
    assert plan.covers("b/", prefix_end("b/")) and not plan.covers("", None)
    plan.page_done(high_half, [], truncated=False)
    assert plan.covers("", None)


def test_choose_boundaries_spreads_evenly():
    sample = [f"d{index:03d}/" for index in range(100)]
    chosen = choose_boundaries(sample, 10)
    assert len(chosen) == 10 and chosen == sorted(chosen)
    assert chosen[0] == "d009/" and chosen[-1] == "d090/"  # 11 parts of about 9 keys
    assert choose_boundaries(sample[:3], 10) == sample[:3]
    assert choose_boundaries([], 4) == []


def _meta(name: str) -> ObjectMeta:
    return ObjectMeta(name, 1, 1, len(name), 0, 0, True)


def _folders(*names: str) -> list[FolderMeta]:
    return [FolderMeta(name, 1, 0, 0) for name in names]


def _delimited(names: list[str], prefix: str) -> tuple[list[str], list[str]]:
    """What ListObjects(prefix, delimiter="/", include_trailing_delimiter)
    returns: (objects, prefixes)."""
    objects, prefixes = [], set()
    for name in names:
        if not name.startswith(prefix):
            continue
        cut = name.find("/", len(prefix))
        if cut >= 0:
            prefixes.add(name[:cut + 1])
            if cut == len(name) - 1:
                objects.append(name)  # a subdirectory's placeholder
        else:
            objects.append(name)
    return objects, sorted(prefixes)


@settings(max_examples=300, deadline=None)
@given(names=st.lists(st.text(alphabet="ab/.", min_size=1, max_size=7), max_size=25, unique=True),
       root=st.sampled_from(["", "a/"]))
def test_tree_listing_matches_per_directory_listings(names, root):
    tree = TreeListing(root)
    tree.add_objects(_meta(name) for name in names)
    for prefix in tree.directories():
        # Only directories a walk of the mount can reach: no hidden segment on the way.
        assert prefix == root or split_object_name(prefix[len(root):]) is not None, prefix
        objects, prefixes = _delimited(names, prefix)
        expected = entries_from_listing(prefix, ((n, _meta(n)) for n in objects), prefixes, HiddenNames(),
                                        directory_record=lambda child, record: directory_meta(child, None, record))
        got = tree.listing(prefix, HiddenNames(), is_symlink=lambda meta: False)
        assert got[0] == expected[0], prefix
        assert sorted(got[1]) == sorted(expected[1]), prefix
    # Every directory a listing mentions has its own listing.
    for prefix in tree.directories():
        for entry in tree.listing(prefix, HiddenNames(), is_symlink=lambda meta: False)[0]:
            if entry.object is None or isinstance(entry.object, DirectoryMeta):
                assert f"{prefix}{entry.name}/" in tree.directories()


def test_tree_listing_keeps_nothing_below_a_hidden_segment():
    """Directories below a segment that cannot be a name are never listed nor
    logged: their parent's listing hides the prefix, once."""
    tree = TreeListing("")
    tree.add_objects(_meta(name) for name in ["a/../../etc/passwd", "a/../x", "a/ok", "b//c/d", "x/./y/z"])
    tree.add_folders(_folders("a/../", "a/../../", "b//c/"))
    assert tree.directories() == ["", "a/", "b/", "x/"]
    assert tree.objects == 5
    hidden = HiddenNames()
    logged = [pair for prefix in tree.directories()
              for pair in tree.take(prefix, hidden, is_symlink=lambda meta: False)[1]]
    assert sorted(logged) == [("a/../", REASON_DOT), ("b//", REASON_EMPTY), ("x/./", REASON_DOT)]
    assert tree.estimated_bytes == 0


def test_tree_listing_folders_make_empty_directories():
    tree = TreeListing("")
    tree.add_objects([_meta("a/b/c")])
    tree.add_folders(_folders("a/", "a/b/", "a/empty/", "x/y/"))
    assert tree.directories() == ["", "a/", "x/", "a/b/", "a/empty/", "x/y/"]
    names = [e.name for e in tree.listing("a/", HiddenNames(), is_symlink=lambda m: False)[0]]
    assert names == ["b", "empty"]


def test_listing_times_run_from_when_it_was_listed():
    clock = FakeClock(100.0)
    cache = MetadataCache(ttl=10, negative_ttl=10, listing_ttl=10, clock=clock)
    entries, _ = entries_from_listing("d/", [("d/f", _meta("d/f"))], [], HiddenNames())
    cache.put_listing("d/", entries, listed_at=95.0)
    assert cache.get_listing("d/") is not None and isinstance(cache.get("d/f"), ObjectMeta)
    assert cache.lookup_in_listing("d/", "missing") is not None  # a negative answer, from the listing
    clock.advance(5.0)
    assert cache.get_listing("d/") is None and cache.get("d/f") is None
    assert cache.lookup_in_listing("d/", "missing") is None  # expired: no negative answer any more
    cache.put_listing("d/", entries, listed_at=80.0)  # already expired when it arrives
    assert cache.get_listing("d/") is None
    assert cache.room_for(cache.listing_bytes("d/", entries))
