"""Pipes that carry a large WRITE's bytes from ``/dev/fuse`` to a worker.

Reading a 1 MiB WRITE from ``/dev/fuse`` copies its bytes in the FUSE
process: about half that process's CPU per GiB written. With ``splice``,
the kernel instead puts references to the writer's page-cache pages into a
pipe. The FUSE process reads only the request's headers from it; the
worker that appends the file reads the bytes into the arena region the
write path chose, then writes the WRITE's reply itself. The writer's pages
stay locked until that reply, so the bytes cannot change on the way.

Each worker inherits the read end of every pipe open when it starts. A
pipe is free again once it holds no byte (``FIONREAD``): whoever emptied it,
the bytes are where they belong. A worker reads a WRITE's bytes in one
``read`` into the start of its region, so when a worker is lost, this
process reads what is left into the rest of the region, answers the WRITE
(the kernel refuses a second answer) and replaces the pipe, which no later
request shares with that worker; the workers running get the new one on
their descriptor sockets.
"""

from __future__ import annotations

import array
import collections
import errno
import fcntl
import itertools
import logging
import os
import termios
from typing import TYPE_CHECKING

from rapidmount.shared.sysctl import raise_limit
from rapidmount.shared.views import Arriving

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("rapidmount.fuse")

#: ``fcntl``'s F_SETPIPE_SZ, F_GETPIPE_SZ.
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
PIPE_MAX_SIZE = "/proc/sys/fs/pipe-max-size"
PAGE = 4096
#: Pipes for WRITEs received and not yet emptied by their worker.
DEFAULT_PIPES = 4

#: The states of a :class:`PipedWrite`: its bytes still in the pipe; read
#: here; or handed to a worker, which reads them and answers the WRITE.
PENDING, LANDED, HANDED = "pending", "landed", "handed"


def pipe_capacity(request_size: int) -> int:
    """Bytes a pipe needs for a WRITE of ``request_size``: the kernel puts
    each page (one more when the bytes are not page-aligned) and the headers
    in slots of their own, and a pipe's size is a power of two pages."""
    slots = request_size // PAGE + 2
    return PAGE << (slots - 1).bit_length()


def set_pipe_size(fd: int, size: int) -> None:
    """PermissionError past fs.pipe-max-size without CAP_SYS_RESOURCE."""
    fcntl.fcntl(fd, F_SETPIPE_SZ, size)


def _bytes_in(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count, True)
    return count[0]


class Pipe:
    """One pipe; ``holder``, the last WRITE spliced into it."""

    __slots__ = ("id", "read_fd", "write_fd", "holder")

    def __init__(self, pipe_id: int, read_fd: int, write_fd: int) -> None:
        self.id = pipe_id
        self.read_fd = read_fd
        self.write_fd = write_fd
        self.holder: PipedWrite | None = None

    @property
    def empty(self) -> bool:
        return _bytes_in(self.read_fd) == 0

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)


def _emptied(pipe: Pipe) -> Pipe:
    """``pipe``, seen empty: its last WRITE's bytes are in their region, not kept here."""
    if pipe.holder is not None:
        pipe.holder.view = None
        pipe.holder = None
    return pipe


class PipedWrite(Arriving):
    """A WRITE whose bytes wait in ``pipe`` for the arena region ``view``
    (let go once the pipe is seen empty: the region is the write path's)."""

    __slots__ = ("pipe", "view", "size", "arena_offset", "unique", "state")

    def __init__(self, pipe: Pipe, view: memoryview, arena_offset: int, unique: int) -> None:
        self.pipe = pipe
        self.view: memoryview | None = view
        self.size = len(view)
        self.arena_offset = arena_offset
        self.unique = unique
        self.state = PENDING
        pipe.holder = self

    def __len__(self) -> int:
        return self.size

    def land(self) -> memoryview:
        """The bytes, read here from the pipe into their region if no worker has them."""
        view = self.view
        assert view is not None, "landed before its pipe was seen empty"
        if self.state == PENDING:
            self.state = LANDED
            self.complete()
        return view

    def complete(self) -> int:
        """Read what is left in the pipe into the end of the region (a worker
        reads from its start, in one read); the bytes read here."""
        view = self.view
        if self.pipe.holder is not self or view is None:
            return 0  # its pipe was seen empty since: the bytes are in the region
        left = _bytes_in(self.pipe.read_fd)
        if not left:
            return 0
        if left > len(view):
            raise OSError(errno.EIO, f"a WRITE's pipe holds {left} bytes for {len(view)}")
        try:
            got = os.readv(self.pipe.read_fd, [view[len(view) - left:]])
        except BlockingIOError:
            return 0  # a worker still running took them all just now, into the region
        if got != left:
            raise OSError(errno.EIO, f"read {got} of a WRITE's {left} bytes from its pipe")
        return got


class WritePipes:
    """The FUSE process's pipes; see the module's docstring."""

    def __init__(self, count: int, capacity: int) -> None:
        self.capacity = capacity
        self._ids = itertools.count(1)
        self.pipes: list[Pipe] = []
        #: Per worker connection: the WRITEs handed to it lately (at most a
        #: few per pipe are not answered yet), answered again if it is lost.
        self._handed: dict[object, collections.deque[PipedWrite]] = {}
        self.landed_here = 0  # bytes of handed WRITEs this process read after their worker was lost
        #: Told ``(id, read end)`` of a pipe made to replace one a lost worker held.
        self.on_replaced: Callable[[int, int], None] | None = None
        try:
            for _ in range(count):
                self.pipes.append(self._new_pipe())
        except BaseException:
            self.close()
            raise

    def _new_pipe(self) -> Pipe:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            set_pipe_size(write_fd, self.capacity)
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        return Pipe(next(self._ids), read_fd, write_fd)

    def take(self) -> Pipe | None:
        """An empty pipe, or None while every one holds a WRITE's bytes. Pipes
        handed to a worker are looked at last: looking waits for a copy out
        of the pipe in progress."""
        handed = []
        for pipe in self.pipes:
            if pipe.holder is not None and pipe.holder.state == HANDED:
                handed.append(pipe)
            elif pipe.empty:
                return _emptied(pipe)
        for pipe in handed:
            if pipe.empty:
                return _emptied(pipe)
        return None

    def read_ends(self) -> list[tuple[int, int]]:
        """``(id, read descriptor)`` of every pipe, for a worker starting now."""
        return [(pipe.id, pipe.read_fd) for pipe in self.pipes]

    def handed(self, write: PipedWrite, worker: object) -> None:
        write.state = HANDED
        kept = self._handed.get(worker)
        if kept is None:
            kept = self._handed[worker] = collections.deque(maxlen=4 * max(1, len(self.pipes)))
        kept.append(write)

    def unfilled(self, worker: object) -> bool:
        """Whether a WRITE handed to ``worker`` still has bytes in its pipe."""
        return any(write.state == HANDED and write.pipe.holder is write and not write.pipe.empty
                   for write in self._handed.get(worker, ()))

    def lost(self, worker: object, reply: Callable[[int, int], None], *, replace: bool = True) -> None:
        """``worker`` is gone: every WRITE handed to it gets its bytes into
        its region (read here what it left in the pipe) and an answer through
        ``reply(unique, size)``; its pipes are replaced (a worker still
        exiting may yet read from them), unless the mount is stopping."""
        for write in self._handed.pop(worker, ()):
            pipe = write.pipe
            if pipe.holder is write:
                try:
                    self.landed_here += write.complete()
                except OSError as err:  # the region misses bytes: the WRITE fails, and the file
                    log.error("a WRITE's bytes were lost with data-plane worker: %s", err)
                    reply(write.unique, -errno.EIO)
                    if replace:
                        self._replace(pipe)
                    continue
                if replace:
                    self._replace(pipe)
            reply(write.unique, write.size)

    def _replace(self, pipe: Pipe) -> None:
        if pipe not in self.pipes:
            return
        index = self.pipes.index(pipe)
        pipe.holder = None
        pipe.close()
        try:
            new = self.pipes[index] = self._new_pipe()
        except OSError as err:
            log.warning("a WRITE pipe could not be replaced (%s); %d left", err.strerror, len(self.pipes) - 1)
            del self.pipes[index]
            return
        log.info("a WRITE pipe a lost data-plane worker held was replaced")
        if self.on_replaced is not None:
            self.on_replaced(new.id, new.read_fd)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.close()
        self.pipes.clear()


def open_write_pipes(count: int, request_size: int, knob: str = PIPE_MAX_SIZE) -> tuple[WritePipes | None, str]:
    """``count`` pipes large enough for a WRITE of ``request_size``, or None
    and why not. Above ``fs.pipe-max-size``, without CAP_SYS_RESOURCE, a pipe
    needs that limit raised: done here when this process may (root); never
    lowered."""
    if count <= 0:
        return None, "--write-pipes 0"
    capacity = pipe_capacity(request_size)
    try:
        return WritePipes(count, capacity), ""
    except PermissionError:
        pass  # past fs.pipe-max-size, without CAP_SYS_RESOURCE
    except OSError as err:
        return None, f"no pipe of {capacity >> 10} KiB ({err.strerror})"
    limit, refused = raise_limit(knob, capacity, f"bytes, for WRITEs of {request_size >> 10} KiB handed to workers")
    if refused is not None or limit is None:
        why = refused.strerror if refused is not None else "no such setting"
        return None, (f"a pipe for a WRITE of {request_size >> 10} KiB needs {capacity >> 10} KiB, and "
                      f"fs.pipe-max-size ({(limit or 0) >> 10} KiB) could not be raised ({why})")
    try:
        return WritePipes(count, capacity), ""
    except OSError as err:
        return None, f"no pipe of {capacity >> 10} KiB ({err.strerror})"
