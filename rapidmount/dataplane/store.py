"""The storage seam over the data-plane workers: :class:`WorkerStore`.

Every call of the filesystem core becomes one message to a worker process,
which makes the gRPC call. Only small control messages cross the socket:

* a read allocates its bytes in the shared-memory arena, the worker writes
  them there, and the core gets a memoryview of the arena (no copy here);
* an append of a large write keeps the ``bytes`` the kernel's request came
  in, and the worker reads them from this process's memory
  (``process_vm_readv``), so nothing is copied here; a small write, or any
  write where the workers cannot read this memory, is copied into the arena
  once. Either way the bytes stay until the bucket confirmed them, so a
  worker's death loses nothing: another worker takes the object over at its
  persisted size and sends the rest again;
* an upload of a staged file passes the worker its descriptor
  (``socket.send_fds``): the worker reads the file, this process does not.
  Appended from a staged file, the bytes stay in that file until confirmed.

A reader spreads its ranges over up to ``--read-streams`` streams, added by
load (:class:`~rapidmount.dataplane.streams.StreamPolicy`) and placed on
consecutive workers; the extra streams reuse the first stream's read handle.
A stream open keeps reading its generation after the object is deleted,
renamed or replaced; one opened after that finds nothing under the name, so
its ranges go to the open ones and no other opens.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import trio

from rapidmount.shared import wire
from rapidmount.shared.peer_memory import address_of
from rapidmount.shared.checksums import file_crc32c
from rapidmount.shared.arena import Arena
from rapidmount.shared.messages import IN_KERNEL_ONLY, REPLIED_FROM_HELD, Message
from rapidmount.dataplane.pool import WorkerConnection, WorkerLost, WorkerPool
from rapidmount.dataplane.streams import StreamPolicy
from rapidmount.dataplane.write_pipes import PipedWrite
from rapidmount.fuse.destinations import spec_of
from rapidmount.core.locks import QuickLock
from rapidmount.storage.counters import PageStoreCounts, RpcErrorCounts, StreamEvents
from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.storage.model import BucketLayout, DirectoryMeta, FolderMeta, ListPage, ObjectMeta
from rapidmount.storage.seam import LIST_PAGE_SIZE, Answer, KernelOnly, PageStore, UploadSource
from rapidmount.shared.views import Arriving, pieces

__all__ = ["WorkerStore"]

log = logging.getLogger("rapidmount.dataplane")

#: Appends go to a worker in pieces of one message of the append stream: a
#: worker then sends each piece as it came, with no copy to join smaller ones.
APPEND_PIECE = wire.MAX_CHUNK_BYTES

#: Bytes held where they were written (no copy to make) go to a worker in
#: pieces of up to this much, at most a quarter of --write-buffer: one call
#: and one answer per 8 MiB, not per message of the stream. The worker's
#: writer cuts them into messages as it sends.
HELD_APPEND_PIECE = 4 * APPEND_PIECE

#: Writes at least this large are appended from their own ``bytes``, kept
#: here and read by the worker from this process's memory; smaller ones are
#: copied into the arena. Copying 64 KiB takes a few microseconds, less than
#: the rest of a write's way through this process, while each write kept is
#: an allocation held until confirmed and a segment in the worker's message:
#: below this, keeping thousands of small objects costs more than the copy.
#: An 8 MiB piece is then at most 129 segments (the tail of a split write, then 128).
PEER_WRITE_MIN = 64 << 10

#: While a new stream waits for the first stream's read handle, the load is looked at again this often.
HANDLE_WAIT_SECONDS = 0.05

#: How far the service's clock may be from ours when a change made again
#: after a worker's death looks for the effect of its first attempt.
CLOCK_SKEW_NS = 2_000_000_000


def made_during(meta: ObjectMeta, started_ns: int) -> bool:
    """``meta``'s generation was created while a call that began at ``started_ns`` ran."""
    return started_ns - CLOCK_SKEW_NS <= meta.ctime_ns <= time.time_ns() + CLOCK_SKEW_NS


def own_new_object(meta: ObjectMeta | None, replaced: int | None, started_ns: int) -> bool:
    """Whether ``meta`` is the object a create (``if_generation_match=replaced``)
    whose worker died made: a new generation, still empty and appendable,
    created while the create ran. Anything else is another writer's."""
    return (meta is not None and meta.generation != replaced and not meta.finalized and meta.size == 0
            and made_during(meta, started_ns))


def _store_spec(pages: PageStore | None) -> Message | None:
    """A page-cache store as a worker's read call carries it."""
    return None if pages is None else (pages.ino, pages.epoch, pages.start, pages.end, pages.ticket)  # FUSE node ids are the inode numbers


class _HeldByWorker(KernelOnly):
    """A block that went only to the kernel's page cache: the worker that read
    it holds its bytes until its store is made."""

    __slots__ = ("_store", "_connection", "_ticket")

    def __init__(self, store: WorkerStore, connection: WorkerConnection, ticket: int, length: int) -> None:
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

    def __init__(self, store: WorkerStore, name: str, generation: int) -> None:
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


class _Piece:
    """The piece of appended bytes being filled: an arena region, or memory when the arena is full."""

    __slots__ = ("arena_offset", "buffer", "filled", "start")

    def __init__(self, store: WorkerStore, start: int) -> None:
        region = store.arena.allocate(APPEND_PIECE)
        self.arena_offset: int | None
        self.buffer: memoryview | bytearray
        self.arena_offset, self.buffer = (None, bytearray(APPEND_PIECE)) if region is None else region
        self.filled = 0
        self.start = start  # its offset in the file

    def add(self, data: bytes | memoryview, offset: int, length: int) -> None:
        self.buffer[self.filled:self.filled + length] = memoryview(data)[offset:offset + length]
        self.filled += length


class _HeldPiece:
    """A piece of appended bytes left where they are: parts of written
    ``bytes`` objects, kept alive here, which the worker reads from this
    process's memory."""

    __slots__ = ("parts", "filled", "start")

    def __init__(self, start: int) -> None:
        self.parts: list[tuple[bytes | memoryview, int, int]] = []  # (a write's bytes, offset in them, length)
        self.filled = 0
        self.start = start  # its offset in the file

    def __len__(self) -> int:
        return self.filled

    def add(self, data: bytes | memoryview, offset: int, length: int) -> None:
        self.parts.append((data, offset, length))
        self.filled += length

    def _from(self, skip: int) -> list[tuple[bytes | memoryview, int, int]]:
        """The parts of the piece's bytes from ``skip`` on."""
        kept = []
        for data, offset, length in self.parts:
            if skip >= length:
                skip -= length
                continue
            kept.append((data, offset + skip, length - skip))
            skip = 0
        return kept

    def segments(self, skip: int = 0) -> list[tuple[int, int]]:
        """Where the bytes from ``skip`` on are in this process: (address, length)."""
        return [(address_of(cast(bytes, data)) + offset, length) for data, offset, length in self._from(skip)]

    def joined(self, skip: int = 0) -> bytes:
        """The bytes from ``skip`` on, copied (for a worker that cannot read them here)."""
        return b"".join(memoryview(data)[offset:offset + length] for data, offset, length in self._from(skip))


class _ArenaHeldPiece(_HeldPiece):
    """A piece of appended bytes the kernel wrote into the arena (the
    request loop reads a large WRITE there): views of it, kept alive here,
    which the worker reads through its own mapping."""

    __slots__ = ()

    def arena_segments(self, arena: Arena, skip: int = 0) -> list[tuple[int, int]]:
        """Where the bytes from ``skip`` on are in the arena: (offset, length)."""
        segments = []
        for view, offset, length in self._from(skip):
            start = arena.offset_of(view)
            assert start is not None  # only arena views are held here
            segments.append((start + offset, length))
        return segments


class _StagedPart:
    """Bytes appended from a staged file: its first ``length`` bytes, through a
    duplicate of its descriptor, kept until the bucket confirmed them."""

    __slots__ = ("fd", "length")

    def __init__(self, source: int, length: int) -> None:
        self.fd = os.dup(source)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def close(self) -> None:
        os.close(self.fd)


class _Appender:
    """An :class:`~rapidmount.storage.seam.ObjectAppender` whose stream lives in a worker.

    Appends are gathered into pieces: written bytes held where they are
    (:class:`_HeldPiece`, writes of at least :data:`PEER_WRITE_MIN` while the
    worker can read this process's memory, up to :data:`HELD_APPEND_PIECE`),
    or copied into the arena (:data:`APPEND_PIECE`); a piece holds one kind,
    so a write of the other kind sends the piece first, and the bytes stay in order. Each full piece
    is sent without waiting for the worker's answer while fewer than
    ``--write-buffer`` bytes are unconfirmed; a partial piece goes out before
    any flush, finalize or close. A failure surfaces at the next call, as
    with the stream itself. Bytes ``[persisted, written)`` stay held here, in
    the arena (or, when it is full, in memory here), or in their staged file
    until the bucket confirmed them, so a worker's death loses none of them.
    """

    def __init__(self, store: WorkerStore, name: str) -> None:
        self._store = store
        self.name = name
        self.generation = 0
        self._connection: WorkerConnection | None = None
        self._id = 0
        self._lock = QuickLock()  # every WRITE takes it: at once when free
        # (offset in the object, its bytes): a piece of the arena, bytes, written bytes held, or a part of a staged file
        self._retained: collections.deque[tuple[int, memoryview | bytes | _HeldPiece | _StagedPart]] = (
            collections.deque())
        self._written = 0
        self._persisted = 0
        self._open = False
        self._unanswered = 0  # appends sent and not answered yet
        self._answer = trio.Event()  # set (and replaced) at each answer
        self._failure: StorageError | None = None  # an append the worker refused, for good
        self._lost: WorkerConnection | None = None  # the worker died under unanswered appends (or drains)
        self._leaving = False  # ``_lost`` is a draining worker, not a dead one
        self._piece: _Piece | _HeldPiece | None = None
        self._held_capacity = max(APPEND_PIECE, min(HELD_APPEND_PIECE, store.write_buffer // 4))

    @property
    def stream_open(self) -> bool:
        return self._open and self._connection is not None and self._connection.alive

    async def create(self, *, if_generation_match: int | None = 0,
                     metadata: Mapping[str, str] | None = None) -> ObjectMeta | None:
        """A new appendable object. If the worker dies first, the create is
        made again elsewhere; when the first attempt did reach the bucket,
        the object it made (:func:`own_new_object`) is taken over instead."""
        kwargs = {"if_generation_match": if_generation_match, "metadata": metadata}
        meta: ObjectMeta | None
        async with self._lock:
            started_ns = time.time_ns()
            while True:
                try:
                    meta = await self._call("create", (), kwargs, recover=False)
                    break
                except WorkerLost:
                    log.warning("create of %r lost with its worker; making it again on another", self.name)
                found = await self._store.get_object(self.name)
                if found is None or found.generation == if_generation_match:
                    continue  # the first attempt did not reach the bucket
                if not own_new_object(found, if_generation_match, started_ns):
                    raise StorageError(f"create {self.name!r}: another client made the object meanwhile",
                                       errno_=errno.ESTALE, object_name=self.name)
                await self._takeover(found.generation)
                meta = found
                break
            self._open = True
            return meta

    async def takeover(self, generation: int) -> int:
        async with self._lock:
            return await self._takeover(generation)

    async def _takeover(self, generation: int) -> int:
        """Become the writer of ``generation``; made again on another worker if
        the worker dies first (a takeover is idempotent: the last one wins)."""
        while True:
            try:
                size: int = await self._call("takeover", (generation,), {}, recover=False)
                break
            except WorkerLost:
                log.warning("takeover of %r lost with its worker; making it again on another", self.name)
        self._written = self._persisted = size
        self._open = True
        return size

    def append_now(self, data: bytes | memoryview | Arriving) -> bool:
        """Queue ``data`` at once if nothing needs a wait: a large WRITE's
        bytes in a pipe the stream's worker holds (handed to it), or in the
        arena, joining a held piece they fit in, with room in
        ``--write-buffer``; a piece they fill is sent at once too. False
        leaves everything as it was, for ``append``. The request loop calls it
        for a WRITE before making it a task."""
        connection, piece, size = self._connection, self._piece, len(data)
        filled = size + (0 if piece is None else piece.filled)
        if (self._lock.locked() or connection is None or not connection.can_call_now or connection.draining
                or self._failure is not None or self._lost is not None or size < PEER_WRITE_MIN
                or not (piece is None or type(piece) is _ArenaHeldPiece) or filled > self._held_capacity
                or (self._written + size - self._persisted > self._store.write_buffer and self._unanswered)):
            return False
        if isinstance(data, PipedWrite):
            view = data.view
            if view is None or not self._handed_to(connection, data):
                return False
            held: bytes | memoryview = view
        elif isinstance(data, memoryview) and self._store.arena.offset_of(data) is not None:
            held = data
        else:
            return False
        self._add(held, 0, self._held_capacity, _ArenaHeldPiece)
        if filled == self._held_capacity:
            self._send_piece_now()  # else (the socket full) it goes with the next call
        return True

    async def append(self, data: bytes | memoryview | Arriving) -> None:
        if not len(data) or self.append_now(data):
            return
        async with self._lock:
            if self._connection is None:
                raise StorageError(f"append to {self.name!r} before create or takeover", errno_=errno.EBADF)
            self._raise_failure()
            if isinstance(data, Arriving):
                data = await self._hand_over(data) if isinstance(data, PipedWrite) else _landed(data)
            if len(data) >= PEER_WRITE_MIN and self._store.arena.offset_of(data) is not None:
                await self._fill(data, _ArenaHeldPiece)  # the kernel wrote it into the arena: kept there
            elif len(data) >= PEER_WRITE_MIN and isinstance(data, bytes) and self._connection.reads_our_memory:
                await self._fill(data, _HeldPiece)  # kept as it is: the worker reads it from this process
            else:
                await self._fill(data, _Piece)  # copied into the arena
            # --write-buffer bounds the bytes the bucket has not confirmed: past
            # it, wait for the answer of the append that made the worker persist.
            while (self._written - self._persisted > self._store.write_buffer and self._unanswered
                   and self._lost is None and self._failure is None):
                await self._answer.wait()

    async def _hand_over(self, write: PipedWrite) -> memoryview:
        """The region of a WRITE whose bytes wait in a pipe: the stream's
        worker reads them into it (its fill thread) and answers the WRITE; an
        append of these bytes waits there until it has. Read here when that
        worker does not hold the pipe, cannot be told, or is lost."""
        if self._piece is not None and not isinstance(self._piece, _ArenaHeldPiece):
            # Sent before the hand-over: once the worker may answer the WRITE,
            # nothing is awaited before its bytes are kept (an await may fail).
            await self._send_piece()
        connection, view = self._connection, write.view
        assert view is not None  # its bytes are still in the pipe
        if connection is None or self._lost is not None or not self._handed_to(connection, write):
            return _landed(write)  # read here, and answered by the request loop
        return view

    def _handed_to(self, connection: WorkerConnection, write: PipedWrite) -> bool:
        """Tell ``connection``'s fill thread to read ``write``'s bytes and answer
        it; False (nothing done) when it does not hold the pipe or cannot be told."""
        pipes = self._store.pool.write_pipes
        if (pipes is None or write.pipe.id not in connection.pipe_ids
                or not connection.send_fill(write.pipe.id, write.arena_offset, len(write), write.unique)):
            return False
        pipes.handed(write, connection)  # from now on, its loss lands and answers the WRITE
        return True

    async def _fill(self, data: bytes | memoryview, kind: type[_Piece] | type[_HeldPiece]) -> None:
        """Append ``data`` in pieces of ``kind``, each sent once full; a piece
        of the other kind being filled, or a full one ``append_now`` could not
        send, goes first, so the bytes stay in order."""
        capacity = APPEND_PIECE if kind is _Piece else self._held_capacity
        if self._piece is not None and (type(self._piece) is not kind or self._piece.filled >= capacity):
            await self._send_piece()
        offset = 0
        while offset < len(data):
            offset += self._add(data, offset, capacity, kind)
            if cast(_Piece | _HeldPiece, self._piece).filled == capacity:
                await self._send_piece()

    def _add(self, data: bytes | memoryview, offset: int, capacity: int,
             kind: type[_Piece] | type[_HeldPiece]) -> int:
        """Add what the piece being filled (a new one of ``kind`` if none)
        has room for of ``data[offset:]``; returns how much that was."""
        if self._piece is None:
            self._piece = (_Piece(self._store, self._written) if kind is _Piece
                           else cast(type[_HeldPiece], kind)(self._written))
        piece = self._piece
        take = min(len(data) - offset, capacity - piece.filled)
        piece.add(data, offset, take)
        self._written += take
        return take

    async def append_file(self, source: int, size: int) -> None:
        if size <= 0:
            return
        async with self._lock:
            if self._connection is None:
                raise StorageError(f"append to {self.name!r} before create or takeover", errno_=errno.EBADF)
            self._raise_failure()
            await self._send_piece()  # the bytes before these go first
            part = _StagedPart(source, size)
            self._retained.append((self._written, part))
            self._written += size
            self._leave_if_draining()
            if self._lost is not None:
                await self._recover(self._lost)  # sends every retained byte, these too
                return
            connection = self._connection
            try:
                reply = await connection.call("append_file", (self._id, 0, size), passing=part.fd)
            except WorkerLost:
                self._lost = connection
                await self._recover(connection)
                return
            except StorageError as err:
                self._failure = self._failure or err  # the stream is broken: every later call says so
                raise
            self._raise_failure()
            self._absorb(reply)

    async def _send_piece(self) -> None:
        """Send the piece being filled (whole or not) to the worker; keep it until confirmed."""
        piece, self._piece = self._piece, None
        if piece is None or not piece.filled:
            return
        self._leave_if_draining()
        kept: memoryview | bytes | _HeldPiece
        if isinstance(piece, _HeldPiece):
            kept = piece
        else:
            arena_offset, filled = piece.arena_offset, piece.filled
            kept = bytes(piece.buffer[:filled]) if arena_offset is None else cast(memoryview, piece.buffer)[:filled]
        self._retained.append((piece.start, kept))
        if self._lost is not None:
            await self._recover(self._lost)  # sends every retained byte, these too
            return
        connection = self._connection
        assert connection is not None  # an appender has a worker until it is lost, handled above
        self._unanswered += 1
        if isinstance(kept, _HeldPiece):
            op, args = self._held_append(connection, kept)
        else:
            op, args = "append", ((self._id, None, kept) if arena_offset is None else (self._id, arena_offset, filled))
        await connection.call_soon(op, args, self._on_append_answer(connection), keep=kept)

    def _send_piece_now(self) -> bool:
        """``_send_piece`` for a held piece, if the worker's socket takes the
        call now; False: it stays the piece being filled."""
        piece, connection = self._piece, self._connection
        assert isinstance(piece, _HeldPiece) and connection is not None and self._lost is None
        op, args = self._held_append(connection, piece)
        self._retained.append((piece.start, piece))  # before the send: a loss on the way sends it again
        self._unanswered += 1
        if not connection.call_now(op, args, self._on_append_answer(connection), keep=piece):
            self._retained.pop()
            self._unanswered -= 1
            return False
        self._piece = None
        return True

    def _held_append(self, connection: WorkerConnection, piece: _HeldPiece, skip: int = 0) -> tuple[str, Message]:
        """The call that appends a held piece from ``skip`` on: its addresses, or
        a copy for a worker that cannot read this process's memory."""
        if isinstance(piece, _ArenaHeldPiece):
            # After the fills sent so far: the bytes of WRITEs handed to it are in the arena by then.
            return "append_arena", (self._id, piece.arena_segments(self._store.arena, skip), connection.fills_sent)
        if connection.reads_our_memory:
            return "append_peer", (self._id, piece.segments(skip))
        return "append", (self._id, None, piece.joined(skip))

    def _on_append_answer(self, connection: WorkerConnection) -> Callable[[bool, object], None]:
        def answered(ok: bool, value: object) -> None:
            self._unanswered -= 1
            if connection is self._connection:
                if ok:
                    self._absorb(cast(Message, value))
                elif isinstance(value, WorkerLost):
                    self._lost = connection
                elif self._failure is None:
                    self._failure = cast(StorageError, value)
            answer, self._answer = self._answer, trio.Event()
            answer.set()
        return answered

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def flush(self) -> int:
        async with self._lock:
            await self._send_piece()
            persisted: int = await self._call("flush", (), {})
            return persisted

    async def finalize(self) -> ObjectMeta:
        async with self._lock:
            await self._send_piece()
            meta: ObjectMeta = await self._call("finalize", (), {})
            self._open = False
            return meta

    async def close(self) -> None:
        async with self._lock:
            if not self._open:
                return
            try:
                await self._send_piece()
                await self._call("close", (), {})
            finally:
                self._open = False

    async def abort(self) -> None:
        self._open = False
        connection, self._connection = self._connection, None
        self._piece = None
        try:
            if connection is not None:
                await connection.notify("forget_appender", self._id)
                if self._retained and connection.alive:
                    # Its stream may still read retained bytes (held here, or in
                    # the arena) until the worker has forgotten it: the answer to
                    # a call sent after the notice says it has.
                    with contextlib.suppress(WorkerLost):
                        await connection.call("ping", ())
        finally:
            self._drop_retained()

    # -- plumbing --------------------------------------------------------------------------------

    def _leave_if_draining(self) -> None:
        """At a clean point (no append unanswered), a stream on a draining
        worker moves: the object is taken over on another worker, as after a
        loss, and the retained bytes are sent again there."""
        connection = self._connection
        if (connection is not None and connection.draining and not self._unanswered and self._lost is None
                and self.generation):
            self._lost = connection
            self._leaving = True

    async def _call(self, method: str, args: Message, kwargs: dict[str, Any], *, recover: bool = True) -> Any:
        if recover:
            self._leave_if_draining()
        while True:
            self._raise_failure()
            if self._lost is not None and recover:
                await self._recover(self._lost)
            if self._connection is None:
                self._connection = await self._store.pool.pick()
                self._id = next(self._store._stream_ids)
            connection = self._connection
            try:
                reply = await connection.call("appender", (self._id, self.name, method, args, kwargs))
            except WorkerLost:
                if not recover or not self.generation:
                    self._connection = None
                    raise
                self._lost = connection
                continue
            self._raise_failure()  # an append before it was refused: the answer is not the whole story
            return self._absorb(reply)

    def _absorb(self, reply: Message) -> Any:
        result, generation, persisted = reply
        if generation:
            self.generation = generation
        self._confirm(persisted)
        return result

    def _confirm(self, persisted: int) -> None:
        """The bucket has bytes ``[0, persisted)``: let the arena have theirs back."""
        if persisted > self._persisted:
            self._persisted = persisted
        retained = self._retained
        while retained and retained[0][0] + len(retained[0][1]) <= self._persisted:
            _, piece = retained.popleft()
            if isinstance(piece, _StagedPart):
                piece.close()

    def _drop_retained(self) -> None:
        for _, piece in self._retained:
            if isinstance(piece, _StagedPart):
                piece.close()
        self._retained.clear()

    async def _recover(self, lost: WorkerConnection) -> None:
        """The worker died (or drains): take the object over on another and
        send what it had not confirmed."""
        await self._store.pool.fills_settled(lost)  # the bytes of WRITEs it was reading, in the arena
        if self._leaving:
            log.info("write stream of %r leaves a draining worker; taking the object over on another", self.name)
            await lost.notify("forget_appender", self._id)
            self._leaving = False
        else:
            self._store.stream_events.on_write("reconnect")
            log.warning("write stream of %r lost with its worker; taking the object over on another", self.name)
        while True:
            connection = await self._store.pool.pick(avoid=lost)
            self._connection, self._lost = connection, None
            self._id = next(self._store._stream_ids)
            try:
                reply = await connection.call("appender", (self._id, self.name, "takeover", (self.generation,), {}))
                persisted = reply[0]
                if persisted < self._persisted:
                    raise StorageError(f"write {self.name!r}: the bucket lost confirmed bytes "
                                       f"({persisted} of {self._persisted})", errno_=errno.EIO, object_name=self.name)
                self._confirm(persisted)
                for start, piece in list(self._retained):
                    skip = max(0, persisted - start)
                    if skip >= len(piece):
                        continue
                    if isinstance(piece, _StagedPart):
                        await connection.call("append_file", (self._id, skip, len(piece) - skip), passing=piece.fd)
                    elif isinstance(piece, _HeldPiece):
                        await connection.call(*self._held_append(connection, piece, skip))
                    else:
                        await connection.call("append", (self._id, None, bytes(piece[skip:])))
                return
            except WorkerLost:
                lost = connection


def _landed(data: Arriving) -> memoryview:
    try:
        return data.land()
    except OSError as err:
        raise StorageError(f"a WRITE's bytes: {err.strerror}", errno_=errno.EIO) from None


class WorkerStore:
    """One bucket, served by the data-plane workers (implements ``ObjectStore``)."""

    def __init__(self, pool: WorkerPool, layout: BucketLayout, *, read_streams: int = 1) -> None:
        self.pool = pool
        #: Bytes of one file not yet confirmed by the bucket, at most (plus one write).
        self.write_buffer = pool.settings.write_buffer
        self.arena = pool.arena
        self.bucket = pool.settings.bucket
        self.layout = layout
        self.read_policy = StreamPolicy(read_streams)
        self.stream_events = StreamEvents()
        self.rpc_errors = RpcErrorCounts()
        self._turns = itertools.count()
        self._stream_ids = itertools.count(1)
        self.stores_pages = pool.settings.page_store_buffer > 0
        self.page_stores = PageStoreCounts()
        pool.add_notice_handler(self._notice)

    async def answer_read(self, unique: int, data: object) -> bool:
        """Have a worker write the reply to READ ``unique``: ``data``, a view of
        the arena, kept until the worker answers. False (nothing written) when
        ``data`` is not in the arena, no worker runs, or the kernel refused it."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        try:
            taken: bool = await connection.call("reply", args, keep=data)
        except WorkerLost:
            return False  # the FUSE process answers; the kernel refuses it if the worker had
        return taken

    async def answer_read_soon(self, unique: int, data: object, on_answer: Callable[[bool], None]) -> bool:
        """As :meth:`answer_read`, without waiting for the worker: True once
        the call is sent (``on_answer(taken)`` runs at its answer, and with
        False if the worker dies first); False when ``data`` is not in the
        arena or no worker runs (nothing sent, ``on_answer`` never runs).
        ``data`` is kept until the answer."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        with trio.CancelScope(shield=True):  # sent whole, or answered as lost: never left waiting
            await connection.call_soon("reply", args, _reply_taken(on_answer), keep=data)
        return True

    def answer_read_now(self, unique: int, data: object, on_answer: Callable[[bool], None]) -> bool:
        """As :meth:`answer_read_soon`, sent at once or not at all: False (nothing
        sent) also while the worker's socket cannot take the call now."""
        call = self._reply_call(unique, data)
        if call is None:
            return False
        connection, args = call
        return connection.call_now("reply", args, _reply_taken(on_answer), keep=data)

    def _reply_call(self, unique: int, data: object) -> tuple[WorkerConnection, Message] | None:
        """The worker (taken in turn) and the arguments of a ``reply`` call for
        READ ``unique`` with ``data``; None when ``data`` is not in the arena
        or no worker runs."""
        ranges = []
        for part in pieces(data):
            offset = self.arena.offset_of(part)
            if offset is None:
                return None
            ranges.append((offset, cast(memoryview, part).nbytes))
        live = self.pool.live()
        if not live:
            return None
        return live[next(self._turns) % len(live)], (unique, ranges)

    def _notice(self, kind: str, value: Any) -> None:
        if kind == "event":
            direction, event = value
            (self.stream_events.on_read if direction == "read" else self.stream_events.on_write)(event)
        elif kind == "rpc_error":
            self.rpc_errors.add(*value)
        elif kind == "page_stores":
            for outcome, count, size, seconds in value:
                self.page_stores.add(outcome, size, seconds, count)

    async def _client(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self.pool.call("client", method, args, kwargs)

    async def _change(self, op: str, args: Message, done: Callable[[StorageError, int], Awaitable[object]], *,
                      passing: int | None = None) -> Any:
        """A change, made on some worker and made again on another if that
        worker dies before it answers. The first attempt may have reached the
        bucket: a refusal of a later attempt goes to ``done(err, started_ns)``,
        which returns the change's result if the refusal is that first
        attempt's own effect, and raises ``err`` otherwise. ``passing``: a
        descriptor each attempt hands to its worker."""
        started_ns = time.time_ns()
        return await self.pool.call(op, *args, after_loss=lambda err: done(err, started_ns), passing=passing)

    # -- metadata ---------------------------------------------------------------------------------

    async def get_object(self, name: str, generation: int = 0) -> ObjectMeta | None:
        return cast(ObjectMeta | None, await self._client("get_object", name, generation))

    async def stat_name(self, name: str) -> tuple[ObjectMeta | None, DirectoryMeta | None]:
        return cast(tuple[ObjectMeta | None, DirectoryMeta | None],
                    await self._client("stat_name", name, hns=self.layout.folders))

    async def list_page(self, prefix: str, *, delimiter: str = "/", page_token: str = "",
                        page_size: int = LIST_PAGE_SIZE, start: str = "", end: str = "",
                        include_trailing_delimiter: bool = False) -> ListPage:
        return cast(ListPage, await self._client(
            "list_page", prefix, delimiter=delimiter, page_token=page_token, page_size=page_size,
            folders_as_prefixes=self._folders_as_prefixes(delimiter), start=start, end=end,
            include_trailing_delimiter=include_trailing_delimiter))

    async def list_folders_page(self, prefix: str, *, page_token: str = "", page_size: int = LIST_PAGE_SIZE,
                                start: str = "", end: str = "") -> tuple[list[FolderMeta], str]:
        return cast(tuple[list[FolderMeta], str], await self._client(
            "list_folders_page", prefix, page_token=page_token, page_size=page_size, start=start, end=end))

    async def list_child_folders(self, prefix: str) -> list[FolderMeta]:
        return cast(list[FolderMeta], await self._client("list_child_folders", prefix))

    async def list_directory(self, prefix: str, *, delimiter: str = "/",
                             limit: int | None = None) -> tuple[list[ObjectMeta], list[str], bool]:
        return cast(tuple[list[ObjectMeta], list[str], bool], await self._client(
            "list_directory", prefix, folders_as_prefixes=self._folders_as_prefixes(delimiter), delimiter=delimiter,
            limit=limit))

    def _folders_as_prefixes(self, delimiter: str) -> bool:
        # The service only applies it to "/"-delimited listings.
        return self.layout.folders and delimiter == "/"

    # -- changes ----------------------------------------------------------------------------------

    # Each change is made again on another worker if its worker dies first.
    # When the first attempt had reached the bucket, the next one is refused
    # by the very preconditions that keep other writers' objects safe; each
    # change recognises its own first attempt's effect in that refusal, and
    # nothing else (see docs/reliability.md).

    async def write_object(self, name: str, source: UploadSource, size: int, *, if_generation_match: int | None,
                           metadata: Mapping[str, str] | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # Refused: is the live generation the upload's own (its bytes, made meanwhile)?
            meta = await self.get_object(name) if err.errno == errno.ESTALE else None
            if (meta is None or meta.generation == if_generation_match or meta.size != size
                    or not made_during(meta, started_ns)
                    or meta.crc32c != await trio.to_thread.run_sync(_crc32c_of, source, size)):
                raise err
            return meta

        # The worker reads the staged file itself, through the descriptor the call passes.
        return cast(ObjectMeta, await self._change(
            "write_object", (name, size, {"if_generation_match": if_generation_match, "metadata": metadata}), done,
            passing=source))

    async def delete_object(self, name: str, *, if_generation_match: int | None = None) -> None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT:  # gone: deleted by the first attempt, or at least gone
                raise err

        await self._change("client", ("delete_object", (name,), {"if_generation_match": if_generation_match}), done)

    async def move_object(self, source: str, destination: str, *,
                          if_source_generation_match: int | None = None,
                          if_generation_match: int | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # The source is gone: moved by the first attempt if the destination
            # is a generation made meanwhile with the source's bytes.
            moved = await self.get_object(destination) if err.errno == errno.ENOENT else None
            if moved is None or moved.generation == if_generation_match or not made_during(moved, started_ns):
                raise err
            return moved

        return cast(ObjectMeta, await self._change("client", ("move_object", (source, destination), {
            "if_source_generation_match": if_source_generation_match,
            "if_generation_match": if_generation_match}), done))

    async def update_metadata(self, name: str, generation: int, metadata: Mapping[str, str], *,
                              if_metageneration_match: int | None = None) -> ObjectMeta:
        async def done(err: StorageError, started_ns: int) -> ObjectMeta:
            # The metageneration moved on: by the first attempt if it moved by
            # one and the object carries exactly what that attempt set.
            meta = await self.get_object(name, generation) if err.errno == errno.ESTALE else None
            if (meta is None or if_metageneration_match is None
                    or meta.metageneration != if_metageneration_match + 1
                    or any(meta.metadata.get(key) != value for key, value in metadata.items())):
                raise err
            return meta

        return cast(ObjectMeta, await self._change("client", ("update_metadata", (name, generation, metadata), {
            "if_metageneration_match": if_metageneration_match}), done))

    async def create_folder(self, prefix: str) -> FolderMeta | None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.EEXIST:
                raise err

        return cast(FolderMeta | None, await self._change("client", ("create_folder", (prefix,), {}), done))

    async def delete_folder(self, prefix: str) -> None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT:
                raise err

        await self._change("client", ("delete_folder", (prefix,), {}), done)

    async def rename_folder(self, source: str, destination: str) -> FolderMeta | None:
        async def done(err: StorageError, started_ns: int) -> None:
            if err.errno != errno.ENOENT or (await self.stat_name(destination.rstrip("/")))[1] is None:
                raise err

        return cast(FolderMeta | None, await self._change("client", ("rename_folder", (source, destination), {}), done))

    # -- data -------------------------------------------------------------------------------------

    async def drain_page_stores(self, ino: int, epoch: int) -> None:
        if self.stores_pages:
            await self.pool.on_every_worker("drain_stores", ino, epoch)  # the worker takes it as the node id

    def skip_page_store(self, ticket: int) -> None:
        self.pool.broadcast_soon("skip_store", ticket)

    def open_reader(self, name: str, generation: int) -> _Reader:
        return _Reader(self, name, generation)

    def open_appender(self, name: str) -> _Appender:
        return _Appender(self, name)

    async def read_objects_whole(self, items: list[tuple[str, int, int]], *,
                                 concurrency: int) -> list[bytes | memoryview | StorageError]:
        return await self._batch("whole", items, [length for _, _, length in items], concurrency)

    async def read_objects_composed(self, items: list[tuple[str, int, int, int | None]], *, concurrency: int,
                                    temporary_name: Callable[[], str]
                                    ) -> list[bytes | memoryview | StorageError]:
        if not self.layout.compose:
            return await self.read_objects_whole([item[:3] for item in items], concurrency=concurrency)
        names = [temporary_name() for _ in items]
        return await self._batch("composed", items, [size for _, _, size, _ in items], concurrency, names)

    async def _batch(self, op: str, items: list[Any], lengths: list[int], concurrency: int, *args: Any
                     ) -> list[bytes | memoryview | StorageError]:
        """A batch read: each item's bytes land in an arena region of its own,
        allocated here as a read's (bytes in the answer when the arena is full)."""
        regions = [self.arena.allocate(length) if length > 0 else None for length in lengths]
        targets = [None if region is None else region[0] for region in regions]
        answers = await self.pool.call(op, items, concurrency, *args, targets, keep=regions)
        # An answer is an int (the length landed) only for an item with a region.
        return [cast(tuple[int, memoryview], region)[1][:answer] if isinstance(answer, int) else answer
                for answer, region in zip(answers, regions)]


def _crc32c_of(fd: int | None, size: int) -> int | None:
    """CRC32C of the first ``size`` bytes of a staged file (in a thread: disk I/O)."""
    return 0 if fd is None else file_crc32c(fd, size)  # an empty upload has no staged file


def _reply_taken(on_answer: Callable[[bool], None]) -> Callable[[bool, object], None]:
    """A ``reply`` call's answer as ``on_answer(taken)``: False too if the worker died first."""
    def answered(ok: bool, value: object) -> None:
        on_answer(ok and value is True)
    return answered
