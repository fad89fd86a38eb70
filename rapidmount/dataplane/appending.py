"""Appending: :class:`_Appender`, a :class:`~rapidmount.dataplane.store.WorkerStore`'s
:class:`~rapidmount.storage.seam.ObjectAppender`, whose stream lives in a worker.

An append of a large write keeps the ``bytes`` the kernel's request came
in, and the worker reads them from this process's memory
(``process_vm_readv``), so nothing is copied here; a small write, or any
write where the workers cannot read this memory, is copied into the arena
once. Either way the bytes stay until the bucket confirmed them, so a
worker's death loses nothing: another worker takes the object over at its
persisted size and sends the rest again. Appended from a staged file (its
descriptor passed with ``socket.send_fds``), the bytes stay in that file
until confirmed.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import trio

from rapidmount.core.locks import QuickLock
from rapidmount.dataplane.append_pieces import (
    APPEND_PIECE, HELD_APPEND_PIECE, PEER_WRITE_MIN, _ArenaHeldPiece, _HeldPiece, _Piece, _StagedPart)
from rapidmount.dataplane.connection import WorkerConnection, WorkerLost
from rapidmount.dataplane.store_base import WorkerStoreBase, own_new_object
from rapidmount.fuse.write_pipes import PipedWrite
from rapidmount.shared.messages import Message
from rapidmount.shared.views import Arriving
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import ObjectMeta

log = logging.getLogger("rapidmount.dataplane")


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

    def __init__(self, store: WorkerStoreBase, name: str) -> None:
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
