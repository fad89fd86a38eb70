"""WRITEs whose bytes wait in pipes: a worker's fill thread reads each one's
bytes into the arena and answers it on ``/dev/fuse``.

The FUSE process hands a large WRITE to a worker as a record on the fill
socket; the bytes wait in one of the pipes the worker holds. A WRITE's writer
waits for its answer, which must never wait for the worker's event loop, so
the fills run on a thread of their own; an append of the bytes waits for their
fill (:meth:`WriteFills._after_fills`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable

from rapidmount.shared import fuse_replies
from rapidmount.shared.messages import FILL, NOTICE, Message
from rapidmount.shared.threads import start_named
from rapidmount.workers.state import WorkerState

log = logging.getLogger("rapidmount.worker")

#: The exit status of a worker that could not take a WRITE's bytes from its pipe.
EXIT_UNFILLED = 75


class WriteFills(WorkerState):
    """The fill thread, and the waits of the appends of the bytes it fills."""

    #: The pipes large WRITEs' bytes come in: id -> read end (:mod:`~rapidmount.fuse.write_pipes`).
    write_pipes: dict[int, int]
    fills_done: int  # WRITEs whose bytes the fill thread put into the arena
    _fill_waiting: bool  # an append waits for fills: the thread wakes this loop
    _fill_futures: list[asyncio.Future[None]]

    def start_fills(self, sock: socket.socket) -> None:
        """Take WRITEs from ``sock`` on a thread of its own: a WRITE's writer
        waits for its answer, which must not wait for this event loop."""
        loop = asyncio.get_running_loop()

        def advanced() -> None:
            self._fill_waiting = False
            waiting, self._fill_futures = self._fill_futures, []
            for future in waiting:
                if not future.done():
                    future.set_result(None)

        def send_soon(message: Message) -> None:
            loop.call_soon_threadsafe(self.send, message)

        def take() -> None:
            while True:
                try:
                    record = sock.recv(FILL.size)
                except OSError:
                    return
                if len(record) != FILL.size:
                    return  # the FUSE process closed it: this worker is stopping, or was given up
                pipe_id, size, arena_offset, unique = FILL.unpack(record)
                self.fill(pipe_id, arena_offset, size, unique, send_soon)
                self.fills_done += 1
                if self._fill_waiting:
                    loop.call_soon_threadsafe(advanced)

        def run() -> None:
            try:
                take()
            except BaseException as err:  # appends would wait for its fills for good: the mount takes them
                log.error("the WRITE fill thread failed (%s: %s); this worker stops", type(err).__name__, err)
                os._exit(EXIT_UNFILLED)

        start_named(run, "write-fills")

    def _new_write_pipe(self, pipe_id: int, fd: int) -> None:
        """A WRITE pipe made after this worker started (one replaced a lost
        worker's): the mount hands it WRITEs through it once told it is here."""
        self.write_pipes[pipe_id] = fd
        self.send((NOTICE, "write_pipe", pipe_id))

    async def _after_fills(self, count: int) -> None:
        """Return once ``count`` WRITEs have their bytes in the arena."""
        while self.fills_done < count:
            self._fill_waiting = True  # before the check below: the thread looks at it after counting
            if self.fills_done >= count:
                break
            future = asyncio.get_running_loop().create_future()
            self._fill_futures.append(future)
            await future

    def fill(self, pipe_id: int, arena_offset: int, size: int, unique: int,
             send: Callable[[Message], None] | None = None) -> None:
        """Read WRITE ``unique``'s ``size`` bytes from pipe ``pipe_id`` into
        the arena, then answer the WRITE. One read, into the start of the
        region: if this worker is lost, the FUSE process reads the rest into
        the rest. A pipe that cannot give them all ends this worker, so that
        the FUSE process takes them; it never appends a region not filled."""
        fd = self.write_pipes.get(pipe_id)
        got = -1
        if fd is not None:
            try:
                got = os.readv(fd, [self.arena.view(arena_offset, size)])
            except OSError as err:
                log.error("could not read a WRITE's bytes from its pipe: %s", err.strerror)
        if got != size:
            log.error("a WRITE's pipe gave %d of %d bytes; this worker stops, the mount takes them", got, size)
            os._exit(EXIT_UNFILLED)
        device = self.pages.device
        if device is not None:
            try:
                os.write(device, fuse_replies.reply_write(unique, size))
                return
            except OSError as err:
                if err.errno == errno.ENOENT:  # interrupted, or the mount was aborted
                    return
                log.info("could not answer a WRITE of %d bytes: %s", size, err.strerror)
        (send or self.send)((NOTICE, "write_unanswered", (unique, size)))
