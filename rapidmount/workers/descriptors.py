"""A worker's descriptor socket (asyncio): descriptors the FUSE process passes.

The FUSE process sends each descriptor with ``socket.send_fds``, under an
8-byte tag (:data:`~rapidmount.shared.messages.DESCRIPTOR_TAG`): the
call id of the call that uses it (a staged file to upload), or
:data:`~rapidmount.shared.messages.FUSE_DEVICE` for the mount's
``/dev/fuse``. The call and its descriptor travel on two sockets, so either
may arrive first: a call waits here for its descriptor. A staged file passed
so is read with :func:`staged_bytes`.

The kernel delivers the descriptors of one ``sendmsg`` with its first byte
and never joins two such messages in one ``recvmsg``, so tags and
descriptors pair up in the order they come.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import os
import socket
from collections.abc import Callable

from rapidmount.shared.messages import DESCRIPTOR_TAG, FUSE_DEVICE, WRITE_PIPE_TAGS
from rapidmount.storage.errors import StorageError

log = logging.getLogger("rapidmount.worker")

#: Tags given up on (their call stopped waiting) whose descriptor is closed on arrival.
ABANDONED_KEPT = 4096


class DescriptorInbox:
    """Receives tagged descriptors on ``sock``; the FUSE device goes to
    ``on_fuse_device``, a WRITE pipe made later to ``on_write_pipe(id, fd)``."""

    def __init__(self, sock: socket.socket, on_fuse_device: Callable[[int], None],
                 on_write_pipe: Callable[[int, int], None] | None = None) -> None:
        self._sock = sock
        self._on_fuse_device = on_fuse_device
        self._on_write_pipe = on_write_pipe
        self._tags = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._arrived: dict[int, int] = {}  # tag -> descriptor nobody asked for yet
        self._waiting: dict[int, asyncio.Future[int]] = {}
        self._abandoned: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._closed = False

    def start(self) -> None:
        self._sock.setblocking(False)
        asyncio.get_running_loop().add_reader(self._sock.fileno(), self._readable)

    def close(self) -> None:
        """Stop receiving; close every descriptor not handed out, fail every wait."""
        if self._closed:
            return
        self._closed = True
        asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        for fd in [*self._arrived.values(), *self._fds]:
            os.close(fd)
        self._arrived.clear()
        self._fds.clear()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(StorageError("the descriptor socket closed", errno_=errno.EIO))

    async def take(self, tag: int, timeout: float) -> int:
        """The descriptor passed under ``tag``, once it is here; the caller closes it.

        EIO if it has not come within ``timeout`` seconds (the FUSE process
        sends it just before the call, so only a broken socket delays it).
        """
        fd = self._arrived.pop(tag, None)
        if fd is not None:
            return fd
        if self._closed:
            raise StorageError("the descriptor socket closed", errno_=errno.EIO)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[tag] = future
        fd = None
        try:
            async with asyncio.timeout(timeout):
                fd = await future
            return fd
        except TimeoutError:
            raise StorageError(f"the descriptor of call {tag} did not arrive within {timeout:g}s",
                               errno_=errno.EIO) from None
        finally:
            self._waiting.pop(tag, None)
            if fd is None:  # the wait ended without it: timed out, cancelled, or the socket closed
                if future.done() and not future.cancelled() and future.exception() is None:
                    os.close(future.result())  # it came just then: nobody will use it
                else:
                    self._abandon(tag)

    def _abandon(self, tag: int) -> None:
        self._abandoned[tag] = None
        while len(self._abandoned) > ABANDONED_KEPT:
            self._abandoned.popitem(last=False)

    def _readable(self) -> None:
        while not self._closed:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, 4096, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.error("the descriptor socket failed: %s", err.strerror or err)
                self.close()
                return
            if flags & socket.MSG_CTRUNC:
                log.error("descriptors passed by the mount were lost (MSG_CTRUNC)")
            if not data:  # the FUSE process closed its end
                for fd in fds:
                    os.close(fd)
                self.close()
                return
            self._tags += data
            self._fds.extend(fds)
            while len(self._tags) >= DESCRIPTOR_TAG.size and self._fds:
                (tag,) = DESCRIPTOR_TAG.unpack_from(self._tags)
                del self._tags[:DESCRIPTOR_TAG.size]
                self._deliver(tag, self._fds.popleft())

    def _deliver(self, tag: int, fd: int) -> None:
        if tag == FUSE_DEVICE:
            self._on_fuse_device(fd)
            return
        if tag >= WRITE_PIPE_TAGS:
            if self._on_write_pipe is None:
                os.close(fd)
            else:
                self._on_write_pipe(tag - WRITE_PIPE_TAGS, fd)
            return
        future = self._waiting.pop(tag, None)
        if future is not None and not future.done():
            future.set_result(fd)
        elif future is not None or tag in self._abandoned:  # its call stopped waiting for it
            self._abandoned.pop(tag, None)
            os.close(fd)
        else:
            self._arrived[tag] = fd


def staged_bytes(fd: int) -> Callable[[int, int], bytes]:
    """``read(offset, n)`` of a staged file: exactly ``n`` bytes, else EIO (the
    FUSE process never uploads past the end of what it staged)."""
    def read(offset: int, n: int) -> bytes:
        data = os.pread(fd, n, offset)
        if len(data) != n:
            raise StorageError(f"the staged file ends at {offset + len(data)}, before {offset + n}",
                               errno_=errno.EIO)
        return data
    return read
