"""Staged files: whole local copies of files being written, in ``--temp-dir``.

A staged file is a temporary file unlinked at its creation: it lives as long
as its descriptor. Its disk I/O runs in threads, at most
:data:`STAGED_IO_THREADS` at once for the whole mount, so a slow or stuck
``--temp-dir`` delays the operations that need a staged file, never the trio
thread that serves every FUSE request. Failures leave as ``OSError``; the
write path turns them into one errno (see ``core/errors.py`` ``local_error``).
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from typing import TypeVar, cast

import trio

#: Staged-file calls (write, read, truncate, reserve, create, close) running
#: at once. A limiter of its own: a stuck ``--temp-dir`` must not take the
#: threads token refreshes and kernel notifications run in.
STAGED_IO_THREADS = 8

_R = TypeVar("_R")


def _reserve(fd: int, offset: int, length: int) -> None:
    """Allocate room for ``length`` bytes at ``offset`` (ENOSPC if there is none)."""
    try:
        os.posix_fallocate(fd, offset, length)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # Not supported here: a short write still ends in ENOSPC.


def _write_whole(fd: int, data: bytes | memoryview, offset: int) -> None:
    """Write all of ``data``, or nothing: the room is reserved first, so a
    full ``--temp-dir`` refuses the write (ENOSPC) rather than keeping part of it."""
    if not data:
        return
    size = os.fstat(fd).st_size
    try:
        _reserve(fd, offset, len(data))
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            if not written:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view, offset = view[written:], offset + written
    except OSError:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, size)  # a refused write does not grow the file
        raise


def _read(fd: int, size: int, offset: int) -> bytes:
    return os.pread(fd, size, offset)


def _calling(fn: Callable[..., _R], fd: int, *args: object) -> tuple[_R | None, OSError | None]:
    """Run in the thread. A failure comes back as a value, without its
    traceback, whose frames would hold the caller's buffer: an arena region
    (bytes read from the bucket) is given back when its last reference goes,
    and that must happen on the trio thread, not here after the answer."""
    try:
        return fn(fd, *args), None
    except OSError as err:
        return None, OSError(err.errno, err.strerror)


def _make(directory: str) -> int:
    fd, path = tempfile.mkstemp(prefix="rapidmount-", dir=directory)
    try:
        os.unlink(path)  # lives as long as the descriptor
    except OSError:
        os.close(fd)
        raise
    return fd


class StagedFile:
    """One staged file. Its calls may run side by side (a read beside a
    write); the write path orders the ones that change it (its state's lock)."""

    def __init__(self, fd: int, limiter: trio.CapacityLimiter) -> None:
        self._fd = fd
        self._limiter = limiter
        self._running = 0
        self._idle: trio.Event | None = None
        self._closed = False

    @classmethod
    async def create(cls, directory: str, limiter: trio.CapacityLimiter) -> StagedFile:
        return cls(await trio.to_thread.run_sync(_make, directory, limiter=limiter), limiter)

    @property
    def fd(self) -> int:
        """The descriptor, for an upload that reads the file itself."""
        return self._fd

    async def reserve(self, offset: int, length: int) -> None:
        await self._run(_reserve, offset, length)

    async def write(self, data: bytes | memoryview, offset: int) -> None:
        """All of ``data`` at ``offset``, or nothing (see :func:`_write_whole`)."""
        if data:
            await self._run(_write_whole, data, offset)

    async def read(self, size: int, offset: int) -> bytes:
        return await self._run(_read, size, offset)

    async def truncate(self, size: int) -> None:
        await self._run(os.ftruncate, size)

    async def close(self) -> None:
        """Close the file once the calls under way are done, even when
        cancelled: its descriptor must neither leak nor be reused under a read."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            if self._running:
                self._idle = trio.Event()
                await self._idle.wait()
            await trio.to_thread.run_sync(os.close, self._fd, limiter=self._limiter)

    async def _run(self, fn: Callable[..., _R], *args: object) -> _R:
        if self._closed:
            raise OSError(errno.EBADF, "the staged file is closed")
        self._running += 1
        try:
            # Not abandoned when cancelled: the call is over when this returns.
            result, error = await trio.to_thread.run_sync(_calling, fn, self._fd, *args, limiter=self._limiter)
            if error is not None:
                raise error
            return cast(_R, result)  # fn's own, as no error came back
        finally:
            self._running -= 1
            if not self._running and self._idle is not None:
                self._idle.set()
