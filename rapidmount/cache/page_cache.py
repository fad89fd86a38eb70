"""The data cache: aligned object blocks under one global byte budget.

Sans-I/O: this module only does accounting. The trio layer owns the
single-flight table of in-flight fetches and decides whether to wait when
:meth:`PageCache.try_reserve` says no; here we only promise that cached plus
reserved bytes never exceed the budget, however many handles are reading.
That is what turns memory pressure into backpressure instead of an OOM.

Eviction order (two LRU lists):

1. **unread** -- blocks inserted by readahead (``prefetched=True``) that no
   reader has asked for yet, least recently inserted first;
2. **read** -- blocks that were demand-fetched or have been hit at least once,
   least recently used first.

Speculative data goes first so that readahead from many streams cannot flush
the blocks readers are actually using. A reservation made *for* readahead
(``try_reserve(..., prefetch=True)``) may only evict **read** blocks: one
stream's readahead never evicts another's not-yet-consumed readahead, so
a readahead block that does not fit is simply not fetched (the reader
fetches it on demand later) instead of streams thrashing each other into
refetches.

Every operation is O(1) on average (``OrderedDict``), except
:meth:`PageCache.invalidate_object`, which is O(blocks of that object).
"""

from __future__ import annotations

from collections.abc import Hashable

from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

__all__ = ["BlockKey", "Buffer", "CacheStats", "PageCache"]

Buffer: TypeAlias = bytes | bytearray | memoryview


class BlockKey(NamedTuple):
    """Identity of one cached block.

    The generation is part of the key, so a block of an old object generation
    can never be served for a new one, even if an invalidation races with an
    in-flight fetch (such a stale insert is simply never hit and ages out).
    """

    object_id: str  # the object's name (stable across inode numbers)
    generation: int
    block_index: int


@dataclass
class CacheStats:
    """Counters for metrics and tests; never reset by the cache itself."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    #: prefetched blocks evicted before any reader asked for them (wasted reads)
    evicted_unread: int = 0
    inserted: int = 0
    prefetch_inserted: int = 0
    #: first hits on prefetched blocks; prefetch accuracy = prefetch_hits / prefetch_inserted
    prefetch_hits: int = 0


def _nbytes(data: Buffer) -> int:
    # len() of a memoryview counts items, not bytes, for non-byte formats.
    return data.nbytes if type(data) is memoryview else len(data)


class PageCache:
    """LRU block cache with a hard byte budget shared by all file handles."""

    def __init__(self, budget_bytes: int, block_size: int) -> None:
        if budget_bytes <= 0 or block_size <= 0:
            raise ValueError("budget_bytes and block_size must be positive")
        self.budget_bytes = budget_bytes
        self.block_size = block_size
        self.stats = CacheStats()
        # Prefetched and not yet read: evicted first (see module docstring).
        self._unread: OrderedDict[BlockKey, Buffer] = OrderedDict()
        # Demand-fetched or read at least once.
        self._read: OrderedDict[BlockKey, Buffer] = OrderedDict()
        # object_id -> its cached keys, so invalidation does not scan the cache.
        self._by_object: dict[Hashable, set[BlockKey]] = {}
        self._cached = 0
        self._unread_bytes = 0
        self._reserved = 0

    # -- accounting ---------------------------------------------------------

    @property
    def bytes_cached(self) -> int:
        return self._cached

    @property
    def bytes_reserved(self) -> int:
        return self._reserved

    @property
    def bytes_in_use(self) -> int:
        """Cached plus reserved bytes; never above ``budget_bytes``."""
        return self._cached + self._reserved

    @property
    def bytes_unread(self) -> int:
        """Bytes of prefetched blocks that no reader has hit yet."""
        return self._unread_bytes

    def __len__(self) -> int:
        return len(self._read) + len(self._unread)

    # -- lookups ------------------------------------------------------------

    def get(self, key: BlockKey) -> Buffer | None:
        """Return the block and make it most recently used, or None on a miss."""
        data = self._read.get(key)
        if data is not None:
            self._read.move_to_end(key)
            self.stats.hits += 1
            return data
        data = self._unread.pop(key, None)
        if data is not None:
            # First read of a prefetched block: promote it to the read list.
            self._unread_bytes -= _nbytes(data)
            self._read[key] = data
            self.stats.hits += 1
            self.stats.prefetch_hits += 1
            return data
        self.stats.misses += 1
        return None

    def peek(self, key: BlockKey) -> bool:
        """Whether the block is cached, without touching stats or LRU order."""
        return key in self._read or key in self._unread

    # -- reservations -------------------------------------------------------

    def try_reserve(self, nbytes: int, *, prefetch: bool = False) -> bool:
        """Reserve budget for a fetch that is about to start.

        Evicts as needed. Returns False, evicting nothing, when the bytes
        cannot fit even after evicting everything this reservation may evict:
        all blocks for a demand fetch, only already-read blocks when
        ``prefetch`` is true. The caller then waits for a release or falls
        back to an uncached read.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if not self._make_room(nbytes, evict_unread=not prefetch):
            return False
        self._reserved += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """Give back a reservation whose fetch failed or was abandoned."""
        if not 0 <= nbytes <= self._reserved:
            raise ValueError(f"release({nbytes}) with {self._reserved} reserved")
        self._reserved -= nbytes

    def insert(
        self, key: BlockKey, data: Buffer, *, reserved: int, prefetched: bool = False
    ) -> bool:
        """Turn a reservation into a cached block, replacing any old entry.

        The whole reservation is consumed: whatever ``data`` does not use is
        released. If ``data`` is larger than the reservation, the difference
        is taken by evicting; when that is impossible the block is not cached
        (returns False) and the budget still holds.
        """
        if not 0 <= reserved <= self._reserved:
            raise ValueError(f"insert(reserved={reserved}) with {self._reserved} reserved")
        self._reserved -= reserved
        self.discard(key)
        size = _nbytes(data)
        if size > reserved and not self._make_room(size, evict_unread=not prefetched):
            return False
        if prefetched:
            self._unread[key] = data
            self._unread_bytes += size
            self.stats.prefetch_inserted += 1
        else:
            self._read[key] = data
        self._cached += size
        self._by_object.setdefault(key.object_id, set()).add(key)
        self.stats.inserted += 1
        return True

    # -- removal ------------------------------------------------------------

    def discard(self, key: BlockKey) -> int:
        """Drop one block if cached (e.g. it failed a checksum); returns bytes freed."""
        data = self._read.pop(key, None)
        if data is None:
            data = self._unread.pop(key, None)
            if data is None:
                return 0
            self._unread_bytes -= _nbytes(data)
        return self._forget(key, data)

    def invalidate_object(self, object_id: Hashable, keep_generation: int | None = None) -> int:
        """Drop an object's blocks of every generation but ``keep_generation``
        (all of them when None); returns the bytes freed."""
        keys = self._by_object.get(object_id)
        if not keys:
            return 0
        doomed = [k for k in keys if k.generation != keep_generation]
        return sum(self.discard(k) for k in doomed)

    def clear(self) -> None:
        """Drop every cached block. Reservations stay: their fetches are
        still in flight and will insert or release them."""
        self._read.clear()
        self._unread.clear()
        self._by_object.clear()
        self._cached = 0
        self._unread_bytes = 0

    # -- internals ----------------------------------------------------------

    def _forget(self, key: BlockKey, data: Buffer) -> int:
        """Bookkeeping for a block already popped from its LRU list."""
        size = _nbytes(data)
        self._cached -= size
        keys = self._by_object[key.object_id]
        keys.discard(key)
        if not keys:
            del self._by_object[key.object_id]
        return size

    def _make_room(self, nbytes: int, *, evict_unread: bool) -> bool:
        """Evict in the documented order until ``nbytes`` more fit.

        Returns False, evicting nothing, if they cannot fit even after every
        block this caller may evict is gone.
        """
        floor = self._reserved + (0 if evict_unread else self._unread_bytes)
        if floor + nbytes > self.budget_bytes:
            return False
        while self._cached + self._reserved + nbytes > self.budget_bytes:
            if evict_unread and self._unread:
                key, data = self._unread.popitem(last=False)
                self._unread_bytes -= _nbytes(data)
                self.stats.evicted_unread += 1
            else:
                key, data = self._read.popitem(last=False)
            self._forget(key, data)
            self.stats.evictions += 1
        return True
