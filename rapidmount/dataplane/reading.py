"""Reading: :class:`_Reader`, a :class:`~rapidmount.dataplane.store.WorkerStore`'s
:class:`~rapidmount.storage.seam.ObjectReader`, whose streams live in the workers.

A read allocates its bytes in the shared-memory arena, the worker writes
them there, and the core gets a memoryview of the arena (no copy here). A
block that went only to the kernel's page cache stays in the worker that
read it until its store is made (:class:`_HeldByWorker`).

A reader spreads its ranges over up to ``--read-streams`` streams, added by
load (:class:`~rapidmount.dataplane.streams.StreamPolicy`) and placed on
consecutive workers; the extra streams reuse the first stream's read handle.
A stream open keeps reading its generation after the object is deleted,
renamed or replaced; one opened after that finds nothing under the name, so
its ranges go to the open ones and no other opens.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from rapidmount.dataplane.connection import WorkerConnection, WorkerLost
from rapidmount.dataplane.store_base import WorkerStoreBase
from rapidmount.fuse.destinations import spec_of
from rapidmount.shared.messages import IN_KERNEL_ONLY, REPLIED_FROM_HELD, Message
from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.storage.seam import Answer, KernelOnly, PageStore

#: While a new stream waits for the first stream's read handle, the load is looked at again this often.
HANDLE_WAIT_SECONDS = 0.05


def _store_spec(pages: PageStore | None) -> Message | None:
    """A page-cache store as a worker's read call carries it."""
    return None if pages is None else (pages.ino, pages.epoch, pages.start, pages.end, pages.ticket)  # FUSE node ids are the inode numbers


class _HeldByWorker(KernelOnly):
    """A block that went only to the kernel's page cache: the worker that read
    it holds its bytes until its store is made."""

    __slots__ = ("_store", "_connection", "_ticket")

    def __init__(self, store: WorkerStoreBase, connection: WorkerConnection, ticket: int, length: int) -> None:
        super().__init__(length)
        self._store, self._connection, self._ticket = store, connection, ticket

    async def copy(self, reply: Answer | None = None) -> memoryview | KernelOnly | None:
        counts = self._store.page_stores
        region = self._store.arena.allocate(self.length)
        if region is None:  # the arena is full: read from the bucket, which waits for room
            counts.held_misses += 1
            return None
        arena_offset, view = region
        args = (self._ticket, self.length, arena_offset, spec_of(reply))
        try:
            count, sent = await self._connection.call("copy_held", args, keep=view)
        except WorkerLost:
            count, sent = IN_KERNEL_ONLY, False
        if count == REPLIED_FROM_HELD and reply is not None:
            reply.sent = True
            counts.held_copies += 1
            counts.held_replies += 1
            return self  # still held by the worker, for the block's next READ
        if count != self.length:
            counts.held_misses += 1
            return None
        if sent and reply is not None:
            reply.sent = True
        counts.held_copies += 1
        return view


class _Stream:
    """One read stream of a reader, on one worker."""

    __slots__ = ("connection", "stream_id", "ranges", "bytes", "answered")

    def __init__(self, connection: WorkerConnection, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.ranges = 0
        self.bytes = 0
        #: a call on it was answered, on this worker: it reads the generation,
        #: even once the object's name no longer holds it
        self.answered = False


class _Reader:
    """An :class:`~rapidmount.storage.seam.ObjectReader` whose streams live in workers."""

    def __init__(self, store: WorkerStoreBase, name: str, generation: int) -> None:
        self._store = store
        self.name = name
        self.generation = generation
        self._bidi = store.layout.bidi_reads
        self._streams: list[_Stream] = []
        self._read_handle: bytes | None = None
        self._routing_token: str | None = None
        self._answered = trio.Event()  # the first stream's first answer (it carries the read handle)
        self._first_worker = next(store._turns)
        self._closed = False
        #: the name no longer holds the generation: only the streams open read it
        self._unnamed = False

    @property
    def stream_open(self) -> bool:
        # Buckets without bidi reads keep no stream between reads.
        return self._bidi and any(stream.connection.alive for stream in self._streams)

    @property
    def streams(self) -> int:
        return len(self._streams)

    def loads(self) -> list[tuple[int, int]]:
        return [(stream.ranges, stream.bytes) for stream in self._streams]

    async def read(self, offset: int, length: int, *, pages: PageStore | None = None,
                   reply: Answer | None = None) -> bytes | memoryview:
        if self._closed:
            raise StorageError("read on a closed file handle", errno_=errno.EBADF)
        if length <= 0:
            return b""
        region = self._store.arena.allocate(length)
        replying = spec_of(reply)
        data: bytes | memoryview
        if region is None:
            data, state, sent = await self._on_stream(
                offset, length, lambda connection, stream_id, spec: connection.call(
                    "read", (stream_id, spec, offset, length, None, None, replying)))
        else:
            arena_offset, view = region
            region = None
            kept: memoryview | None = view
            store = _store_spec(pages)
            try:
                count, state, sent = await self._on_stream(
                    offset, length, lambda connection, stream_id, spec: connection.call(
                        "read", (stream_id, spec, offset, length, arena_offset, store, replying), keep=kept))
            except BaseException:
                kept = None  # a traceback kept by the error must not keep the region
                del view
                raise
            data = view[:count]
        if sent and reply is not None:
            reply.sent = True
        self._absorb(state)
        return data

    async def read_blocks(self, offset: int, lengths: list[int],
                          pages: list[PageStore | None]) -> list[bytes | memoryview | KernelOnly]:
        if self._closed:
            raise StorageError("read on a closed file handle", errno_=errno.EBADF)
        allocated = [self._store.arena.allocate(length) for length in lengths]
        regions = [region for region in allocated if region is not None]
        allocated.clear()  # the regions are held once, by ``regions``
        if len(regions) < len(lengths):  # the arena is full: block by block, as room comes
            regions.clear()
            landed: list[bytes | memoryview | KernelOnly] = []
            for length, page in zip(lengths, pages):
                landed.append(await self.read(offset, length, pages=page))
                offset += length
            return landed
        items = [(length, arena_offset, _store_spec(page))
                 for length, (arena_offset, _), page in zip(lengths, regions, pages)]
        views = [view for _, view in regions]
        kept = tuple(views)  # the call's: until the worker answered, even if this read is cancelled
        regions.clear()

        async def call(connection: WorkerConnection, stream_id: int, spec: Message) -> Any:
            return connection, await connection.call("read_blocks", (stream_id, spec, offset, items), keep=kept)

        try:
            connection, (counts, state) = await self._on_stream(offset, sum(lengths), call)
        except BaseException:
            views.clear()  # a traceback kept by the error must not keep the regions
            kept = ()
            raise
        self._absorb(state)
        blocks: list[bytes | memoryview | KernelOnly] = []
        for view, count, length, page in zip(views, counts, lengths, pages):
            if count != IN_KERNEL_ONLY:
                blocks.append(view[:count])
                continue
            assert page is not None, "a worker answers IN_KERNEL_ONLY only for a block it stores"
            blocks.append(_HeldByWorker(self._store, connection, page.ticket, length))
            self._store.page_stores.kernel_only += 1
        return blocks

    async def _on_stream(self, offset: int, length: int,
                         call: Callable[[WorkerConnection, int, Message], Awaitable[Any]]) -> Any:
        """``call(connection, stream_id, spec)`` for a range at ``offset`` on one of
        this reader's streams, moved to another worker (and made again) if its
        worker dies or drains, or given to another stream (:meth:`_to_others`)."""
        while True:
            stream = await self._choose(offset)
            if self._closed:  # while choosing: a stream added now would never be closed
                raise StorageError("read on a closed file handle", errno_=errno.EBADF)
            try:
                return await self._call_on(stream, length, call)
            except StorageError as err:
                if self._closed or not await self._to_others(stream, err):
                    raise

    async def _to_others(self, stream: _Stream, err: StorageError) -> bool:
        """Whether a call that failed on ``stream`` is made again on another of
        the reader's streams, one that has answered: when ``stream`` found the
        generation gone from under the name (NOT_FOUND: the object was deleted,
        renamed or replaced after the reader's first stream opened), or was
        dropped meanwhile. The streams open before go on reading the
        generation, and any new one would fail the same way: ``stream`` is
        dropped, and no other opens."""
        if not any(other.answered for other in self._streams if other is not stream):
            return False
        if stream in self._streams:
            if not (self._bidi and err.code is StorageCode.NOT_FOUND):
                return False
            self._unnamed = True
            self._streams.remove(stream)
            await stream.connection.notify("close_reader", stream.stream_id)
        return True

    async def _call_on(self, stream: _Stream, length: int,
                       call: Callable[[WorkerConnection, int, Message], Awaitable[Any]]) -> Any:
        stream.ranges += 1
        stream.bytes += length
        try:
            while True:
                if stream.connection.draining:
                    # Off a draining worker before the next range; the old stream
                    # finishes the ranges it still carries and ends with its worker.
                    await self._move(stream, stream.connection)
                connection = stream.connection
                spec = (self.name, self.generation, self._bidi, self._read_handle, self._routing_token)
                try:
                    answer = await call(connection, stream.stream_id, spec)
                except WorkerLost:
                    if self._closed:
                        raise StorageError("read on a closed file handle", errno_=errno.EBADF) from None
                    await self._move(stream, connection)
                    self._store.stream_events.on_read("reconnect")
                else:
                    stream.answered = True
                    return answer
        finally:
            stream.ranges -= 1
            stream.bytes -= length

    def _absorb(self, state: Message) -> None:
        generation, read_handle, routing_token = state
        if generation and not self.generation:
            self.generation = generation  # pinned: every later stream reads the same bytes
        if read_handle:
            self._read_handle = read_handle
        if routing_token:
            self._routing_token = routing_token
        self._answered.set()

    async def _choose(self, offset: int) -> _Stream:
        policy = self._store.read_policy
        if not self._streams:
            return await self._open_stream()
        if self._unnamed:
            return self._streams[policy.least_loaded(self.loads())]
        index = policy.choose(self.loads(), offset)
        while index == len(self._streams) and not self._answered.is_set():
            # Another stream is due, but its read handle comes with the first
            # stream's first answer. Wait for it, looking at the load again now and then.
            with trio.move_on_after(HANDLE_WAIT_SECONDS):
                await self._answered.wait()
            if self._closed:
                raise StorageError("read on a closed file handle", errno_=errno.EBADF)
            index = policy.choose(self.loads(), offset)
        if index == len(self._streams) and self._read_handle is None and self._bidi:
            index = policy.least_loaded(self.loads())  # the first stream failed before any answer
        if index == len(self._streams):
            return await self._open_stream()
        return self._streams[index]

    async def _open_stream(self) -> _Stream:
        connection = await self._store.pool.pick(after=self._first_worker + len(self._streams))
        stream = _Stream(connection, next(self._store._stream_ids))
        self._streams.append(stream)
        return stream

    async def _move(self, stream: _Stream, lost: WorkerConnection) -> None:
        """Put a stream whose worker died (or drains) on another worker (once,
        whoever notices first); the read handle carries over."""
        if stream.connection is lost:
            stream.connection = await self._store.pool.pick(avoid=lost)
            stream.stream_id = next(self._store._stream_ids)
            stream.answered = False  # opened again, by the read handle: the name must still hold the generation

    async def close(self) -> None:
        self._closed = True
        streams, self._streams = self._streams, []
        for stream in streams:
            await stream.connection.notify("close_reader", stream.stream_id)
