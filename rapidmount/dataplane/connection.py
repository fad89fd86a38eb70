"""The FUSE process's connection to one data-plane worker: :class:`WorkerConnection`.

Calls go to the worker over a socket pair, each under an id its answer
carries back; the worker's notices come the same way. Descriptors go on a
second socket (``socket.send_fds``), and the WRITEs its fill thread reads
from the WRITE pipes on a third. A call to a worker that dies fails with
:class:`WorkerLost`; who made the call decides what to do again elsewhere.
"""

from __future__ import annotations

import errno
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from rapidmount.shared.messages import (
    DESCRIPTOR_TAG, FAILED, FILL, NOTICE, PASSES_DESCRIPTOR, FrameReader, Message, encode)
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout

log = logging.getLogger("rapidmount.dataplane")

#: Calls up to this size go out whole or not at all (``call_now``): a unix
#: stream socket puts a send this small into one buffer, or none.
WHOLE_FRAME = 4096


class WorkerLost(StorageError):
    """The worker serving a call died before answering (the call may be redone elsewhere)."""

    def __init__(self, message: str = "data-plane worker lost") -> None:
        super().__init__(message, errno_=errno.EIO)


class _Waiter:
    __slots__ = ("event", "ok", "value", "keep", "on_answer")

    def __init__(self, keep: object, on_answer: Callable[[bool, object], None] | None = None) -> None:
        self.event = trio.Event()
        self.ok = False
        self.value: object = None
        self.keep = keep  # e.g. the arena region the worker writes into, alive until it answered
        self.on_answer = on_answer

    def answer(self, ok: bool, value: object) -> None:
        self.ok, self.value, self.keep = ok, value, None
        self.event.set()
        if self.on_answer is not None:
            self.on_answer(ok, value)


class WorkerConnection:
    """One live worker: its process and socket, and the calls waiting for it."""

    def __init__(self, index: int, process: trio.Process, sock: socket.socket,
                 descriptor_socket: socket.socket, on_notice: Callable[[str, object], None],
                 on_lost: Callable[[WorkerConnection], None] | None = None,
                 pipe_ids: frozenset[int] = frozenset(), fill_socket: socket.socket | None = None) -> None:
        self.index = index
        self._on_lost = on_lost
        #: The WRITE pipes this worker holds (:mod:`~rapidmount.fuse.write_pipes`),
        #: and the socket its fill thread takes their WRITEs from (non-blocking).
        self.pipe_ids = pipe_ids
        self._fill_socket = fill_socket
        #: WRITEs handed to it so far: an append of their bytes waits in the worker for this many fills.
        self.fills_sent = 0
        self.process = process
        self._socket = sock  # non-blocking; the stream below wraps it
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        self._send_lock = trio.StrictFIFOLock()
        #: Our end of the socket descriptors go through (non-blocking), until the worker is gone.
        self._descriptor_socket: socket.socket | None = descriptor_socket
        self._descriptor_lock = trio.StrictFIFOLock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._on_notice = on_notice
        self.alive = True
        #: Past --worker-memory-limit: no new calls or streams; the ones it
        #: serves move at their next clean point, then it is stopped.
        self.draining = False
        self._drain_requested = trio.Event()
        self.ready = trio.Event()
        self._gone = trio.Event()
        self.layout: BucketLayout | None = None
        self.fatal: str | None = None
        #: Why the worker cannot read appended bytes from this process's
        #: memory (its probe at start), or None: it can.
        self.peer_refusal: str | None = "not told"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def can_call_now(self) -> bool:
        """Alive, and no frame part-way out: ``call_now`` may send."""
        return self.alive and not self._send_lock.locked()

    @property
    def reads_our_memory(self) -> bool:
        """Appended bytes may stay in this process: the worker reads them here."""
        return self.peer_refusal is None

    @property
    def busy(self) -> bool:
        """Calls are waiting for this worker's answer."""
        return bool(self._waiting)

    def drain(self) -> None:
        self.draining = True
        self._drain_requested.set()

    async def exited_or_draining(self) -> None:
        """Return once the process exited, was given up for lost, or was asked to drain."""
        async with trio.open_nursery() as nursery:
            async def until(event_wait: Callable[[], Awaitable[object]]) -> None:
                await event_wait()
                nursery.cancel_scope.cancel()
            nursery.start_soon(until, self.process.wait)
            nursery.start_soon(until, self._drain_requested.wait)
            nursery.start_soon(until, self._gone.wait)

    async def send(self, message: Message) -> None:
        if not self.alive:
            raise WorkerLost()
        await self.send_frame(encode(message))

    async def send_frame(self, frame: bytes) -> None:
        try:
            if self._send_lock.locked():
                async with self._send_lock:
                    await self._stream.send_all(frame)
                return
            # Nobody is part-way through a frame: what the socket takes now
            # goes at once, without a turn of the scheduler (one per append
            # piece); the rest, if any, under the lock before anyone else's.
            sent = self._send_some(frame)
            if sent == len(frame):
                return
            self._send_lock.acquire_nowait()  # free: nothing awaited since the check
            try:
                with trio.CancelScope(shield=sent > 0):  # never half a frame
                    await self._stream.send_all(memoryview(frame)[sent:])
            finally:
                self._send_lock.release()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise WorkerLost() from None

    def _send_some(self, frame: bytes) -> int:
        """What the socket takes of ``frame`` now (0 when it is full)."""
        try:
            return self._socket.send(frame)
        except BlockingIOError:
            return 0

    def call_now(self, op: str, args: Message, on_answer: Callable[[bool, object], None], *,
                 keep: object = None) -> bool:
        """``call_soon`` without a wait: sent if the socket takes the whole call
        now; False (nothing sent) while a frame is part-way out, the socket is
        full, the call too large, or the worker gone."""
        if not self.can_call_now:
            return False
        call_id = next(self._ids)
        frame = encode((call_id, op, args))
        if len(frame) > WHOLE_FRAME:
            return False
        try:
            sent = self._send_some(frame)
        except OSError:
            return False  # gone: the receiver sees the socket's end, and the next call says so
        if not sent:
            return False
        self._waiting[call_id] = _Waiter(keep, on_answer)
        if sent != len(frame):
            # A unix socket takes a frame this small whole or not at all; half of
            # one would leave the worker reading garbage, so it is given up.
            log.error("data-plane worker %d (pid %d): its socket took %d bytes of a %d-byte call; giving it up",
                      self.index, self.pid, sent, len(frame))
            self.lost()
        return True

    async def pass_descriptor(self, tag: int, fd: int) -> None:
        """Pass a copy of ``fd`` to the worker under ``tag`` (SCM_RIGHTS)."""
        record = DESCRIPTOR_TAG.pack(tag)
        async with self._descriptor_lock:
            while True:
                sock = self._descriptor_socket
                if sock is None or not self.alive:
                    raise WorkerLost()
                try:
                    sent = socket.send_fds(sock, [record], [fd])
                except BlockingIOError:
                    try:
                        await trio.lowlevel.wait_writable(sock)
                    except trio.ClosedResourceError:  # the worker was given up meanwhile
                        raise WorkerLost() from None
                    continue
                except OSError:
                    raise WorkerLost() from None
                if sent != len(record):  # a unix socket takes a record this small whole, or not at all
                    raise WorkerLost(f"data-plane worker {self.index}: descriptor socket took {sent} bytes")
                return

    def send_fill(self, pipe_id: int, arena_offset: int, size: int, unique: int) -> bool:
        """Hand a WRITE whose bytes wait in pipe ``pipe_id`` to the worker's
        fill thread; False if it could not be sent (the worker is gone)."""
        sock = self._fill_socket
        if sock is None or not self.alive:
            return False
        try:
            sock.send(FILL.pack(pipe_id, size, arena_offset, unique))
        except OSError:  # gone; or, past what any pipe count allows, full
            return False
        self.fills_sent += 1
        return True

    async def notify(self, kind: str, payload: object) -> None:
        """A notice that needs no answer; lost if the worker is gone."""
        try:
            await self.send((NOTICE, kind, payload))
        except WorkerLost:
            pass

    async def call(self, op: str, args: Message, *, keep: object = None, passing: int | None = None) -> Any:
        """``op(*args)`` on the worker; its result, or the StorageError it raised.

        ``passing``: a descriptor the call hands to the worker (a copy; the
        caller keeps its own), passed on the descriptor socket first."""
        waiter = _Waiter(keep)
        keep = None  # the waiter's until the answer: an error's traceback must not keep it
        await self._post(op, args, waiter, passing)
        await waiter.event.wait()  # on cancellation the waiter stays until the worker answers
        if waiter.ok:
            return waiter.value
        raise cast(BaseException, waiter.value)

    async def call_soon(self, op: str, args: Message, on_answer: Callable[[bool, object], None], *,
                        keep: object = None) -> None:
        """Send ``op(*args)`` without waiting: ``on_answer(ok, value)`` runs when
        the worker answers (``value`` is WorkerLost if it died first)."""
        await self._post(op, args, _Waiter(keep, on_answer))

    async def _post(self, op: str, args: Message, waiter: _Waiter, passing: int | None = None) -> _Waiter:
        """Send a call; a worker already gone answers it with WorkerLost at once."""
        call_id = next(self._ids)
        self._waiting[call_id] = waiter
        try:
            if passing is None:
                await self.send((call_id, op, args))
            else:
                # Both or neither: a descriptor without its call would stay open in the worker.
                with trio.CancelScope(shield=True):
                    await self.pass_descriptor(call_id, passing)
                    await self.send((call_id, op, args, PASSES_DESCRIPTOR))
        except WorkerLost as err:
            if self._waiting.pop(call_id, None) is not None:
                waiter.answer(False, err)
        return waiter

    async def receive(self) -> None:
        """Deliver answers and notices until the worker's socket closes, then fail what is left."""
        frames = FrameReader()
        try:
            while True:
                data = await self._stream.receive_some(1 << 20)
                if not data:
                    break
                for call_id, status, value in frames.feed(data):
                    if call_id == NOTICE:
                        self._notice(status, value)
                        continue
                    waiter = self._waiting.pop(call_id, None)
                    if waiter is not None:
                        waiter.answer(status != FAILED, value)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ValueError):
            pass
        self.lost()

    def _notice(self, kind: str, value: object) -> None:
        if kind == "ready":
            self.layout = cast(BucketLayout, value)
            self.ready.set()
        elif kind == "fatal":
            self.fatal = str(value)
            self.ready.set()
        elif kind == "peer_reads":
            self.peer_refusal = None if value is None else str(value)
        elif kind == "write_pipe":  # it holds a pipe made after it started
            self.pipe_ids = self.pipe_ids | {cast(int, value)}
        else:
            self._on_notice(kind, value)

    def lost(self) -> None:
        """Fail every waiting call with WorkerLost (once the worker can no longer write anywhere)."""
        if self._on_lost is not None:
            on_lost, self._on_lost = self._on_lost, None
            on_lost(self)  # first: the WRITE bytes it left in pipes land before any append is sent again
        self.alive = False
        self._close_descriptor_socket()
        self._close_fill_socket()
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            waiter.answer(False, WorkerLost(f"data-plane worker {self.index} (pid {self.pid}) lost"))
        self.ready.set()
        self._gone.set()

    def _close_descriptor_socket(self) -> None:
        sock, self._descriptor_socket = self._descriptor_socket, None
        if sock is not None:
            trio.lowlevel.notify_closing(sock)  # a send waiting for room gives up
            sock.close()

    def _close_fill_socket(self) -> None:
        sock, self._fill_socket = self._fill_socket, None
        if sock is not None:
            sock.close()

    async def close(self) -> None:
        self.alive = False
        self._close_descriptor_socket()
        self._close_fill_socket()
        with trio.move_on_after(1):
            await self._stream.aclose()
