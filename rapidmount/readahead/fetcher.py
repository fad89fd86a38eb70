"""Fetch cache blocks on trio: single-flight, budgeted, cancellable per owner.

The page cache (``rapidmount.cache``) only does the accounting; this module
runs the fetches. Concurrent readers of one block wait on one fetch, a fetch
first reserves its bytes in the cache budget (so memory never exceeds it),
and every fetch task lives in the mount's nursery inside a cancel scope owned
by the file handle that started it, so releasing a handle stops its readahead.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable

import trio

from rapidmount.cache.page_cache import BlockKey, Buffer, PageCache
from rapidmount.storage.seam import KernelOnly, Answer

#: Blocks that went only to the kernel's page cache, remembered so a READ of
#: one that comes anyway asks their worker for the bytes. A READ comes within
#: a store's time; thousands of blocks later it is long made.
KERNEL_ONLY_KEPT = 4096

Landed = Buffer | KernelOnly
#: Runs once, when a reader first waits for a fetch, with that reader's READ
#: (which the fetch may answer as its block lands), or None.
OnWait = Callable[[Answer | None], None]


class FetchCancelled(Exception):
    """The fetch was cancelled by its owner; a waiter should fetch again."""


class FetchOwner:
    """The cancel scopes of the fetches one file handle started."""

    def __init__(self) -> None:
        self._scopes: set[trio.CancelScope] = set()
        self.closed = False
        self.active = 0  #: fetch runs started and not ended

    def track(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` too when the owner goes away."""
        if self.closed:
            scope.cancel()
        self._scopes.add(scope)

    def untrack(self, scope: trio.CancelScope) -> None:
        self._scopes.discard(scope)

    def cancel_all(self) -> None:
        self.closed = True
        for scope in self._scopes:
            scope.cancel()


class _Slot:
    __slots__ = ("event", "data", "error", "on_wait")

    def __init__(self, on_wait: OnWait | None = None) -> None:
        self.event = trio.Event()
        self.data: Landed | None = None
        self.error: BaseException | None = None
        #: called once, when a reader first waits for this fetch
        self.on_wait = on_wait

    def waited(self, reply: Answer | None = None) -> None:
        on_wait, self.on_wait = self.on_wait, None
        if on_wait is not None:
            on_wait(reply)


class BlockFetcher:
    def __init__(self, cache: PageCache, nursery: trio.Nursery) -> None:
        self.cache = cache
        self._nursery = nursery
        self._inflight: dict[BlockKey, _Slot] = {}
        self._budget_changed = trio.Event()
        self._kernel_only: collections.OrderedDict[BlockKey, KernelOnly] = collections.OrderedDict()

    def is_pending(self, key: BlockKey) -> bool:
        return key in self._inflight or self.cache.peek(key)

    def start(self, key: BlockKey, fetch: Callable[[], Awaitable[Landed]], size: int, *,
              owner: FetchOwner, prefetch: bool, on_wait: OnWait | None = None) -> _Slot | None:
        """Start fetching ``key`` unless it's cached or in flight; ``on_wait``
        runs if a reader comes to wait for it before it lands.

        Returns the in-flight slot, or None when the block is already cached
        or the budget has no room for it right now.
        """
        slot = self._inflight.get(key)
        if slot is not None:
            return slot

        async def fetch_one(count: int) -> list[Landed]:
            return [await fetch()]

        started = self.start_run([(key, size, on_wait)], fetch_one, owner=owner, prefetch=prefetch)
        return self._inflight.get(key) if started else None

    def start_run(self, blocks: list[tuple[BlockKey, int, OnWait | None]],
                  fetch: Callable[[int], Awaitable[list[Landed]]], *, owner: FetchOwner, prefetch: bool,
                  handed_off: Callable[[int], bool] | None = None) -> int:
        """Start fetching consecutive ``blocks`` (``(key, size, on_wait)``) in one
        task: ``fetch(n)`` returns the bytes of the first ``n``. Only the blocks
        before the first one cached, in flight or without room in the budget
        are fetched. Returns how many were started.

        A prefetched block for which ``handed_off(index)`` is true once it
        landed (it also went into the kernel's page cache, where its reader
        reads it) is cached as a block already read: the reader may never
        ask the cache for it, and unread readahead may not be evicted by
        other readahead, so it would hold the budget that readahead needs.
        A block that landed as :class:`KernelOnly` is not cached at all."""
        count = 0
        for key, size, _ in blocks:
            if owner.closed or key in self._inflight or self.cache.peek(key):
                break
            if not self.cache.try_reserve(size, prefetch=prefetch):
                break
            count += 1
        if not count:
            return 0
        started = blocks[:count]
        slots = [_Slot(on_wait) for _, _, on_wait in started]
        for (key, _, _), slot in zip(started, slots):
            self._inflight[key] = slot
        owner.active += 1
        self._nursery.start_soon(self._run, started, fetch, slots, owner, prefetch, handed_off)
        return count

    async def _run(self, blocks: list[tuple[BlockKey, int, OnWait | None]],
                   fetch: Callable[[int], Awaitable[list[Landed]]], slots: list[_Slot], owner: FetchOwner,
                   prefetch: bool, handed_off: Callable[[int], bool] | None) -> None:
        scope = trio.CancelScope()
        owner.track(scope)
        inserted = [False] * len(blocks)
        try:
            with scope:
                try:
                    landed = await fetch(len(blocks))
                    if len(landed) != len(blocks):
                        raise AssertionError(f"a fetch of {len(blocks)} blocks returned {len(landed)}")
                except Exception as err:  # handed to every waiter
                    # Its owner gone (a fetch that began after the handle was
                    # released finds the reader closed): others fetch again.
                    error = FetchCancelled() if scope.cancel_called else err
                    for slot in slots:
                        slot.error = error
                else:
                    for index, ((key, size, _), slot, data) in enumerate(zip(blocks, slots, landed)):
                        slot.data = data
                        if isinstance(data, KernelOnly):
                            self._remember_kernel_only(key, data)  # its budget is released below
                            continue
                        unread = prefetch and not (handed_off is not None and handed_off(index))
                        self.cache.insert(key, data, reserved=size, prefetched=unread)
                        inserted[index] = True
            if scope.cancelled_caught:
                for slot in slots:
                    slot.error = FetchCancelled()
        finally:
            owner.untrack(scope)
            owner.active -= 1
            for (key, size, _), slot, done in zip(blocks, slots, inserted):
                if not done:
                    self.cache.release(size)
                    if slot.error is None and slot.data is None:  # cancelled from outside (the mount stopping)
                        slot.error = FetchCancelled()
                del self._inflight[key]
                slot.event.set()
            self._budget_changed.set()
            self._budget_changed = trio.Event()

    def _remember_kernel_only(self, key: BlockKey, data: KernelOnly) -> None:
        self._kernel_only[key] = data
        self._kernel_only.move_to_end(key)
        while len(self._kernel_only) > KERNEL_ONLY_KEPT:
            self._kernel_only.popitem(last=False)

    async def get(self, key: BlockKey, fetch: Callable[[], Awaitable[Buffer]], size: int, *,
                  owner: FetchOwner, reply: Answer | None = None, on_wait: OnWait | None = None) -> Buffer:
        """The block's bytes: from the cache, an in-flight fetch, or a new one
        (for a block that went only to the kernel's page cache: its worker's
        bytes while it still holds them). ``reply``: the READ that waits for
        them, which the fetch it waits for may answer as the block lands;
        ``on_wait``: as for :meth:`start`, if this call starts the fetch."""
        while True:
            data = self.cache.get(key)
            if data is not None:
                return data
            kernel_only = self._kernel_only.pop(key, None)
            slot = self.start(key, fetch if kernel_only is None else _copy_or(kernel_only, fetch, reply), size,
                              owner=owner, prefetch=False, on_wait=on_wait)
            if slot is None and kernel_only is not None:
                self._remember_kernel_only(key, kernel_only)  # no room now: asked again below
            if slot is None:
                if owner.closed:
                    raise FetchCancelled()
                if not self.cache.peek(key):
                    # In-flight fetches hold the whole budget: wait for one to land.
                    await self._budget_changed.wait()
                continue
            slot.waited(reply)
            await slot.event.wait()
            if isinstance(slot.data, KernelOnly):
                if reply is not None and reply.sent:
                    return b""  # its worker answered the READ from the bytes it holds for the store
                continue  # landed for the kernel only, just now: its bytes come from its worker
            if slot.data is not None:
                # Read it through the cache so a prefetched block counts as read.
                cached = self.cache.get(key)
                return slot.data if cached is None else cached
            if isinstance(slot.error, FetchCancelled):
                continue
            assert slot.error is not None  # a fetch that ended without data has an error
            raise slot.error


def _copy_or(kernel_only: KernelOnly, fetch: Callable[[], Awaitable[Buffer]],
             reply: Answer | None) -> Callable[[], Awaitable[Landed]]:
    """The fetch of a block that went only to the kernel's page cache: the
    bytes its worker still holds (or, once ``reply`` was answered from them
    where they are, the block, still held), or else ``fetch`` (read them again)."""
    async def copy_or_fetch() -> Landed:
        data = await kernel_only.copy(reply)
        return await fetch() if data is None else data
    return copy_or_fetch
