"""Copying one object generation into the cache directory.

A fill reads the object in order, ``FILL_CHUNK`` bytes a range, up to
``FILL_AHEAD`` ranges in flight on one read stream (and at most
``FILL_RANGES`` over every fill, so that their bytes stay within the shared
memory the workers put them in), and writes each range at its offset as it
comes (``pwrite`` in a thread). Each range arrives with
its CRC32C checked by the reader; the fill extends the object's CRC32C over
the bytes it writes, which the caller compares with the object's own.

Readers of the same generation read what is written so far
(:attr:`Fill.frontier`), and wait for a range just past it rather than
fetch it a second time. The last ranges written stay in memory as they were
received (``FILL_KEPT``), so a reader at the frontier is answered from
there, as any read from the bucket is, while the file is written with
``O_DIRECT``, around the page cache.
"""

from __future__ import annotations

import collections
import enum
import errno
import os
from dataclasses import dataclass, field

import trio

from rapidmount.localcache.index import EntryKey
from rapidmount.storage.seam import ObjectReader
from rapidmount.shared.checksums import crc32c_of

__all__ = ["Fill", "FillState", "copy_object", "FILL_AHEAD", "FILL_CHUNK", "FILL_RANGES"]

FILL_CHUNK = 4 << 20
FILL_AHEAD = 3
#: ranges a fill keeps in memory once written, for the readers at its frontier
FILL_KEPT = 2
#: ranges in flight over every fill at once
FILL_RANGES = 6


class FillState(enum.Enum):
    RUNNING = "running"
    DONE = "done"  # complete, checked, and in ``objects/``
    FAILED = "failed"


@dataclass(eq=False)
class Fill:
    key: EntryKey
    size: int
    path: str  # under partial/ while running
    #: bytes [0, frontier) are written and may be read
    frontier: int = 0
    state: FillState = FillState.RUNNING
    _moved: trio.Event = field(default_factory=trio.Event)
    #: the last ranges written, as received: a reader at the frontier reads them here, not from disk
    _recent: collections.deque[tuple[int, memoryview]] = field(
        default_factory=lambda: collections.deque(maxlen=FILL_KEPT))

    def advance(self, count: int, data: bytes | memoryview | None = None) -> None:
        """``count`` more bytes are written; ``data``, those bytes, is kept
        for the readers at the frontier while the next ranges are written."""
        if data is not None:
            self._recent.append((self.frontier, memoryview(data).cast("B")))
        self.frontier += count
        self._wake()

    def end(self, state: FillState) -> None:
        self.state = state
        self._recent.clear()  # their shared memory goes back
        self._wake()

    def recent(self, offset: int, end: int) -> memoryview | None:
        """Bytes ``[offset, end)`` from the ranges kept in memory, if one holds them all."""
        for start, view in self._recent:
            if start <= offset and end <= start + len(view):
                return view[offset - start:end - start]
        return None

    def _wake(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    def readable(self, end: int) -> bool:
        """Bytes up to ``end`` are written (or the fill is done)."""
        return self.state is FillState.DONE or end <= self.frontier

    async def ended(self) -> FillState:
        """Wait until the fill is done or failed."""
        while self.state is FillState.RUNNING:
            await self._moved.wait()
        return self.state

    async def wait_for(self, end: int) -> bool:
        """Wait until bytes up to ``end`` are written; False if the fill failed first."""
        while not self.readable(end):
            if self.state is FillState.FAILED:
                return False
            await self._moved.wait()
        return True


#: O_DIRECT writes go in whole blocks of this many bytes, from addresses aligned to it
DIRECT_ALIGN = 4096


def _write(direct_fd: int | None, fd: int, data: bytes | memoryview, offset: int, crc: int) -> int:
    """Write ``data`` at ``offset`` whole; the CRC32C extended over it. Blocking.

    Whole blocks go through ``direct_fd`` (``O_DIRECT``) where there is one:
    buffered writes cost this kind of machine far more CPU (each byte copied
    into fresh page-cache pages, which the reads of the mount's own page
    cache do not need); the rest, and anything ``O_DIRECT`` refuses, through
    ``fd``."""
    view = memoryview(data).cast("B")
    done = 0
    aligned = len(view) - len(view) % DIRECT_ALIGN
    if direct_fd is not None and aligned and offset % DIRECT_ALIGN == 0:
        try:
            while done < aligned:
                done += os.pwrite(direct_fd, view[done:aligned], offset + done)
        except OSError as err:
            if err.errno != errno.EINVAL:  # EINVAL: a buffer O_DIRECT cannot take; written below
                raise
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return crc32c_of(view, crc)


def open_direct(path: str) -> int | None:
    """A second descriptor of ``path`` for O_DIRECT writes; None where its file system has none."""
    try:
        return os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return None


@dataclass(eq=False)
class _Range:
    offset: int
    length: int
    arrived: trio.Event = field(default_factory=trio.Event)
    data: bytes | memoryview | None = None
    error: BaseException | None = None


async def copy_object(reader: ObjectReader, fd: int, fill: Fill, ranges: trio.Semaphore, *,
                      chunk: int = FILL_CHUNK, ahead: int = FILL_AHEAD) -> int:
    """Copy the object's first ``fill.size`` bytes into ``fd``; their CRC32C.

    ``ranges`` bounds the ranges in flight over every fill. Raises what the
    reader raises (a StorageError), OSError from the writes, or EOFError if
    the object ends early.
    """
    copy = _Copy(reader, fd, fill, ranges, chunk)
    copy.direct_fd = open_direct(fill.path)
    try:
        return await copy.run(ahead)
    finally:
        for _ in range(copy.held):
            ranges.release()
        if copy.direct_fd is not None:
            os.close(copy.direct_fd)


class _Copy:
    def __init__(self, reader: ObjectReader, fd: int, fill: Fill, ranges: trio.Semaphore, chunk: int) -> None:
        self.reader, self.fd, self.fill, self.ranges, self.chunk = reader, fd, fill, ranges, chunk
        self.held = 0  # ranges taken from ``ranges`` and not yet given back
        self.direct_fd: int | None = None

    async def _fetch(self, item: _Range) -> None:
        try:
            item.data = await self.reader.read(item.offset, item.length)
        except Exception as err:  # handed to the writer, which raises it
            item.error = err
        finally:
            item.arrived.set()

    async def _produce(self, nursery: trio.Nursery, send: trio.MemorySendChannel[_Range]) -> None:
        async with send:
            for offset in range(0, self.fill.size, self.chunk):
                # Taken in order: the range the writer waits for always holds one.
                await self.ranges.acquire()
                self.held += 1
                item = _Range(offset, min(self.chunk, self.fill.size - offset))
                nursery.start_soon(self._fetch, item)
                await send.send(item)

    async def run(self, ahead: int) -> int:
        crc = 0
        failure: BaseException | None = None
        send, receive = trio.open_memory_channel[_Range](ahead - 1)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._produce, nursery, send)
            async with receive:
                async for item in receive:
                    await item.arrived.wait()
                    data, item.data = item.data, None  # the range's buffer goes back once written
                    if item.error is None and data is not None and len(data) != item.length:
                        item.error = EOFError(f"the object ended at {item.offset + len(data)} of "
                                              f"{self.fill.size} bytes")
                    if item.error is not None or data is None:
                        failure = item.error
                        break
                    try:
                        crc = await trio.to_thread.run_sync(_write, self.direct_fd, self.fd, data, item.offset, crc)
                    except OSError as err:  # the cache's file system: ENOSPC, EIO
                        failure = err
                        break
                    except BaseException:
                        del data
                        raise
                    self.held -= 1
                    self.ranges.release()
                    self.fill.advance(item.length, data)
                    del data
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return crc
