"""The read path: a chain of readers, each tried in order until one answers.

1. :class:`OwnWrites`: the file has pending writes of this mount; they are the truth.
2. :class:`LocalCopy`: the handle's generation is in the local cache (``--cache-dir``).
3. :class:`WholeSmallObject`: a small object fetched whole at open; blocks from the cache.
4. :class:`GrowingTail`: a direct-I/O handle reads past the known end of an
   unfinalized object: look for new bytes; at the end, answer empty.
5. :class:`DirectRange`: a random read, straight from the handle's stream.
6. :class:`CachedBlocks`: sequential reads, through the readahead page cache.

Each reader returns the bytes, or None to pass the read on.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import mmap
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from rapidmount.cache.page_cache import BlockKey, Buffer, PageCache
from rapidmount.core.errors import FSError, fs_error, storage_call
from rapidmount.core.handles import OpenFile
from rapidmount.core.namespace import Namespace
from rapidmount.core.stats import FSStats
from rapidmount.core.writes import WritePath
from rapidmount.localcache.cache import LocalCache
from rapidmount.readahead.fetcher import BlockFetcher, FetchCancelled, FetchOwner, OnWait
from rapidmount.readahead.policy import ReadPlan
from rapidmount.storage.errors import StorageError
from rapidmount.storage.seam import KernelOnly, ObjectStore, PageStore, Answer
from rapidmount.shared.views import MAX_PARTS, Gathered, slices

Data = Buffer  # a block's bytes: the arena's, or the heap's when the arena was full


@dataclass(slots=True)
class ReadRequest:
    handle: OpenFile
    offset: int
    size: int
    file_size: int
    plan: ReadPlan | None = None
    gather: bool = False  # a read over several blocks may come as a Gathered
    reply: Answer | None = None  # the READ a read straight from the stream may answer where it lands


#: Nodes with stores whose epoch is remembered. One forgotten (its stores
#: long done) starts again at epoch 0, which a worker that saw it raised refuses:
#: no stores, no harm.
EPOCHS_KEPT = 65536


class KernelPages:
    """Which fetched blocks the workers also store into the kernel's page cache.

    Only bytes that cannot change: the generation the inode shows, no pending
    write of this mount, a buffered handle, whole pages below the size the
    kernel knows. Before this mount changes a file, :meth:`changing` raises its
    epoch on every worker, so no store made for the old bytes lands after.
    """

    def __init__(self, store: ObjectStore, writing: Callable[[int], bool], page_size: int = mmap.PAGESIZE) -> None:
        self.enabled = store.stores_pages
        self.page_size = page_size
        self._store = store
        self._writing = writing
        self._epochs: collections.OrderedDict[int, int] = collections.OrderedDict()
        self._next_epoch = itertools.count(1)
        self._tickets = itertools.count(1)
        self._changing: collections.Counter[int] = collections.Counter()

    def target(self, handle: OpenFile, block: int, start: int, length: int, *,
               tripwire: bool = False) -> PageStore | None:
        """Where block ``block``, bytes ``[start, start + length)``, also goes, or None.
        A tripwire block leaves its first page out: reading it sends a READ."""
        inode = handle.inode
        if (not self.enabled or handle.direct_io or not handle.generation or not handle.stores.wants(block)
                or handle.generation != inode.generation or inode.ino in self._changing
                or self._writing(inode.ino)):
            return None
        end = start + length
        if end > handle.kernel_size or (end % self.page_size and end != handle.kernel_size):
            return None
        first = start + self.page_size if tripwire else start
        if first >= end:
            return None
        epoch = self._remember(inode.ino, self._epochs.get(inode.ino, 0))
        if not tripwire:  # read on purpose: not a race lost
            handle.stores.asked_for(block)
        return PageStore(inode.ino, epoch, first, end, next(self._tickets))

    def raced(self, pages: PageStore) -> None:
        """A READ waits for that block: it is answered from the arena, so its store is not made."""
        self._store.skip_page_store(pages.ticket)

    def _remember(self, ino: int, epoch: int) -> int:
        self._epochs[ino] = epoch
        self._epochs.move_to_end(ino)
        while len(self._epochs) > EPOCHS_KEPT:
            self._epochs.popitem(last=False)
        return epoch

    @contextlib.asynccontextmanager
    async def changing(self, ino: int) -> AsyncIterator[None]:
        """Around the start of a change of inode ``ino`` by this mount (until
        its pending writes exist): no store of its old bytes is asked for
        meanwhile, and none lands after the change began."""
        self._changing[ino] += 1
        try:
            if ino in self._epochs:  # stores of it were asked for
                await self._store.drain_page_stores(ino, self._remember(ino, next(self._next_epoch)))
            yield
        finally:
            self._changing[ino] -= 1
            if not self._changing[ino]:
                del self._changing[ino]


class Blocks:
    """Cache blocks of open files: fetched once, by the handle's own stream."""

    def __init__(self, cache: PageCache, stats: FSStats, pages: KernelPages | None = None, *,
                 step_blocks: int = 1, renames_done: Callable[[], Awaitable[None]] | None = None) -> None:
        self.cache = cache
        self.stats = stats
        self.pages = pages
        #: consecutive blocks read ahead in one call of the reader
        self.step_blocks = step_blocks
        self.fetcher: BlockFetcher | None = None  # set when the mount's nursery exists
        #: until the renames this mount has under way now are over (their files' handles moved on)
        self.renames_done = _no_renames if renames_done is None else renames_done

    def _attached(self) -> BlockFetcher:
        assert self.fetcher is not None, "a block is fetched only once the mount's nursery exists"
        return self.fetcher

    @staticmethod
    def _key(handle: OpenFile, block: int) -> BlockKey:
        # Keyed by object name, not inode: the kernel forgetting an inode
        # (e.g. under memory pressure) must not throw the cached data away.
        return BlockKey(handle.inode.path, handle.generation, block)

    def _fetch(self, handle: OpenFile, first: int, count: int, file_size: int, *, store: bool = False,
               tripwire: int = -1) -> tuple[list[tuple[BlockKey, int, OnWait | None]],
                                            Callable[[int], Awaitable[list[Data | KernelOnly]]],
                                            Callable[[int], bool]]:
        """Blocks ``first`` .. ``first + count - 1`` as the fetcher takes them,
        the fetch of the first ``n`` of them (one call of the reader), and
        whether block ``index`` also went to the kernel's page cache."""
        block_size = self.cache.block_size
        starts = [(first + index) * block_size for index in range(count)]
        lengths = [min(block_size, file_size - start) for start in starts]
        keys = [self._key(handle, first + index) for index in range(count)]
        kernel = self.pages if store and self.pages is not None and self.pages.enabled else None
        targets: list[PageStore | None] = [None] * count
        waited = [False] * count
        # The READ waiting for a lone block before its read went: answered where the block lands.
        replies: list[Answer] = []
        # The generation of ``keys``, even if the handle moves on meanwhile.
        reader, generation = handle.reader, handle.generation

        def on_wait(index: int) -> OnWait:
            def waits(reply: Answer | None) -> None:
                # A READ waits for this block: it is answered from the arena
                # (by the worker, as a lone block lands, if it can), so no store.
                waited[index] = True
                target = targets[index]
                if target is not None and kernel is not None:
                    kernel.raced(target)
                if reply is not None and count == 1:
                    replies.append(reply)
            return waits

        async def fetch(n: int) -> list[Data | KernelOnly]:
            self.stats.blocks_fetched += n
            self.stats.bytes_fetched += sum(lengths[:n])
            if kernel is not None and generation == handle.generation:
                # Decided when the fetch starts (not for a block already cached or
                # in flight, nor once the handle moved on to another generation).
                for index in range(n):
                    if not waited[index]:
                        targets[index] = kernel.target(handle, first + index, starts[index], lengths[index],
                                                       tripwire=first + index == tripwire)
            landed: list[Data | KernelOnly]
            if n == 1 and targets[0] is None:
                landed = [await reader.read(starts[0], lengths[0], reply=replies[0] if replies else None)]
            else:  # a block whose store covers it may land in the kernel's page cache only
                landed = list(await reader.read_blocks(starts[0], lengths[:n], targets[:n]))
            for start, length, data in zip(starts, lengths, landed):
                if len(data) != length:
                    raise StorageError(
                        f"read {handle.inode.path!r}: got {len(data)} bytes at {start}, expected {length}",
                        errno_=errno.EIO, object_name=handle.inode.path)
            return landed

        blocks: list[tuple[BlockKey, int, OnWait | None]] = [
            (key, length, on_wait(index)) for index, (key, length) in enumerate(zip(keys, lengths))]
        return blocks, fetch, lambda index: targets[index] is not None and not waited[index]

    def start(self, handle: OpenFile, blocks: range, file_size: int, *, prefetch: bool, tripwire: int = -1) -> None:
        """Start fetching ``blocks``, up to :attr:`step_blocks` in one call, but
        none already cached or in flight; prefetched blocks also go to the
        kernel's page cache."""
        fetcher = self._attached()
        block = blocks.start
        while block < blocks.stop:
            if fetcher.is_pending(self._key(handle, block)):
                block += 1
                continue
            run, fetch, handed_off = self._fetch(handle, block, min(self.step_blocks, blocks.stop - block),
                                                 file_size, store=prefetch, tripwire=tripwire)
            started = fetcher.start_run(run, fetch, owner=handle.owner, prefetch=prefetch, handed_off=handed_off)
            if not started:
                return  # no room in the budget: the readers fetch the rest when they come
            block += started

    async def get(self, handle: OpenFile, block: int, file_size: int, reply: Answer | None = None) -> Data:
        """The block's bytes; ``reply``: the READ they are for, which a fetch
        of this block alone may answer as the block lands."""
        while True:
            owner = handle.owner
            try:
                return await self._get_once(handle, block, file_size, reply)
            except (StorageError, FetchCancelled) as err:
                if await self._moved_on(handle, owner, err):
                    continue
                if isinstance(err, FetchCancelled):
                    raise FSError(errno.EBADF, "file handle was released") from None
                raise fs_error(err) from None

    async def stream(self, handle: OpenFile, start: int, length: int, reply: Answer | None = None) -> Data:
        """Bytes straight from the handle's stream (and, with ``reply``, maybe
        that READ's reply, when these bytes are all of it), made again on the
        new stream if the handle moved on meanwhile (:meth:`_moved_on`)."""
        while True:
            owner, reader = handle.owner, handle.reader
            try:
                return await reader.read(start, length, reply=reply)
            except StorageError as err:
                if not await self._moved_on(handle, owner, err):
                    raise fs_error(err) from None

    async def _moved_on(self, handle: OpenFile, owner: FetchOwner, err: Exception) -> bool:
        """Whether a read that failed on the stream of ``owner`` is made again:
        the handle moved to another stream meanwhile (its file was renamed or
        rewritten by this mount), and the old one may be gone with the old
        name. A stream that found the old name gone (ESTALE) while the rename
        was still under way here (the bucket had moved the object, its answer
        had not come) waits for the rename, which moves the handle on."""
        if handle.owner is owner and isinstance(err, StorageError) and err.errno == errno.ESTALE:
            await self.renames_done()
        return handle.owner is not owner and not handle.owner.closed

    async def _get_once(self, handle: OpenFile, block: int, file_size: int, reply: Answer | None) -> Data:
        key = self._key(handle, block)
        if self.cache.peek(key):  # a hit, as most sequential READs are: no fetch to build
            data = self.cache.get(key)
            if data is not None:
                return data
        [(key, length, on_wait)], fetch, _ = self._fetch(handle, block, 1, file_size)

        async def fetch_one() -> Data:
            data = (await fetch(1))[0]
            assert not isinstance(data, KernelOnly)  # only a block read ahead with a store lands so
            return data

        return await self._attached().get(key, fetch_one, length, owner=handle.owner, reply=reply, on_wait=on_wait)

    def cached(self, handle: OpenFile, block: int) -> Data | None:
        """The block if the cache holds it now (no fetch)."""
        key = self._key(handle, block)
        return self.cache.get(key) if self.cache.peek(key) else None

    async def span(self, handle: OpenFile, offset: int, end: int, file_size: int) -> memoryview:
        """Bytes [offset, end) from cache blocks, fetching what is missing."""
        block_size = self.cache.block_size
        first, last = offset // block_size, (end - 1) // block_size
        blocks = [await self.get(handle, block, file_size) for block in range(first, last + 1)]
        data = blocks[0] if len(blocks) == 1 else b"".join(blocks)
        return memoryview(data)[offset - first * block_size:end - first * block_size]


class OwnWrites:
    def __init__(self, writes: WritePath) -> None:
        self.writes = writes

    async def read(self, request: ReadRequest) -> Data | None:
        handle = request.handle
        return await self.writes.read_own(handle.inode, handle.reader, request.offset, request.size)


class Reader(Protocol):
    async def read(self, request: ReadRequest) -> Data | Gathered | None:
        """The bytes, or None: the next reader's."""


#: A read that starts at most this far past what a fill has written waits for
#: it; one further on reads from the bucket meanwhile.
FILL_WAIT_AHEAD = 32 << 20


class LocalCopy:
    """Reads from the handle's copy in the local cache: a complete entry, or
    a fill as far as it has written (a read just past that waits for it).
    Past the copy (an unfinalized object that grew), from the bucket."""

    def __init__(self, local: LocalCache, stats: FSStats) -> None:
        self.local = local
        self.stats = stats

    def now(self, handle: OpenFile, offset: int, size: int) -> Data | None:
        """The bytes if the copy has them all written; None otherwise."""
        copy = handle.local
        end = min(offset + size, handle.size)
        if copy is None or offset >= end or not copy.covers(offset, end):
            return None
        kept = copy.fill.recent(offset, end) if copy.fill is not None else None
        data: Data | None = kept if kept is not None else copy.read(offset, end - offset)
        if data is None:
            self.local.damaged(copy, handle.inode.path)
            return None
        self.local.stats.served_bytes += len(data)
        self.stats.bytes_read += len(data)
        return data

    async def read(self, request: ReadRequest) -> Data | None:
        handle, copy = request.handle, request.handle.local
        if copy is None:
            return None
        end = min(request.offset + request.size, request.file_size)
        fill = copy.fill
        if (fill is not None and end <= copy.size and not fill.readable(end)
                and request.offset < fill.frontier + FILL_WAIT_AHEAD):
            await fill.wait_for(end)
        return self.now(handle, request.offset, request.size)


class WholeSmallObject:
    def __init__(self, blocks: Blocks, stats: FSStats) -> None:
        self.blocks = blocks
        self.stats = stats

    async def read(self, request: ReadRequest) -> Data | None:
        handle = request.handle
        if not handle.whole:
            return None
        end = min(request.offset + request.size, handle.size)
        if request.offset >= end:
            return b""
        view = await self.blocks.span(handle, request.offset, end, handle.size)
        self.stats.bytes_read += len(view)
        return view


class GrowingTail:
    def __init__(self, namespace: Namespace) -> None:
        self.namespace = namespace

    async def read(self, request: ReadRequest) -> Data | None:
        handle = request.handle
        if request.offset + request.size > request.file_size and not handle.finalized and handle.direct_io:
            request.file_size = await self._grown_size(handle)
        if request.offset >= request.file_size or request.size <= 0:
            return b""
        return None

    async def _grown_size(self, handle: OpenFile) -> int:
        meta = await storage_call(self.namespace.store.get_object, handle.inode.path, handle.generation)
        if meta is not None and meta.size > handle.size:
            handle.size = meta.size
            handle.finalized = meta.finalized
            self.namespace.meta.put_object(meta)
            self.namespace.apply(handle.inode, meta)
        return handle.size


class DirectRange:
    def __init__(self, blocks: Blocks, stats: FSStats) -> None:
        self.blocks = blocks
        self.stats = stats

    async def read(self, request: ReadRequest) -> Data | None:
        request.plan = request.handle.policy.plan(request.offset, request.size, request.file_size)
        if request.plan.direct is None:
            return None
        start, length = request.plan.direct
        block_size = self.blocks.cache.block_size
        first = start // block_size
        if (start + length - 1) // block_size == first:
            # A block readahead already holds serves it: no round trip, and
            # still there once the generation is gone.
            cached = self.blocks.cached(request.handle, first)
            if cached is not None:
                view = memoryview(cached)[start - first * block_size:start - first * block_size + length]
                self.stats.bytes_read += len(view)
                return view
        self.stats.direct_reads += 1
        data = await self.blocks.stream(request.handle, start, length, request.reply)
        self.stats.bytes_read += len(data)
        return data


class CachedBlocks:
    def __init__(self, blocks: Blocks, stats: FSStats) -> None:
        self.blocks = blocks
        self.stats = stats

    def ahead(self, handle: OpenFile, plan: ReadPlan, file_size: int) -> int:
        """Start the plan's prefetch and note its demand for the stores; the
        end of the bytes that may be cached."""
        block_size = self.blocks.cache.block_size
        cacheable_end = cacheable_end_of(handle, file_size, block_size)
        cacheable = min(plan.prefetch.stop, -(-cacheable_end // block_size))
        if plan.prefetch.start < cacheable:
            self.blocks.start(handle, range(plan.prefetch.start, cacheable), file_size, prefetch=True,
                              tripwire=plan.tripwire)
        handle.stores.read(plan.demand)
        return cacheable_end

    async def read(self, request: ReadRequest) -> Data | Gathered:
        handle, plan, file_size = request.handle, request.plan, request.file_size
        assert plan is not None  # the chain plans a read before any part serves it
        block_size = self.blocks.cache.block_size
        cacheable_end = self.ahead(handle, plan, file_size)
        end = min(request.offset + request.size, file_size)
        first = plan.demand.start * block_size
        # A READ within one block may be answered by whoever reads that block, as it lands.
        reply = request.reply if len(plan.demand) == 1 and end > request.offset else None
        if reply is not None:
            reply.skip, reply.length = request.offset - first, end - request.offset
        parts: list[Data] = []
        for block in plan.demand:
            start = block * block_size
            if start >= cacheable_end:
                parts.append(await self.blocks.stream(handle, start, file_size - start, reply))
            else:
                parts.append(await self.blocks.get(handle, block, file_size, reply))
        if 1 < len(parts) <= MAX_PARTS and request.gather:
            gathered = slices(parts, request.offset - first, end - first)
            self.stats.bytes_read += len(gathered)
            return gathered
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        view = memoryview(data)[request.offset - first:end - first]
        self.stats.bytes_read += len(view)
        return view


async def _no_renames() -> None:
    return None


def cacheable_end_of(handle: OpenFile, file_size: int, block_size: int) -> int:
    """The last block of a growing (unfinalized) object changes as it grows,
    so only whole blocks of it are cached."""
    return file_size if handle.finalized else file_size - file_size % block_size


class ReadPath:
    """The chain, in order; the last reader always answers."""

    def __init__(self, namespace: Namespace, writes: WritePath, blocks: Blocks, stats: FSStats,
                 local: LocalCache | None = None) -> None:
        self.stats = stats
        self._writes = writes
        self._cached = CachedBlocks(blocks, stats)
        self._local = LocalCopy(local, stats) if local is not None else None
        self.chain: tuple[Reader, ...] = (OwnWrites(writes), *((self._local,) if self._local is not None else ()),
                      WholeSmallObject(blocks, stats), GrowingTail(namespace), DirectRange(blocks, stats), self._cached)

    def read_now(self, handle: OpenFile, offset: int, size: int) -> Data | None:
        """A read within one block the cache holds, done at once as the chain
        would do it (planned, its prefetch started, answered from the block);
        None, with nothing changed, for any other: then ``read``."""
        if (handle.local is not None and self._local is not None
                and self._writes.pending(handle.inode.ino) is None):
            data = self._local.now(handle, offset, size)
            if data is not None:
                self.stats.reads += 1
                return data
        file_size = handle.size
        end = min(offset + size, file_size)
        blocks = self._cached.blocks
        block_size = blocks.cache.block_size
        first = offset // block_size
        if (offset >= end or handle.whole or (end - 1) // block_size != first
                or end > cacheable_end_of(handle, file_size, block_size)
                or (offset + size > file_size and not handle.finalized and handle.direct_io)
                or self._writes.pending(handle.inode.ino) is not None):
            return None  # past the end, a small object, a growing tail, pending writes: the chain's
        block = blocks.cached(handle, first)
        if block is None:
            return None
        self.stats.reads += 1
        plan = handle.policy.plan(offset, size, file_size)
        if plan.direct is None:  # sequential, or a large random read: as CachedBlocks
            self._cached.ahead(handle, plan, file_size)
        view = memoryview(block)[offset - first * block_size:end - first * block_size]
        self.stats.bytes_read += len(view)
        return view

    async def read(self, handle: OpenFile, offset: int, size: int, gather: bool = False,
                   reply: Answer | None = None) -> Data | Gathered:
        """The bytes; a reader whose bytes are the whole reply may also send
        it as ``reply`` (then ``reply.sent``)."""
        self.stats.reads += 1
        request = ReadRequest(handle, offset, size, handle.size, gather=gather, reply=reply)
        for reader in self.chain:
            data = await reader.read(request)
            if data is not None:
                return data
        raise AssertionError("the last reader always answers")
