"""Descriptors the pool hands its workers: the mount's ``/dev/fuse``, for
page-cache stores and READ replies, and the read ends of the WRITE pipes
(:mod:`~rapidmount.fuse.write_pipes`), replaced when a worker that held
one is lost; and the answers to WRITEs whose bytes a worker read, or a lost
worker left in a pipe.
"""

from __future__ import annotations

import errno
import logging
import os

import trio

from rapidmount.dataplane.connection import WorkerConnection, WorkerLost
from rapidmount.fuse.write_pipes import WritePipes
from rapidmount.shared import fuse_codec as codec
from rapidmount.shared.messages import FUSE_DEVICE, WRITE_PIPE_TAGS

log = logging.getLogger("rapidmount.dataplane")

#: How often a stream leaving a draining worker looks whether its fill thread has read its WRITEs.
FILL_POLL_S = 0.001


class DescriptorHandOff:
    """:class:`~rapidmount.dataplane.pool.WorkerPool`'s descriptor hand-off to its workers."""

    # Set by WorkerPool.
    write_pipes: WritePipes | None
    _fuse_fd: int | None
    _fuse_connection: int | None
    _nursery: trio.Nursery | None
    _connected: set[WorkerConnection]
    _stopping: bool

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
