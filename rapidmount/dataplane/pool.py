"""The FUSE process's side of the data plane: worker processes, supervised.

:class:`WorkerPool` starts ``--workers`` processes
(:mod:`~rapidmount.dataplane.worker_process`), talks to each over its
:class:`~rapidmount.dataplane.connection.WorkerConnection`, and replaces any
that dies, or that stops answering its heartbeat (a hang is handled as a
death). A call to a worker that dies fails with :class:`WorkerLost`; who made
the call decides what to do again elsewhere (the store retries unary calls, a
reader re-reads its range on another worker, an appender takes its object
over on another worker). What the pool hands the workers through
descriptors is :mod:`~rapidmount.dataplane.handoff`'s.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, cast

import trio

from rapidmount.dataplane.connection import WorkerConnection, WorkerLost
from rapidmount.dataplane.handoff import DescriptorHandOff
from rapidmount.dataplane.worker_process import _describe_exit, _private_memory_of, start_worker
from rapidmount.fuse.write_pipes import WritePipes
from rapidmount.shared import peer_memory
from rapidmount.shared.arena import Arena
from rapidmount.shared.exits import MountError
from rapidmount.shared.messages import encode
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import BucketLayout

# WorkerConnection and WorkerLost are the connection module's; their users import them from here too.
__all__ = ["WorkerConnection", "WorkerLost", "WorkerPool"]

log = logging.getLogger("rapidmount.dataplane")

#: A worker that has not said "ready" by then (plus the connect timeout) is killed.
START_GRACE_S = 10.0
#: A worker that dies sooner than this after its start is restarted only after a pause.
CRASH_LOOP_S = 2.0
STOP_TIMEOUT_S = 5.0
#: A draining worker is stopped once no call waits on it, or after this long.
DRAIN_TIMEOUT_S = 30.0
DRAIN_POLL_S = 0.02
#: How often a live worker is asked to answer, and the longest it may take
#: (at most --stall-timeout): past it the worker hangs and is killed.
HEARTBEAT_S = 2.0
HEARTBEAT_TIMEOUT_S = 10.0
#: After killing a hung worker, how long its threads get to die before its calls
#: are failed over. One may stay in the kernel (a page-cache store waiting on a
#: page whose READ waits for this worker's answer), so exit is not waited for.
KILL_GRACE_S = 1.0


class WorkerPool(DescriptorHandOff):
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

    async def _spawn(self, index: int) -> WorkerConnection:
        connection = await start_worker(index, self.settings, self.arena, self.write_pipes, self._notice,
                                        self._worker_lost)
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

