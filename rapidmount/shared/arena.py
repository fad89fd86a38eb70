"""The shared-memory arena: where the bytes of reads and appends live.

One ``memfd`` of a fixed size, mapped by the FUSE process and by every
worker process. Only the FUSE process allocates: a read asks a worker to
write a range's bytes at an offset of the arena, and the FUSE process then
replies to the kernel with a memoryview of those bytes, so no read byte is
copied inside the FUSE process. An append copies the application's bytes
into the arena once; the worker sends them from there.

A region is freed when the last memoryview of it is gone (CPython frees
it at once, by reference counting): the page cache drops a block, a reply
is sent, or the bucket confirmed an append. While a worker may still write
into a region, the pending call holds it, so it is never handed out twice.

:class:`Granules` is the allocator alone, without memory: first fit over a
sorted list of free runs of fixed-size granules.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import mmap
import os
import weakref

__all__ = ["Arena", "Granules", "GRANULE"]

#: The unit of allocation: page-aligned, and small enough that a 4 KiB read wastes little.
GRANULE = 64 << 10


class Granules:
    """Which granules of ``count`` are free: first fit, runs merged when freed."""

    __slots__ = ("count", "_starts", "_lengths", "free")

    def __init__(self, count: int) -> None:
        self.count = count
        self._starts: list[int] = [0] if count else []
        self._lengths: list[int] = [count] if count else []
        self.free = count

    def take(self, n: int) -> int | None:
        """The first granule of ``n`` free granules in a row, or None."""
        for i, length in enumerate(self._lengths):
            if length >= n:
                start = self._starts[i]
                if length == n:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] = start + n
                    self._lengths[i] = length - n
                self.free -= n
                return start
        return None

    def give_back(self, start: int, n: int) -> None:
        i = bisect.bisect_left(self._starts, start)
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] > start:
            raise ValueError(f"granules {start}+{n} are already free")
        if i < len(self._starts) and start + n > self._starts[i]:
            raise ValueError(f"granules {start}+{n} overlap a free run")
        self.free += n
        joins_left = i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start
        joins_right = i < len(self._starts) and start + n == self._starts[i]
        if joins_left and joins_right:
            self._lengths[i - 1] += n + self._lengths[i]
            del self._starts[i], self._lengths[i]
        elif joins_left:
            self._lengths[i - 1] += n
        elif joins_right:
            self._starts[i] = start
            self._lengths[i] += n
        else:
            self._starts.insert(i, start)
            self._lengths.insert(i, n)

    def runs(self) -> list[tuple[int, int]]:
        """The free runs ``(start, length)``, in order (for tests)."""
        return list(zip(self._starts, self._lengths))


@functools.lru_cache(maxsize=512)
def _array_type(size: int) -> type[ctypes.Array[ctypes.c_char]]:
    # ctypes keeps every array type it makes, for good: one per length would
    # leak with every new read size, so callers ask for whole granules only.
    return ctypes.c_char * size


class Arena:
    """A memfd of ``size`` bytes mapped here; regions handed out as memoryviews."""

    def __init__(self, size: int, *, name: str = "rapidmount-arena") -> None:
        granules = max(1, size // GRANULE)
        self.size = granules * GRANULE
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self._map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise
        self._granules = Granules(granules)
        self.failed_allocations = 0
        first = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(first)
        del first  # it would keep the map from closing

    @property
    def used(self) -> int:
        """Bytes held by live regions."""
        return (self._granules.count - self._granules.free) * GRANULE

    def allocate(self, length: int) -> tuple[int, memoryview] | None:
        """``(offset, view)`` of ``length`` fresh bytes, or None when the arena is full.

        The region stays taken while ``view`` or any view made from it lives.
        """
        n = max(1, -(-length // GRANULE))
        start = self._granules.take(n)
        if start is None:
            self.failed_allocations += 1
            return None
        offset = start * GRANULE
        exporter = _array_type(n * GRANULE).from_buffer(self._map, offset)
        weakref.finalize(exporter, self._granules.give_back, start, n)
        return offset, memoryview(exporter).cast("B")[:length]

    def offset_of(self, data: object) -> int | None:
        """Where ``data`` starts in the arena, if it is a contiguous view of it."""
        if not isinstance(data, memoryview) or data.readonly or not data.c_contiguous or not data.nbytes:
            return None
        offset = ctypes.addressof(ctypes.c_char.from_buffer(data)) - self._base
        return offset if 0 <= offset and offset + data.nbytes <= self.size else None


class WorkerArena:
    """A worker's mapping of the arena: it writes and reads where it is told."""

    def __init__(self, fd: int, size: int) -> None:
        self._map = mmap.mmap(fd, size)
        self._view = memoryview(self._map)

    def write(self, offset: int, data: bytes | memoryview) -> int:
        n = len(data)
        self._view[offset:offset + n] = data
        return n

    def view(self, offset: int, length: int) -> memoryview:
        """The bytes of an append: a WRITE's are read into it from their pipe,
        and a checksum takes its address (ctypes wants a writable buffer)."""
        return self._view[offset:offset + length]
