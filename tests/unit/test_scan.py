"""The open-order predictor, driven without FUSE or gRPC."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.scanahead.planner import ScanPlanner, ScanStreams, ScanTracker


def test_tracker_runs_ahead_after_two_in_order_opens():
    tracker = ScanTracker(depth=4, slack=0)
    assert tracker.observe(0) == range(0)
    assert tracker.observe(1) == range(0)  # score 1
    assert tracker.observe(2) == range(3, 7)
    # Already planned up to 7: the next open tops the window up by one.
    assert tracker.observe(3) == range(7, 8)


def test_a_scan_of_large_files_starts_a_few_ahead_and_goes_one_file_at_a_time():
    """With a batch of 1 (files whose prefetch is a whole block) the trusted
    scan plans 4 ahead, then 2 at each open (one for the step, one more of
    reach) until ``depth``, then 1: no burst of a quarter of the depth."""
    tracker = ScanTracker(depth=8, slack=0)
    assert tracker.observe(0, 1) == range(0)
    assert tracker.observe(1, 1) == range(0)
    assert tracker.observe(2, 1) == range(3, 7)
    assert [len(tracker.observe(p, 1)) for p in range(3, 12)] == [2, 2, 2, 2, 1, 1, 1, 1, 1]
    assert tracker.ahead == 12 + 8


def test_tracker_tolerates_interleaved_readers():
    tracker = ScanTracker(depth=8, slack=4)
    planned: set[int] = set()
    # Four workers taking every fourth file, their opens racing each other.
    order = [1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10]
    for position in order:
        planned.update(tracker.observe(position))
    assert set(range(12, 19)) <= planned


def test_random_opens_never_trigger():
    rng = random.Random(7)
    tracker = ScanTracker(depth=16, slack=4)
    fired = sum(len(tracker.observe(rng.randrange(100_000))) for _ in range(2000))
    assert fired == 0


def test_a_jump_resets_the_scan():
    tracker = ScanTracker(depth=2, slack=0)
    for position in range(3):
        tracker.observe(position)
    assert tracker.observe(500) == range(0)
    assert tracker.observe(501) == range(0)
    assert tracker.observe(502) == range(503, 505)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        ScanTracker(depth=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=200), max_size=300), st.integers(1, 16), st.integers(0, 8))
def test_tracker_never_plans_a_position_twice_within_one_scan(positions, depth, slack):
    tracker = ScanTracker(depth=depth, slack=slack)
    seen: set[int] = set()
    for position in positions:
        planned = tracker.observe(position)
        if tracker.score == 0:
            seen.clear()  # a new scan may plan old positions again
        assert len(planned) <= depth
        assert all(p > tracker.frontier - 1 or p >= tracker.frontier for p in planned)
        assert not seen & set(planned)
        seen.update(planned)


def test_planner_follows_listing_order():
    listing = [f"img{i:04d}.jpg" for i in range(100)]
    planner = ScanPlanner(depth=5, slack=2)
    assert planner.opened("train/", listing[0], listing) == []
    assert planner.opened("train/", listing[1], listing) == []
    assert planner.opened("train/", listing[2], listing) == []  # a new scan is trusted after three opens
    assert planner.opened("train/", listing[3], listing) == [f"train/{n}" for n in listing[4:9]]
    # The end of the listing bounds the plan.
    planner = ScanPlanner(depth=10, slack=2)
    for name in listing[95:]:
        planned = planner.opened("train/", name, listing)
    assert all(path.startswith("train/img009") for path in planned)


def test_planner_never_plans_the_file_being_opened_or_unknown_names():
    listing = ["a", "b", "c"]
    planner = ScanPlanner(depth=5)
    for name in listing:
        assert name not in [p.rsplit("/", 1)[-1] for p in planner.opened("d/", name, listing)
                            if p == "d/" + name]
    assert planner.opened("d/", "not-listed", listing) == []


def test_planner_replays_an_earlier_order_without_a_listing():
    rng = random.Random(3)
    files = [f"shard-{i}/sample-{rng.randrange(10**6)}" for i in range(200)]
    rng.shuffle(files)
    planner = ScanPlanner(depth=8, slack=2)
    for path in files:  # first pass: nothing known yet
        directory, name = path.rsplit("/", 1)
        assert planner.opened(directory + "/", name, None) == []
    planned: list[str] = []
    for path in files[:20]:  # second pass, same order
        directory, name = path.rsplit("/", 1)
        planned += planner.opened(directory + "/", name, None)
    assert files[20] in planned and files[25] in planned
    assert set(planned) <= set(files)


def test_planner_memory_is_bounded():
    planner = ScanPlanner(depth=4, directories=3, history=50)
    for d in range(20):
        listing = [f"f{i}" for i in range(10)]
        for name in listing:
            planner.opened(f"dir{d}/", name, listing)
    assert len(planner._directories) == 3
    assert len(planner._history) <= 50 and len(planner._position_of) <= 50


def test_a_new_listing_restarts_the_directory_tracker():
    planner = ScanPlanner(depth=3, slack=0)
    first = ["a", "b", "c", "d", "e", "f"]
    for name in first[:3]:
        planner.opened("x/", name, first)
    second = ["a", "b", "c", "c2", "d", "e", "f"]
    assert planner.opened("x/", "c2", second) == []


def test_loader_workers_each_scanning_their_batches_are_followed_separately():
    # Four workers, batches of 32 consecutive files, worker k on batches k, k+4, ...
    streams = ScanStreams(depth=32, slack=4, streams=8)
    planned: set[int] = set()
    opened: list[int] = []
    for round_ in range(3):
        for step in range(32):
            for worker in range(4):
                position = (round_ * 4 + worker) * 32 + step
                opened.append(position)
                planned.update(streams.observe(position))
    # Past the first four opens of each batch, every file was planned before its open.
    late = [p for p in opened if p % 32 >= 4 and p not in planned]
    assert not late, late[:10]


def test_random_opens_over_many_scans_waste_little():
    rng = random.Random(1)
    streams = ScanStreams(depth=32, slack=16, streams=16)
    wasted = sum(len(streams.observe(rng.randrange(10_000))) for _ in range(5000))
    assert wasted <= 5000 * 0.03  # a rare chance run, at most a few percent of the opens


@pytest.mark.trio
async def test_first_blocks_of_large_files_go_in_small_batches_few_at_once_nearest_first():
    """A batch lands whole: the first blocks of 32 shards in one batch kept the
    next shard's open waiting for all 64 MiB. So batches hold at most
    BATCH_BYTES (two 2 MiB first blocks), at most CALLS_AT_ONCE go at once,
    in the order planned; 64 small files still go in one batch."""
    import trio.testing

    from rapidmount.cache import PageCache
    from rapidmount.core.settings import CoreSettings
    from rapidmount.readahead.fetcher import BlockFetcher
    from rapidmount.scanahead import files
    from rapidmount.storage.model import ObjectMeta
    from rapidmount.superblock.metadata_cache import MetadataCache

    MiB = 1 << 20

    class Layout:
        compose = False

    class Store:
        layout = Layout()

        def __init__(self) -> None:
            self.batches: list[list[str]] = []
            self.running = self.most = 0
            self.release = trio.Event()

        async def read_objects_whole(self, items, *, concurrency):
            self.batches.append([name for name, _, _ in items])
            self.running += 1
            self.most = max(self.most, self.running)
            await self.release.wait()
            self.running -= 1
            return [b"x" * length for _, _, length in items]

    class Stats:
        scan_prefetches = scan_hits = blocks_fetched = bytes_fetched = 0

    async def no_listing(directory: str) -> list:
        return []

    meta, store = MetadataCache(), Store()
    large = [f"d/shard-{i:03d}" for i in range(32)]
    small = [f"s/sample-{i:03d}" for i in range(64)]
    for path, size in [(p, 16 * MiB) for p in large] + [(p, 64 * 1024) for p in small]:
        meta.put_object(ObjectMeta(path, 1, 1, size, 0, 0, True))
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(PageCache(512 * MiB, 2 * MiB), nursery)
        scan = files.ScanAhead(CoreSettings(), store, meta, Stats(), fetcher, nursery, no_listing)
        scan._fetch_files(large)
        await trio.testing.wait_all_tasks_blocked()
        assert store.batches == [large[0:2], large[2:4]] and store.most == files.CALLS_AT_ONCE
        store.release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert store.batches == [large[i:i + 2] for i in range(0, 32, 2)], "in order, nearest first"
        assert store.most == files.CALLS_AT_ONCE
        store.batches.clear()
        scan._fetch_files(small)
        await trio.testing.wait_all_tasks_blocked()
        assert store.batches == [small]
