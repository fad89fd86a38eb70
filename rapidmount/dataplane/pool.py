"""The FUSE process's side of the data plane: worker processes, supervised.

:class:`WorkerPool` starts ``--workers`` processes, talks to each over a
socket pair with trio, and replaces any that dies, or that stops answering
its heartbeat (a hang is handled as a death). A call to a worker that
dies fails with :class:`WorkerLost`; who made the call decides what to do
again elsewhere (the store retries unary calls, a reader re-reads its range
on another worker, an appender takes its object over on another worker).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from rapidmount.shared import allocator
from rapidmount.shared import peer_memory
from rapidmount.shared.arena import Arena
from rapidmount.shared.messages import (
    DESCRIPTOR_TAG, FAILED, FILL, FUSE_DEVICE, NOTICE, PASSES_DESCRIPTOR, WRITE_PIPE_TAGS, FrameReader, Message,
    encode)
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.dataplane.write_pipes import WritePipes
from rapidmount.shared.exits import MountError
from rapidmount.shared import fuse_codec as codec
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout

log = logging.getLogger("rapidmount.dataplane")

#: Calls up to this size go out whole or not at all (``call_now``): a unix
#: stream socket puts a send this small into one buffer, or none.
WHOLE_FRAME = 4096

#: A worker that has not said "ready" by then (plus the connect timeout) is killed.
START_GRACE_S = 10.0
#: A worker that dies sooner than this after its start is restarted only after a pause.
CRASH_LOOP_S = 2.0
STOP_TIMEOUT_S = 5.0
#: A draining worker is stopped once no call waits on it, or after this long.
DRAIN_TIMEOUT_S = 30.0
DRAIN_POLL_S = 0.02
#: How often a stream leaving a draining worker looks whether its fill thread has read its WRITEs.
FILL_POLL_S = 0.001
#: How often a live worker is asked to answer, and the longest it may take
#: (at most --stall-timeout): past it the worker hangs and is killed.
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 10.0
#: After killing a hung worker, how long its threads get to die before its calls
#: are failed over. One may stay in the kernel (a page-cache store waiting on a
#: page whose READ waits for this worker's answer), so exit is not waited for.
KILL_GRACE_S = 1.0


def private_memory(status: str) -> int | None:
    """Bytes of a process's private memory (``RssAnon``: heap and anonymous
    maps, not shared memory) from the text of its /proc/PID/status."""
    for line in status.splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return None


def _private_memory_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            return private_memory(status.read())
    except OSError:  # gone, or no /proc
        return None


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
        #: The WRITE pipes this worker holds (:mod:`~rapidmount.dataplane.write_pipes`),
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


class WorkerPool:
    """``count`` worker processes serving one mount, each replaced when it dies."""

    def __init__(self, settings: WorkerSettings, count: int, arena: Arena,
                 write_pipes: WritePipes | None = None) -> None:
        if count < 1:
            raise ValueError("at least one worker")
        self.write_pipes = write_pipes
        if write_pipes is not None:
            write_pipes.on_replaced = self._share_pipe
        self.settings = settings
        self.count = count
        self.arena = arena
        self._notice_handlers: list[Callable[[str, object], None]] = []
        self._slots: list[WorkerConnection | None] = [None] * count
        self._changed = trio.Event()
        self._next = itertools.count()
        self._stopping = False
        self.replaced = 0
        self._starting: set[WorkerConnection] = set()
        self._connected: set[WorkerConnection] = set()  # started or starting, until stopped
        self._nursery: trio.Nursery | None = None
        self.started_notices: list[Callable[[WorkerConnection], Awaitable[object]]] = []
        self._fuse_fd: int | None = None
        self._fuse_connection: int | None = None
        # Each worker checks at its start that it reads these very bytes in this process.
        self._peer_token = os.urandom(16)
        self._worker_settings = dataclasses.replace(
            settings, peer_probe=(peer_memory.address_of(self._peer_token), self._peer_token))
        self._append_path_said: str | None | bool = False  # the last refusal logged (False: none yet)

    # -- choosing a worker ---------------------------------------------------------------------

    def live(self) -> list[WorkerConnection]:
        return [c for c in self._slots if c is not None and c.alive and c.layout is not None and not c.draining]

    async def pick(self, *, avoid: WorkerConnection | None = None, after: int | None = None) -> WorkerConnection:
        """A live worker: the next in turn, or the one ``after`` slots on; waits while none is live."""
        with trio.move_on_after(self.settings.retry_deadline):
            while True:
                live = self.live()
                if avoid is not None and len(live) > 1:
                    live = [c for c in live if c is not avoid]
                if live:
                    turn = next(self._next) if after is None else after
                    return live[turn % len(live)]
                if self._stopping:
                    raise WorkerLost("the data plane is stopping")
                changed = self._changed
                await changed.wait()
        raise WorkerLost(f"no data-plane worker has been running for {self.settings.retry_deadline:g}s")

    async def call(self, op: str, *args: Any, retry_lost: bool = True,
                   after_loss: Callable[[StorageError], Awaitable[object]] | None = None,
                   keep: object = None, passing: int | None = None) -> Any:
        """``op`` on some worker; redone on another if the worker dies (``retry_lost``).

        A change redone may be refused because its first attempt reached the
        bucket: such a refusal goes to ``after_loss(err)``, which returns the
        result if the refusal is that attempt's own effect, and raises otherwise.
        ``keep`` and ``passing`` are :meth:`WorkerConnection.call`'s, for each attempt."""
        connection = await self.pick()
        lost = False
        while True:
            try:
                return await connection.call(op, args, keep=keep, passing=passing)
            except WorkerLost:
                if not retry_lost:
                    raise
                lost = True
                log.info("%s lost with its data-plane worker; making it again on another", op)
                connection = await self.pick(avoid=connection)
            except StorageError as err:
                if not lost or after_loss is None:
                    raise
                return await after_loss(err)

    async def on_every_worker(self, op: str, *args: Any) -> None:
        """``op`` on every worker that runs, draining ones too, side by side;
        returns once each has answered or exited. A worker given up for lost
        may not have exited yet: a page-cache store of it, held in the kernel
        until a READ is answered elsewhere, can still land, so it is waited
        for, up to the retry deadline (by then that READ has an answer or EIO)."""
        async def one(connection: WorkerConnection) -> None:
            try:
                await connection.call(op, args)
            except WorkerLost:
                with trio.move_on_after(self.settings.retry_deadline + STOP_TIMEOUT_S):
                    await connection.process.wait()

        async with trio.open_nursery() as nursery:
            for connection in list(self._connected):
                nursery.start_soon(one, connection)

    def broadcast_soon(self, kind: str, payload: object) -> None:
        """:meth:`broadcast` from synchronous code, in the pool's nursery (dropped if it is not running)."""
        if self._nursery is not None and not self._stopping:
            self._nursery.start_soon(self.broadcast, kind, payload)

    async def broadcast(self, kind: str, payload: object) -> None:
        """A notice to every worker, ready or still starting (one may wait for a token)."""
        for connection in list(self._connected):
            if connection.alive:
                await connection.notify(kind, payload)

    # -- running -----------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[BucketLayout] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every worker; ``task_status.started(layout)`` once the first is ready.

        Raises :class:`MountError` if the first worker cannot open the bucket.
        """
        self._stopping = False
        self._slots = [None] * self.count
        refused = peer_memory.let_descendants_read()
        if refused is not None:
            log.debug("cannot let the data-plane workers read this process's memory under Yama: %s", refused)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery  # answers of a draining worker outlive its slot's turn
            layout = await nursery.start(self._keep, 0, True)
            for index in range(1, self.count):
                nursery.start_soon(self._keep, index, False)
            task_status.started(layout)

    async def _keep(self, index: int, first: bool, *,
                    task_status: trio.TaskStatus[BucketLayout] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep slot ``index`` served: restart its worker whenever it dies.

        With ``first``, ``task_status.started(layout)`` after the first start,
        and a first start that fails raises :class:`MountError` (the bucket
        cannot be opened); other slots only log and try again.
        """
        while not self._stopping:
            began = trio.current_time()
            try:
                connection = await self._spawn(index)
            except OSError as err:
                if first:
                    raise MountError(f"cannot start a data-plane worker: {err.strerror or err}") from None
                log.error("cannot start data-plane worker %d: %s", index, err.strerror or err)
                await trio.sleep(CRASH_LOOP_S)
                continue
            receiving = trio.CancelScope()
            assert self._nursery is not None, "run() first"
            self._nursery.start_soon(self._receive, connection, receiving)
            async with trio.open_nursery() as inner:
                with trio.move_on_after(self.settings.connect_timeout + START_GRACE_S):
                    await connection.ready.wait()
                if connection.layout is not None:
                    self._set(index, connection)
                    self._say_append_path(connection)
                    if first:
                        task_status.started(connection.layout)
                        first = False
                    log.debug("data-plane worker %d started (pid %d)", index, connection.pid)
                    inner.start_soon(self._watch, connection)
                    await connection.exited_or_draining()
                inner.cancel_scope.cancel()
            if connection.draining and connection.process.returncode is None and not self._stopping:
                # A replacement takes the slot now; the old worker finishes what it serves.
                self._set(index, None)
                self.replaced += 1
                self._nursery.start_soon(self._drain, connection, receiving)
                continue
            if connection.layout is not None:
                # Answers written before the exit are still delivered: the receiver
                # stops at the socket's end.
                with trio.move_on_after(1):
                    while connection.alive:
                        await trio.sleep(0.01)
            receiving.cancel()
            self._set(index, None)
            reason = connection.fatal or ("exited at its start" if connection.process.poll() is not None
                                          else "did not start in time")
            await self._stop_one(connection)
            if connection.layout is None:
                if first:
                    raise MountError(connection.fatal or f"the data-plane worker {reason}")
                log.error("data-plane worker %d: %s", index, reason)
            elif not self._stopping:
                self.replaced += 1
                log.warning("data-plane worker %d (pid %d) exited with %s; starting another", index,
                            connection.pid, _describe_exit(connection.process.returncode))
            if trio.current_time() - began < CRASH_LOOP_S and not self._stopping:
                await trio.sleep(CRASH_LOOP_S)

    @staticmethod
    async def _receive(connection: WorkerConnection, scope: trio.CancelScope) -> None:
        with scope:
            await connection.receive()

    async def _drain(self, connection: WorkerConnection, receiving: trio.CancelScope) -> None:
        """Stop a draining worker once no call waits on it (its streams move
        to other workers at their next call), or after DRAIN_TIMEOUT_S."""
        with trio.move_on_after(DRAIN_TIMEOUT_S):
            while connection.busy and connection.alive:
                await trio.sleep(DRAIN_POLL_S)
        log.info("data-plane worker %d (pid %d) drained; stopping it", connection.index, connection.pid)
        await self._stop_one(connection)
        receiving.cancel()

    async def _watch(self, connection: WorkerConnection) -> None:
        """Kill a worker whose event loop stops answering: its calls then fail
        with WorkerLost and are made again elsewhere. Drain one whose private
        memory passed --worker-memory-limit: it gets no new work, and is
        stopped once it has none."""
        timeout = min(self.settings.stall_timeout, HEARTBEAT_TIMEOUT_S)
        limit = self.settings.memory_limit
        while connection.alive:
            await trio.sleep(HEARTBEAT_S)
            with trio.move_on_after(timeout) as waited:
                try:
                    await connection.call("ping", ())
                except WorkerLost:
                    return
            if not connection.alive:
                return
            if waited.cancelled_caught:
                log.error("data-plane worker %d (pid %d) did not answer for %gs; killing it", connection.index,
                          connection.pid, timeout)
                connection.process.kill()
                with trio.move_on_after(KILL_GRACE_S):
                    await connection.process.wait()
                connection.lost()  # killed: it runs no more code, whether or not it has exited
                return
            held = _private_memory_of(connection.pid) if limit else None
            if held is not None and held > limit:
                log.warning("data-plane worker %d (pid %d) holds %d MiB of private memory, past "
                            "--worker-memory-limit (%d MiB); replacing it", connection.index, connection.pid,
                            held >> 20, limit >> 20)
                connection.drain()
                return

    def _say_append_path(self, connection: WorkerConnection) -> None:
        """How appended bytes reach the workers, at info: once, and again only
        if a later worker's probe says otherwise."""
        if connection.peer_refusal == self._append_path_said:
            return
        self._append_path_said = connection.peer_refusal
        if connection.peer_refusal is None:
            log.info("appends: data-plane workers read written bytes straight from this process's memory "
                     "(process_vm_readv); small writes are copied into the shared arena")
        else:
            log.info("appends: written bytes are copied into the shared arena; data-plane workers cannot read "
                     "them in this process (%s)", connection.peer_refusal)

    def add_notice_handler(self, handler: Callable[[str, object], None]) -> None:
        self._notice_handlers.append(handler)

    def _notice(self, kind: str, value: object) -> None:
        if kind == "write_unanswered":  # a worker without /dev/fuse read a WRITE's bytes
            unique, size = cast(tuple[int, int], value)
            self.answer_write(unique, size)
            return
        for handler in self._notice_handlers:
            handler(kind, value)

    def _set(self, index: int, connection: WorkerConnection | None) -> None:
        self._slots[index] = connection
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def share_fuse_fd(self, fd: int, fuse_connection: int | None = None) -> None:
        """Give every worker, now and later, the mount's /dev/fuse descriptor,
        for page-cache stores and READ replies, and the number of its FUSE
        connection (fusectl's), which a worker aborts if this process dies
        while one of its stores waits (:func:`~rapidmount.workers.pagestore.abort_connection`)."""
        self._fuse_fd = fd
        self._fuse_connection = fuse_connection
        assert self._nursery is not None, "run() first"
        for connection in list(self._connected):
            self._nursery.start_soon(self._send_fuse_fd, connection)

    def answer_write(self, unique: int, result: int) -> None:
        """Answer WRITE ``unique``: ``result`` bytes written, or ``-errno``.
        One answered already is refused by the kernel (ENOENT), harmlessly."""
        if self._fuse_fd is None:
            return
        reply = codec.reply_write(unique, result) if result >= 0 else codec.reply_error(unique, -result)
        try:
            os.write(self._fuse_fd, reply)
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENODEV):
                log.warning("a WRITE's answer was refused: %s", err.strerror)

    async def fills_settled(self, connection: WorkerConnection) -> None:
        """Return once every WRITE handed to ``connection`` has its bytes in
        the arena: its fill thread read them, or, the worker gone, this
        process did. A stream that leaves a worker sends them elsewhere
        only then."""
        pipes = self.write_pipes
        while pipes is not None and pipes.unfilled(connection):
            if not connection.alive:
                pipes.lost(connection, self.answer_write)
                return
            await trio.sleep(FILL_POLL_S)

    def _share_pipe(self, pipe_id: int, read_fd: int) -> None:
        """A WRITE pipe replaced one a lost worker held: the workers running
        get it too (workers started later inherit it)."""
        for connection in list(self._connected):
            if connection.alive:
                self._pass_pipe(connection, pipe_id, read_fd)

    def _send_missing_pipes(self, connection: WorkerConnection) -> None:
        """Pipes replaced while ``connection`` started, after it inherited the
        ones of the moment (from now on it is among those told of each new one)."""
        if self.write_pipes is None:
            return
        for pipe in self.write_pipes.pipes:
            if pipe.id not in connection.pipe_ids:
                self._pass_pipe(connection, pipe.id, pipe.read_fd)

    def _pass_pipe(self, connection: WorkerConnection, pipe_id: int, read_fd: int) -> None:
        """Pass a duplicate of pipe ``pipe_id``'s read end to the worker, so
        that a pipe replaced again meanwhile is never mistaken for it."""
        if self._nursery is None:
            return
        try:
            fd = os.dup(read_fd)
        except OSError as err:  # it reads WRITEs through that pipe in this process instead
            log.warning("could not pass a WRITE pipe to data-plane worker %d: %s", connection.index, err.strerror)
            return
        self._nursery.start_soon(self._send_pipe, connection, pipe_id, fd)

    async def _send_pipe(self, connection: WorkerConnection, pipe_id: int, fd: int) -> None:
        try:
            await connection.pass_descriptor(WRITE_PIPE_TAGS + pipe_id, fd)
        except WorkerLost:  # it is gone: its replacement inherits the pipe
            pass
        finally:
            os.close(fd)

    def _worker_lost(self, connection: WorkerConnection) -> None:
        if self.write_pipes is not None:
            # Stopping, the pipes are closed next: none is replaced (nor said to be).
            self.write_pipes.lost(connection, self.answer_write, replace=not self._stopping)

    async def _send_fuse_fd(self, connection: WorkerConnection) -> None:
        if self._fuse_fd is None:
            return
        try:
            await connection.pass_descriptor(FUSE_DEVICE, self._fuse_fd)
            if self._fuse_connection is not None:
                await connection.notify("fuse_connection", self._fuse_connection)
        except WorkerLost:  # its replacement gets it
            log.debug("could not pass /dev/fuse to data-plane worker %d: it is gone", connection.index)

    async def _spawn(self, index: int) -> WorkerConnection:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        descriptors_ours, descriptors_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pipes = self.write_pipes.read_ends() if self.write_pipes is not None else []
        fills_ours, fills_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if pipes else (None, None)
        try:
            command = [sys.executable, "-m", "rapidmount.workers.main", "--socket-fd", str(theirs.fileno()),
                       "--arena-fd", str(self.arena.fd), "--fd-socket", str(descriptors_theirs.fileno()),
                       "--index", str(index)]
            passed = [theirs.fileno(), self.arena.fd, descriptors_theirs.fileno()]
            if fills_theirs is not None:
                command += ["--write-pipes", ",".join(f"{pipe_id}:{fd}" for pipe_id, fd in pipes),
                            "--fill-socket", str(fills_theirs.fileno())]
                passed += [fd for _, fd in pipes] + [fills_theirs.fileno()]
            # Logs go to the log file, or to stderr in the foreground; a
            # daemon's workers hold no terminal and no caller's pipe open.
            process = await trio.lowlevel.open_process(
                command, pass_fds=passed, env=allocator.worker_environment(self.settings.allocator),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=None if self.settings.log_to_stderr else subprocess.DEVNULL)
        except BaseException:
            ours.close()
            descriptors_ours.close()
            if fills_ours is not None:
                fills_ours.close()
            raise
        finally:
            theirs.close()
            descriptors_theirs.close()
            if fills_theirs is not None:
                fills_theirs.close()
        ours.setblocking(False)
        descriptors_ours.setblocking(False)
        if fills_ours is not None:
            fills_ours.setblocking(False)
        connection = WorkerConnection(index, process, ours, descriptors_ours, self._notice, self._worker_lost,
                                      frozenset(pipe_id for pipe_id, _ in pipes), fills_ours)
        self._starting.add(connection)
        try:
            await connection.send_frame(encode(self._worker_settings))
            for hello in self.started_notices:
                await hello(connection)
            self._connected.add(connection)
            self._send_missing_pipes(connection)
            await self._send_fuse_fd(connection)
        finally:
            self._starting.discard(connection)
        return connection

    async def stop(self) -> None:
        """Close every worker's socket (they exit), then wait for them, killing laggards."""
        self._stopping = True
        self._changed.set()
        # Every worker started: serving, starting, draining, and one still waiting
        # for its "ready" (in none of the slots yet; it may be hung).
        everyone = {c for c in (*self._slots, *self._starting, *self._connected) if c is not None}
        for connection in everyone:
            await self._stop_one(connection)

    async def _stop_one(self, connection: WorkerConnection) -> None:
        self._connected.discard(connection)
        await connection.close()
        with trio.move_on_after(STOP_TIMEOUT_S):
            await connection.process.wait()
        if connection.process.returncode is None:
            connection.process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S) as waited:
                await connection.process.wait()
            if waited.cancelled_caught and self._nursery is not None:
                # A thread held in the kernel (a page-cache store whose page waits for
                # a READ) delays the exit; the replacement does not wait for it.
                log.warning("data-plane worker %d (pid %d) is still exiting; not waiting for it",
                            connection.index, connection.pid)
                self._nursery.start_soon(connection.process.wait)
        connection.lost()


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "no status"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"
