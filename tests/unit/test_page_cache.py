"""Unit tests for the budgeted block cache (rapidmount.cache.page_cache)."""

from __future__ import annotations

import pytest
import trio
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rapidmount.cache import BlockKey, PageCache

BS = 100


def k(block: int, obj: int = 1, gen: int = 1) -> BlockKey:
    return BlockKey(obj, gen, block)


def put(cache: PageCache, key: BlockKey, size: int = BS, *, prefetched: bool = False) -> bytes:
    """Reserve then insert, as the trio layer does."""
    data = bytes([key.block_index % 256]) * size
    assert cache.try_reserve(size)
    cache.insert(key, data, reserved=size, prefetched=prefetched)
    return data


def test_miss_then_hit_counts_and_returns_data() -> None:
    cache = PageCache(10 * BS, BS)
    assert cache.get(k(0)) is None
    data = put(cache, k(0))
    assert cache.get(k(0)) is data
    assert (cache.stats.hits, cache.stats.misses, cache.stats.inserted) == (1, 1, 1)
    assert cache.bytes_cached == BS and cache.bytes_reserved == 0


def test_peek_changes_neither_stats_nor_lru_order() -> None:
    cache = PageCache(2 * BS, BS)
    put(cache, k(0))
    put(cache, k(1))
    assert cache.peek(k(0)) and not cache.peek(k(9))
    assert (cache.stats.hits, cache.stats.misses) == (0, 0)
    put(cache, k(2))  # k(0) is still least recently used despite the peek
    assert not cache.peek(k(0)) and cache.peek(k(1))


def test_get_refreshes_lru_position() -> None:
    cache = PageCache(2 * BS, BS)
    put(cache, k(0))
    put(cache, k(1))
    cache.get(k(0))
    put(cache, k(2))
    assert cache.peek(k(0)) and not cache.peek(k(1)) and cache.peek(k(2))
    assert cache.stats.evictions == 1


def test_reserve_larger_than_budget_fails_without_evicting() -> None:
    cache = PageCache(3 * BS, BS)
    put(cache, k(0))
    assert not cache.try_reserve(3 * BS + 1)
    assert cache.peek(k(0)) and cache.bytes_reserved == 0 and cache.stats.evictions == 0


def test_reserve_fails_when_reservations_fill_the_budget() -> None:
    cache = PageCache(3 * BS, BS)
    assert cache.try_reserve(2 * BS)
    put(cache, k(0))
    assert not cache.try_reserve(2 * BS)  # evicting k(0) cannot make room
    assert cache.peek(k(0))
    cache.release(2 * BS)
    assert cache.try_reserve(2 * BS)
    assert cache.bytes_in_use == 3 * BS


def test_reserve_evicts_lru_to_fit() -> None:
    cache = PageCache(3 * BS, BS)
    for i in range(3):
        put(cache, k(i))
    assert cache.try_reserve(2 * BS)
    assert [cache.peek(k(i)) for i in range(3)] == [False, False, True]
    assert cache.bytes_in_use == 3 * BS


def test_insert_releases_unused_reservation() -> None:
    cache = PageCache(10 * BS, BS)
    assert cache.try_reserve(BS)
    cache.insert(k(0), b"x" * 40, reserved=BS)  # short last block of an object
    assert (cache.bytes_cached, cache.bytes_reserved) == (40, 0)


def test_insert_replaces_old_entry() -> None:
    cache = PageCache(10 * BS, BS)
    put(cache, k(0), 60)
    new = put(cache, k(0), 30)
    assert cache.get(k(0)) is new and cache.bytes_cached == 30 and len(cache) == 1


def test_insert_larger_than_reservation_evicts_or_refuses() -> None:
    cache = PageCache(2 * BS, BS)
    put(cache, k(0))
    assert cache.try_reserve(BS)
    assert cache.insert(k(1), b"x" * (2 * BS), reserved=BS)  # evicts k(0) for the excess
    assert not cache.peek(k(0)) and cache.bytes_in_use == 2 * BS
    assert cache.try_reserve(BS)
    assert not cache.insert(k(2), b"x" * (4 * BS), reserved=BS)  # can never fit
    assert not cache.peek(k(2)) and cache.bytes_reserved == 0


def test_memoryview_is_accounted_in_bytes() -> None:
    cache = PageCache(10 * BS, BS)
    view = memoryview(bytearray(64)).cast("I")  # 16 items, 64 bytes
    assert cache.try_reserve(64)
    cache.insert(k(0), view, reserved=64)
    assert cache.bytes_cached == 64


def test_unread_prefetch_is_evicted_before_read_blocks() -> None:
    cache = PageCache(3 * BS, BS)
    put(cache, k(0))  # demand-fetched: counts as read, and is the oldest
    put(cache, k(1), prefetched=True)
    put(cache, k(2), prefetched=True)
    put(cache, k(3))
    assert not cache.peek(k(1)) and cache.peek(k(0))
    assert cache.stats.evicted_unread == 1
    put(cache, k(4))
    assert not cache.peek(k(2)) and cache.peek(k(0))
    put(cache, k(5))  # no unread left: plain LRU among read blocks
    assert not cache.peek(k(0)) and cache.stats.evicted_unread == 2


def test_first_hit_promotes_prefetched_block() -> None:
    cache = PageCache(2 * BS, BS)
    put(cache, k(0), prefetched=True)
    put(cache, k(1))
    assert cache.bytes_unread == BS
    cache.get(k(0))
    cache.get(k(0))
    assert cache.stats.prefetch_hits == 1 and cache.stats.prefetch_inserted == 1
    assert cache.bytes_unread == 0
    put(cache, k(2))  # both read now: k(1) is the least recently used
    assert cache.peek(k(0)) and not cache.peek(k(1))
    assert cache.stats.evicted_unread == 0


def test_prefetch_reservation_never_evicts_unread_blocks() -> None:
    cache = PageCache(3 * BS, BS)
    put(cache, k(0))
    put(cache, k(1), prefetched=True)
    put(cache, k(2), prefetched=True)
    assert cache.try_reserve(BS, prefetch=True)  # evicts the read block k(0)
    assert not cache.peek(k(0)) and cache.peek(k(1)) and cache.peek(k(2))
    cache.insert(k(3), b"x" * BS, reserved=BS, prefetched=True)
    assert not cache.try_reserve(BS, prefetch=True)  # only unread left: back off
    assert len(cache) == 3
    assert cache.try_reserve(BS)  # a demand fetch may evict unread readahead
    assert not cache.peek(k(1))


def test_invalidate_object_keeps_requested_generation_only() -> None:
    cache = PageCache(10 * BS, BS)
    put(cache, k(0, gen=1))
    put(cache, k(1, gen=1), 50)
    put(cache, k(0, gen=2))
    put(cache, k(0, obj=7))
    assert cache.invalidate_object(1, keep_generation=2) == BS + 50
    assert cache.peek(k(0, gen=2)) and cache.peek(k(0, obj=7))
    assert not cache.peek(k(0, gen=1))
    assert cache.invalidate_object(1) == BS
    assert cache.invalidate_object(1) == 0
    assert cache.bytes_cached == BS and len(cache) == 1


def test_clear_keeps_reservations_of_in_flight_fetches() -> None:
    cache = PageCache(10 * BS, BS)
    put(cache, k(0))
    put(cache, k(1), prefetched=True)
    assert cache.try_reserve(BS)
    cache.clear()
    assert (len(cache), cache.bytes_cached, cache.bytes_unread, cache.bytes_reserved) == (0, 0, 0, BS)
    cache.insert(k(2), b"x" * BS, reserved=BS)
    assert cache.bytes_in_use == BS


def test_discard_frees_one_block() -> None:
    cache = PageCache(10 * BS, BS)
    put(cache, k(0), prefetched=True)
    assert cache.discard(k(0)) == BS and cache.discard(k(0)) == 0
    assert cache.bytes_unread == 0 and cache.bytes_cached == 0


@pytest.mark.parametrize(
    "op",
    [
        lambda c: c.release(1),
        lambda c: c.try_reserve(-1),
        lambda c: c.insert(k(0), b"x", reserved=1),
    ],
)
def test_accounting_misuse_is_rejected(op) -> None:
    cache = PageCache(10 * BS, BS)
    with pytest.raises(ValueError):
        op(cache)


class PageCacheMachine(RuleBasedStateMachine):
    """Random operation sequences: the budget is never exceeded and the
    byte counters always match what is actually cached."""

    @initialize(budget=st.integers(1, 8 * BS))
    def setup(self, budget: int) -> None:
        self.cache = PageCache(budget, BS)
        self.reservations: list[int] = []
        self.model: dict[BlockKey, bytes] = {}  # last data inserted per key

    keys = st.builds(BlockKey, st.integers(0, 2), st.integers(0, 2), st.integers(0, 5))

    @rule(nbytes=st.integers(0, 3 * BS), prefetch=st.booleans())
    def reserve(self, nbytes: int, prefetch: bool) -> None:
        before = self.cache.bytes_in_use
        if self.cache.try_reserve(nbytes, prefetch=prefetch):
            self.reservations.append(nbytes)
        else:
            assert self.cache.bytes_in_use <= before  # a refusal evicts nothing useful

    @precondition(lambda self: self.reservations)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.cache.release(self.reservations.pop(data.draw(st.integers(0, len(self.reservations) - 1))))

    @precondition(lambda self: self.reservations)
    @rule(key=keys, size=st.integers(0, 2 * BS), prefetched=st.booleans())
    def insert(self, key: BlockKey, size: int, prefetched: bool) -> None:
        payload = bytes([size % 256]) * size
        if self.cache.insert(key, payload, reserved=self.reservations.pop(), prefetched=prefetched):
            self.model[key] = payload
            assert self.cache.peek(key)
        else:
            assert not self.cache.peek(key)

    @rule(key=keys)
    def get(self, key: BlockKey) -> None:
        got = self.cache.get(key)
        assert got is None or got == self.model[key]

    @rule(obj=st.integers(0, 2), keep=st.none() | st.integers(0, 2))
    def invalidate(self, obj: int, keep: int | None) -> None:
        self.cache.invalidate_object(obj, keep_generation=keep)
        assert not any(
            self.cache.peek(key) for key in self.model if key.object_id == obj and key.generation != keep
        )

    @rule()
    def clear(self) -> None:
        self.cache.clear()

    @invariant()
    def within_budget_and_consistent(self) -> None:
        cache = self.cache
        assert cache.bytes_in_use <= cache.budget_bytes
        assert cache.bytes_reserved == sum(self.reservations)
        present = [key for key in self.model if cache.peek(key)]
        assert len(present) == len(cache)
        assert cache.bytes_cached == sum(len(self.model[key]) for key in present)
        assert 0 <= cache.bytes_unread <= cache.bytes_cached
        s = cache.stats
        assert s.prefetch_hits + s.evicted_unread <= s.prefetch_inserted


PageCacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_page_cache_state_machine = PageCacheMachine.TestCase


@pytest.mark.trio
async def test_a_fetch_cancelled_from_outside_tells_its_waiters_so():
    """The fetcher's nursery cancelled under a fetch (the mount stopping): a
    waiter gets FetchCancelled, or starts again, never a bare TypeError
    from raising a missing error."""
    import trio.testing

    from rapidmount.readahead.fetcher import BlockFetcher, FetchCancelled, FetchOwner

    cache = PageCache(4 * BS, BS)
    release = trio.Event()

    async def fetch() -> bytes:
        await release.wait()
        return b"x" * BS

    outcome = {}
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as fetches:
            fetcher = BlockFetcher(cache, fetches)
            slot = fetcher.start(("obj", 1, 0), fetch, BS, owner=FetchOwner(), prefetch=False)
            assert slot is not None
            await trio.testing.wait_all_tasks_blocked()
            fetches.cancel_scope.cancel()
        await slot.event.wait()
        outcome["error"] = slot.error
        outer.cancel_scope.cancel()
    assert isinstance(outcome["error"], FetchCancelled) and slot.data is None
    assert cache.stats.inserted == 0


@pytest.mark.trio
async def test_a_run_of_blocks_is_one_fetch_up_to_the_first_block_already_there():
    """start_run fetches consecutive blocks with one call: only those before
    the first one cached, in flight or past the budget; each lands as a
    block of its own, and a reader of any of them waits for that call."""
    import trio.testing

    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner

    cache = PageCache(6 * BS, BS)
    cache.try_reserve(BS, prefetch=False)
    cache.insert(BlockKey("obj", 1, 3), b"c" * BS, reserved=BS)
    calls: list[int] = []
    release = trio.Event()

    async def fetch(count: int) -> list[bytes]:
        calls.append(count)
        await release.wait()
        return [bytes([index]) * BS for index in range(count)]

    owner = FetchOwner()
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        run = [(BlockKey("obj", 1, block), BS, None) for block in range(5)]
        assert fetcher.start_run(run, fetch, owner=owner, prefetch=True) == 3  # block 3 is cached
        assert fetcher.start_run(run[1:], fetch, owner=owner, prefetch=True) == 0  # in flight
        assert cache.bytes_reserved == 3 * BS
        got = {}

        async def read(block: int) -> None:
            got[block] = await fetcher.get(BlockKey("obj", 1, block), lambda: fetch(1), BS, owner=owner)

        nursery.start_soon(read, 2)
        await trio.testing.wait_all_tasks_blocked()
        assert calls == [3] and not got  # the reader waits for the run's call
        release.set()
    assert got == {2: bytes([2]) * BS} and calls == [3]
    assert [cache.get(BlockKey("obj", 1, block)) for block in range(4)] == [b"\0" * BS, b"\1" * BS, b"\2" * BS, b"c" * BS]
    assert cache.bytes_reserved == 0


@pytest.mark.trio
async def test_a_run_that_fails_fails_every_block_and_frees_the_budget():
    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner

    cache = PageCache(4 * BS, BS)

    async def fetch(count: int) -> list[bytes]:
        raise OSError("the stream broke")

    owner = FetchOwner()
    errors = []
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        assert fetcher.start_run([(BlockKey("obj", 1, block), BS, None) for block in range(3)], fetch, owner=owner,
                                 prefetch=True) == 3
        for block in range(3):
            try:
                await fetcher.get(BlockKey("obj", 1, block), lambda: fetch(1), BS, owner=owner)
            except OSError as err:
                errors.append(str(err))
    # The first block's reader waited for the run and got its error; the
    # others, fetched again once the run was over, fail the same way here.
    assert errors == ["the stream broke"] * 3
    assert cache.bytes_reserved == 0 and len(cache) == 0


@pytest.mark.trio
async def test_a_run_stops_at_the_budget():
    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner

    cache = PageCache(2 * BS, BS)

    async def fetch(count: int) -> list[bytes]:
        return [b"x" * BS] * count

    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        assert fetcher.start_run([(BlockKey("obj", 1, block), BS, None) for block in range(4)], fetch, owner=FetchOwner(),
                                 prefetch=True) == 2
    assert len(cache) == 2


@pytest.mark.trio
async def test_a_block_handed_to_the_kernel_is_cached_as_read_so_readahead_may_evict_it():
    """A prefetched block that also went into the kernel's page cache is read
    there: cached as unread readahead, it could only be evicted by a demand
    fetch, and readahead would stop once such blocks filled the budget."""
    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner

    cache = PageCache(3 * BS, BS)

    async def fetch(count: int) -> list[bytes]:
        return [b"x" * BS] * count

    owner = FetchOwner()
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        assert fetcher.start_run([(BlockKey("obj", 1, block), BS, None) for block in range(3)], fetch, owner=owner,
                                 prefetch=True, handed_off=lambda index: index != 1) == 3
    assert cache.bytes_unread == BS  # only block 1 waits for its reader in this cache
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        # More readahead finds room: it evicts the handed-off blocks, never block 1.
        assert fetcher.start_run([(BlockKey("obj", 1, block), BS, None) for block in range(3, 5)], fetch,
                                 owner=owner, prefetch=True) == 2
    assert cache.peek(BlockKey("obj", 1, 1)) and not cache.peek(BlockKey("obj", 1, 0))
    assert not cache.peek(BlockKey("obj", 1, 2))


@pytest.mark.trio
async def test_a_fetch_that_fails_after_its_handle_was_released_is_cancelled_for_every_waiter():
    """A fetch task that first runs after its handle was released finds the
    reader closed (EBADF) before any checkpoint: another handle waiting on
    that block must fetch again, not get the released handle's EBADF."""
    from rapidmount.readahead.fetcher import BlockFetcher, FetchCancelled, FetchOwner

    cache = PageCache(4 * BS, BS)
    owner = FetchOwner()
    key = BlockKey("obj", 1, 0)

    async def fetch(count: int) -> list[bytes]:
        raise OSError(9, "read on a closed file handle")

    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        assert fetcher.start_run([(key, BS, None)], fetch, owner=owner, prefetch=True) == 1
        slot = fetcher._inflight[key]
        owner.cancel_all()  # released before the fetch task first ran
    assert isinstance(slot.error, FetchCancelled)
    assert cache.bytes_reserved == 0


@pytest.mark.trio
async def test_a_block_landed_only_in_the_kernel_holds_no_budget_and_a_read_of_it_copies_or_fetches_again():
    """A block read ahead whose bytes went only to the kernel's page cache is
    not cached here. A READ that comes for it anyway (first, while a reader
    waits on its fetch) takes the bytes its worker still holds, once; after
    the store was made, the block is read again."""
    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner
    from rapidmount.fuse.destinations import ReadAnswer
    from rapidmount.storage.seam import KernelOnly

    class Held(KernelOnly):
        __slots__ = ("data", "copies", "replies")

        def __init__(self, data: bytes | None) -> None:
            super().__init__(BS)
            self.data, self.copies, self.replies = data, 0, []

        async def copy(self, reply=None):
            self.copies += 1
            self.replies.append(reply)
            return self.data

    cache = PageCache(4 * BS, BS)
    held = [Held(b"h" * BS), Held(None), Held(b"w" * BS)]
    release = trio.Event()

    async def run(count: int) -> list:
        await release.wait()
        return held[:count]

    fetched: list[int] = []

    def again(block: int):
        async def fetch() -> bytes:
            fetched.append(block)
            return bytes([block]) * BS
        return fetch

    owner = FetchOwner()
    got = {}
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        keys = [BlockKey("obj", 1, block) for block in range(3)]
        assert fetcher.start_run([(key, BS, None) for key in keys], run, owner=owner, prefetch=True) == 3

        async def wait_on(block: int) -> None:
            got[block] = await fetcher.get(keys[block], again(block), BS, owner=owner)

        nursery.start_soon(wait_on, 2)  # a READ that came before the block landed
        await trio.testing.wait_all_tasks_blocked()
        release.set()
        await trio.testing.wait_all_tasks_blocked()
        assert cache.bytes_in_use == BS and len(cache) == 1, "only the block copied for the READ is cached"
        read_0 = ReadAnswer(5, 100, 200)
        got[0] = await fetcher.get(keys[0], again(0), BS, owner=owner, reply=read_0)
        got[1] = await fetcher.get(keys[1], again(1), BS, owner=owner)
    assert got == {0: b"h" * BS, 1: b"\1" * BS, 2: b"w" * BS}
    assert [item.copies for item in held] == [1, 1, 1] and fetched == [1], "held bytes copied; a made store read again"
    assert held[0].replies == [read_0], "the READ may be answered from the held bytes"


@pytest.mark.trio
async def test_a_read_answered_from_held_bytes_leaves_them_held_for_the_blocks_next_read():
    """A READ of a block that went only to the kernel's page cache, answered by
    its worker from the bytes it holds for the store (``copy`` gives the block
    back, ``reply.sent``): nothing is cached or fetched here, and the next READ
    of the same block asks the worker again; once the store is made, read again."""
    from rapidmount.readahead.fetcher import BlockFetcher, FetchOwner
    from rapidmount.fuse.destinations import ReadAnswer
    from rapidmount.storage.seam import KernelOnly

    class Held(KernelOnly):
        __slots__ = ("replies", "stored")

        def __init__(self) -> None:
            super().__init__(BS)
            self.replies, self.stored = [], False

        async def copy(self, reply=None):
            if self.stored:
                return None
            self.replies.append(reply)
            if reply is None:
                return b"h" * BS
            reply.sent = True
            return self

    cache = PageCache(4 * BS, BS)
    held = Held()
    fetched: list[int] = []

    async def land(count: int) -> list:
        return [held]

    async def again() -> bytes:
        fetched.append(0)
        return b"f" * BS

    owner, key = FetchOwner(), BlockKey("obj", 1, 0)
    async with trio.open_nursery() as nursery:
        fetcher = BlockFetcher(cache, nursery)
        assert fetcher.start_run([(key, BS, None)], land, owner=owner, prefetch=True) == 1
        await trio.testing.wait_all_tasks_blocked()
        first, second = ReadAnswer(5, 0, 50), ReadAnswer(6, 50, 50)
        assert await fetcher.get(key, again, BS, owner=owner, reply=first) == b"" and first.sent
        assert await fetcher.get(key, again, BS, owner=owner, reply=second) == b"" and second.sent
        assert len(cache) == 0 and cache.bytes_in_use == 0 and cache.bytes_reserved == 0
        held.stored = True
        assert await fetcher.get(key, again, BS, owner=owner, reply=ReadAnswer(7, 0, 50)) == b"f" * BS
    assert held.replies == [first, second] and fetched == [0]
