"""Copying one object generation into the cache directory.

A fill reads the object in order, ``FILL_CHUNK`` bytes a range, up to
``FILL_AHEAD`` ranges in flight on one read stream, and writes each range
at its offset as it comes (``pwrite`` in a thread). Each range arrives with
its CRC32C checked by the reader; the fill extends the object's CRC32C over
the bytes it writes, which the caller compares with the object's own.

Readers of the same generation read what is written so far
(:attr:`Fill.frontier`), and wait for a range just past it rather than
fetch it a second time.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

import trio

from rapidmount.localcache.index import EntryKey
from rapidmount.storage.seam import ObjectReader
from rapidmount.checksums import crc32c_of

__all__ = ["Fill", "FillState", "copy_object", "FILL_AHEAD", "FILL_CHUNK"]

FILL_CHUNK = 8 << 20
FILL_AHEAD = 3


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

    def advance(self, count: int) -> None:
        self.frontier += count
        self._wake()

    def end(self, state: FillState) -> None:
        self.state = state
        self._wake()

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


def _write(fd: int, data: bytes | memoryview, offset: int, crc: int) -> int:
    """Write ``data`` at ``offset`` whole; the CRC32C extended over it. Blocking."""
    view = memoryview(data).cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return crc32c_of(view, crc)


@dataclass(eq=False)
class _Range:
    offset: int
    length: int
    arrived: trio.Event = field(default_factory=trio.Event)
    data: bytes | memoryview | None = None
    error: BaseException | None = None


async def copy_object(reader: ObjectReader, fd: int, fill: Fill, *, chunk: int = FILL_CHUNK,
                      ahead: int = FILL_AHEAD) -> int:
    """Copy the object's first ``fill.size`` bytes into ``fd``; their CRC32C.

    Raises what the reader raises (a StorageError), OSError from the writes,
    or EOFError if the object ends early.
    """
    send, receive = trio.open_memory_channel[_Range](ahead - 1)

    async def fetch(item: _Range) -> None:
        try:
            item.data = await reader.read(item.offset, item.length)
        except Exception as err:  # handed to the writer, which raises it
            item.error = err
        finally:
            item.arrived.set()

    async def produce(nursery: trio.Nursery) -> None:
        async with send:
            for offset in range(0, fill.size, chunk):
                item = _Range(offset, min(chunk, fill.size - offset))
                nursery.start_soon(fetch, item)
                await send.send(item)

    crc = 0
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce, nursery)
        async with receive:
            async for item in receive:
                await item.arrived.wait()
                data, item.data = item.data, None  # the range's buffer goes back once written
                if item.error is None and data is not None and len(data) != item.length:
                    item.error = EOFError(f"the object ended at {item.offset + len(data)} of {fill.size} bytes")
                if item.error is not None or data is None:
                    failure = item.error
                    nursery.cancel_scope.cancel()
                    break
                try:
                    crc = await trio.to_thread.run_sync(_write, fd, data, item.offset, crc)
                except OSError as err:  # the cache's file system: ENOSPC, EIO
                    failure = err
                    nursery.cancel_scope.cancel()
                    break
                finally:
                    del data
                fill.advance(item.length)
    if failure is not None:
        raise failure
    return crc
