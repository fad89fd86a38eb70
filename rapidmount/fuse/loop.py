"""The mount's one FUSE request loop: every request read from ``/dev/fuse``
into buffers of its own, decoded, answered.

* INIT is answered first, by :func:`handshake` (:mod:`~rapidmount.fuse.init`
  decides what to grant); the buffers are then sized for the largest request.
* A READ within a block the cache holds is answered at once, with no task
  (``read_now``); others become a task, and their reply may be written by a
  data-plane worker (:mod:`~rapidmount.fuse.operations`).
* A WRITE's bytes are read by the kernel straight into the shared-memory
  region the write path then keeps (a WRITE of 512 KiB or more is never
  copied in this process). While WRITEs of 512 KiB or more come from the page
  cache, each request is spliced into a pipe instead
  (:mod:`~rapidmount.fuse.write_pipes`): only its headers are read here,
  and the worker appending the file reads its bytes into their region and
  answers it. A WRITE the write path can take without a wait (an append to a
  streaming file, ``write_now``) is answered at once, with no task.
* Every other request is decoded by :mod:`~rapidmount.shared.fuse_codec` and served
  through :meth:`Operations.serve`, one table of opcode to core call. A
  request the codec refuses gets its errno, and the loop goes on.
* INTERRUPT is counted and dropped: every request is answered soon anyway.

Requests are received and handled by a pool of tasks, one receiving at a
time, each awaiting the request it received, another task started when none
is left waiting: every handler starts in the order its request came.

The loop holds one :class:`~rapidmount.fuse.channel.Channel`; a clone of the
mount's descriptor would get a loop of its own.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

import trio

from rapidmount.core.errors import FSError
from rapidmount.fuse.write_pipes import HANDED, PENDING, Pipe, PipedWrite, WritePipes
from rapidmount.shared import fuse_abi as abi, fuse_codec as codec
from rapidmount.fuse.channel import Channel
from rapidmount.fuse.init import Negotiated, ProtocolTooOld, Wants, negotiate
from rapidmount.fuse.operations import Operations, failure
from rapidmount.core.locks import QuickLock

log = logging.getLogger("rapidmount.fuse")

PAGE = 4096
#: A WRITE's headers (``fuse_in_header`` and ``fuse_write_in``): what is read before its bytes.
HEAD = abi.IN_HEADER.size + abi.WRITE_IN.size
#: The largest WRITE a FUSE request carries without asking for larger ones (256 pages).
MAX_WRITE = 256 * PAGE
#: An arena region for WRITE buffers holds this many of MAX_WRITE (one
#: allocation per this many 1 MiB WRITEs), or one of the largest if larger.
SLOTS = 4
#: The smallest WRITE whose bytes stay where the kernel put them (a region, or a pipe).
HELD_WRITE = MAX_WRITE // 2
#: Room after a whole WRITE, so that the buffer is never too small for a request.
SPILL = 64 * PAGE
#: The kernel refuses a read of /dev/fuse into less than this (``FUSE_MIN_READ_BUFFER``).
MIN_READ_BUFFER = 8192
#: WRITEs answered in a row without a task before the loop lets other tasks run.
TURN_AFTER = 16

#: Shared memory for a WRITE's bytes: ``length`` -> ``(offset, view)``, or None when full.
Allocate = Callable[[int], "tuple[int, memoryview] | None"]
#: Whether the WRITEs of handle ``fh`` come from the page cache, whose pages the
#: kernel lends a pipe; a direct handle's bytes are copied into the pipe instead.
FromPageCache = Callable[[int], bool]


async def handshake(channel: Channel, wants: Wants) -> Negotiated:
    """Read the kernel's INIT and answer it; what was agreed. A kernel that
    speaks a newer major is answered with ours and asked again. The
    descriptor is left non-blocking, so that the wait can be cancelled."""
    os.set_blocking(channel.fd, False)
    buffer = bytearray(max(MIN_READ_BUFFER, MAX_WRITE + SPILL))
    while True:
        received = await _read_one(channel.fd, buffer)
        if not received:
            raise OSError(errno.ENODEV, "the mount went away before INIT")
        try:
            header, body = codec.decode(memoryview(buffer)[:received])
        except codec.DecodeError as err:
            if err.unique is not None:
                channel.reply(codec.reply_error(err.unique, err.errno))
            continue
        if not isinstance(body, codec.Init):
            channel.reply(codec.reply_error(header.unique, errno.EIO))  # nothing is served before INIT
            continue
        try:
            negotiated = negotiate(body, header.unique, wants)
        except ProtocolTooOld as err:
            channel.reply(err.reply)  # the mount fails at once, rather than hang
            raise
        channel.reply(negotiated.reply)
        if not negotiated.retry:
            return negotiated


async def _read_one(fd: int, buffer: bytearray) -> int | None:
    """One request into ``buffer``, waiting for it; None once unmounted."""
    while True:
        try:
            return os.readv(fd, [buffer])
        except BlockingIOError:
            await trio.lowlevel.wait_readable(fd)
        except OSError as err:
            if err.errno in (errno.ENODEV, errno.ECONNABORTED):
                return None
            if err.errno not in (errno.EINTR, errno.ENOENT):
                raise


class RequestLoop:
    """Receives the mount's FUSE requests on ``channel`` and answers them."""

    def __init__(self, channel: Channel, operations: Operations, counts: collections.Counter[str], *,
                 max_write: int = MAX_WRITE, allocate: Allocate | None = None, pipes: WritePipes | None = None,
                 from_page_cache: FromPageCache | None = None, min_tasks: int = 4, max_tasks: int = 128) -> None:
        self._channel = channel
        self._device = channel.fd
        self._operations = operations
        self.counts = counts
        self._min_tasks = min_tasks
        self._max_tasks = max_tasks
        self._lock = QuickLock()  # one task receives at a time
        self._tasks = 0
        self._waiting = 0  # tasks waiting to receive
        self._ended = False
        # The buffers a request is read into: its headers, a WRITE's bytes, then room for anything longer.
        self._max_write = max_write
        self._region_size = max(SLOTS * MAX_WRITE, max_write)  # the largest WRITE fits a new one
        self._head = bytearray(HEAD)
        self._spill = bytearray(max_write + SPILL)
        self._allocate = allocate
        self._pipes = pipes
        self._from_page_cache = from_page_cache
        self._splicing = False  # large WRITEs come: splice the next request
        self._spare: Pipe | None = None  # a pipe taken, and still empty: nothing was spliced into it
        self._region_offset = 0  # the region's offset in the arena
        self._data: bytearray | memoryview = bytearray()  # set by _new_buffer
        self._region: memoryview | None = None  # the arena region ``_data`` is part of
        self._cursor = 0  # where ``_data`` begins in the region: what is before it, WRITEs own
        self._new_buffer()

    # -- buffers ----------------------------------------------------------------------------------

    def _new_buffer(self) -> None:
        """The next request's bytes after its headers go to the start of a new
        arena region (the worker that sends a WRITE's bytes reads them there;
        the region returns to the arena once no WRITE holds a part of it), or
        to a new buffer of this process when the arena is full."""
        allocated = self._allocate(self._region_size) if self._allocate is not None else None
        self._cursor = 0
        if allocated is None:
            self._region, self._region_offset = None, 0
            if not isinstance(self._data, bytearray):  # else the one it had is free again: nothing holds it
                self._data = bytearray(self._max_write)
        else:
            self._region_offset, self._region = allocated
            self._at_cursor()

    def _at_cursor(self) -> None:
        assert self._region is not None
        self._data = self._region[self._cursor:min(self._cursor + self._max_write, self._region_size)]

    def _take(self, size: int) -> bytes | memoryview:
        """The first ``size`` bytes of the buffer, which the kernel wrote a
        WRITE's bytes into: the WRITE's now. The next request goes after them
        (page-aligned) while the region has room for another WRITE as large
        (and at least 1 MiB), else to a new buffer. With the arena full they
        are copied out, and the buffer serves the next request."""
        if self._region is None:
            copied = bytes(memoryview(self._data)[:size])
            self._new_buffer()  # a region, if the arena has room again
            return copied
        return self._take_from_region(size)

    def _take_from_region(self, size: int) -> memoryview:
        assert self._region is not None, "a view of the arena is taken only from a region"
        data = memoryview(self._data)[:size]
        self._cursor += -(-size // PAGE) * PAGE
        if self._region_size - self._cursor >= max(size, MAX_WRITE):
            self._at_cursor()
            return data
        self._new_buffer()
        return data

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the mount is gone or :meth:`stop` is called."""
        flags = fcntl.fcntl(self._device, fcntl.F_GETFL)
        fcntl.fcntl(self._device, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        try:
            async with trio.open_nursery() as nursery:
                self._tasks = 1
                nursery.start_soon(self._serve, nursery)
        finally:
            fcntl.fcntl(self._device, fcntl.F_SETFL, flags)

    def stop(self) -> None:
        """End the loop: no request is received after this (the tasks serving
        one finish it). Call from the loop's own trio run."""
        if not self._ended:
            self._ended = True
            trio.lowlevel.notify_closing(self._device)  # wakes the task waiting for a request

    async def _serve(self, nursery: trio.Nursery) -> None:
        try:
            while not self._ended:
                if self._waiting >= self._min_tasks:
                    return  # enough tasks wait for requests
                self._waiting += 1
                try:
                    async with self._lock:
                        request = await self._receive()
                finally:
                    self._waiting -= 1
                if request is None:
                    return
                if not self._waiting and self._tasks < self._max_tasks:
                    self._tasks += 1
                    nursery.start_soon(self._serve, nursery)
                await request
        finally:
            self._tasks -= 1

    async def _receive(self) -> Awaitable[None] | None:
        """The next request, decoded, as the awaitable that answers it; None
        once the mount is gone. Requests answered at once are not returned:
        the next one is received."""
        in_a_row = 0
        while not self._ended:
            if in_a_row >= TURN_AFTER:
                in_a_row = 0
                await trio.lowlevel.checkpoint()  # the requests kept coming: let the others run
                continue
            pipe = None
            if self._splicing and self._pipes is not None:
                # The pipe the last try found nothing for is still empty (unless replaced meanwhile).
                spare, self._spare = self._spare, None
                pipe = spare if spare is not None and spare in self._pipes.pipes else self._pipes.take()
            code = 0
            if pipe is not None:
                try:
                    spliced = os.splice(self._device, pipe.write_fd, self._max_write + PAGE, flags=os.SPLICE_F_NONBLOCK)
                except OSError as err:
                    code = err.errno or errno.EIO
                    if code not in (errno.EAGAIN, errno.EINTR, errno.ENOENT, errno.ENODEV):
                        # EINVAL: a device that cannot splice. Others (ENOMEM, EIO): the kernel
                        # failed that request itself. Either way, read requests from now on.
                        log.warning("splicing a FUSE request failed (%s); WRITE bytes are read in the FUSE "
                                    "process from now on", os.strerror(code))
                        self._pipes = None
                        continue
                else:
                    if spliced > 0:
                        request = self._from_pipe(pipe, spliced)
                        if request is not None:
                            return request
                        in_a_row += 1
                        continue
                    code = errno.ENODEV
                if code == errno.EAGAIN:
                    self._spare = pipe
            else:
                try:
                    received = os.readv(self._device, [self._head, self._data, self._spill])
                except OSError as err:
                    code = err.errno or errno.EIO
                else:
                    if received > 0:
                        request = self._parse(received)
                        if request is not None:
                            return request
                        in_a_row += 1
                        continue
                    code = errno.ENODEV
            if code == errno.EAGAIN:
                try:
                    await trio.lowlevel.wait_readable(self._device)
                except trio.ClosedResourceError:  # stop()
                    break
                in_a_row = 0  # the others ran meanwhile
            elif code == errno.ENODEV:  # unmounted
                break
            elif code == errno.ECONNABORTED:  # aborted through fusectl: every request failed by the kernel
                log.warning("the FUSE connection was aborted; the mount is gone")
                break
            elif code not in (errno.EINTR, errno.ENOENT):  # ENOENT: interrupted before it was read
                raise OSError(code, f"reading a FUSE request: {os.strerror(code)}")
        self._ended = True
        return None

    def _from_pipe(self, pipe: Pipe, spliced: int) -> Awaitable[None] | None:
        """A request spliced into ``pipe``: a large WRITE whose bytes can go
        to the region at the cursor is answered with its bytes left there;
        anything else is read whole and handled as if read from the device.
        None: answered already."""
        got = os.readv(pipe.read_fd, [memoryview(self._head)[:min(spliced, HEAD)]])
        if got != min(spliced, HEAD):
            raise OSError(errno.EIO, f"read {got} of a request's first {min(spliced, HEAD)} bytes from its pipe")
        if spliced > HEAD:
            opcode, unique = abi.IN_HEADER.unpack_from(self._head)[1:3]
            if opcode == abi.Opcode.WRITE:
                fh, offset, size = abi.WRITE_IN.unpack_from(self._head, abi.IN_HEADER.size)[:3]
                self._splicing = self._splices(fh)
                if size >= HELD_WRITE and spliced == HEAD + size:
                    if self._region is not None and size > len(self._data):
                        self._new_buffer()  # the region's tail is too short
                    if self._region is not None and size <= len(self._data):
                        arena_offset = self._region_offset + self._cursor
                        write = PipedWrite(pipe, self._take_from_region(size), arena_offset, unique)
                        if self._answered_now(unique, fh, offset, write):
                            return None
                        return self._answer_write(unique, fh, offset, write)
            rest = os.readv(pipe.read_fd, [self._data, self._spill])
            if rest != spliced - HEAD:
                raise OSError(errno.EIO, f"read {rest} of a request's last {spliced - HEAD} bytes from its pipe")
            got += rest
        return self._parse(got)

    def _parse(self, received: int) -> Awaitable[None] | None:
        """The request read into the buffers, as the awaitable that answers
        it; None: answered already (or one that gets no answer)."""
        head = self._head
        if received >= HEAD:
            length, opcode, unique = abi.IN_HEADER.unpack_from(head)[:3]
            if opcode == abi.Opcode.READ and length == received:
                fh, offset, size = abi.READ_IN.unpack_from(head, abi.IN_HEADER.size)[:3]
                self.counts["read"] += 1
                if self._operations.read_now(self._channel, unique, fh, offset, size):
                    self.counts["read_at_once"] += 1
                    return None
                return self._operations.read(self._channel, unique, fh, offset, size)
            if opcode == abi.Opcode.WRITE and length == received:
                fh, offset, size = abi.WRITE_IN.unpack_from(head, abi.IN_HEADER.size)[:3]
                if received == HEAD + size:
                    return self._write(unique, fh, offset, size)
        self._splicing = False
        try:
            header, body = codec.decode(self._message(received))
        except codec.DecodeError as err:
            if err.errno in (errno.ENOSYS, errno.ENAMETOOLONG):  # an opcode not served, a name too long
                self.counts["other"] += 1
                log.debug("FUSE opcode %d answered %s", abi.IN_HEADER.unpack_from(head)[1],
                          errno.errorcode[err.errno])
            else:
                self.counts["refused"] += 1
                log.warning("a malformed FUSE request was refused (%s): %s",
                            errno.errorcode.get(err.errno, err.errno), err)
            if err.unique is not None:
                self._channel.reply(codec.reply_error(err.unique, err.errno))
            return None
        if isinstance(body, codec.Interrupt):
            self.counts["interrupt"] += 1
            return None  # its request is answered soon anyway
        if isinstance(body, codec.Destroy):
            self._channel.reply(codec.reply_empty(header.unique))
            self.stop()
            return None
        self.counts["other"] += 1
        resumed = _started(self._operations.serve(self._channel, header, body))
        if resumed is None:
            self.counts["other_at_once"] += 1
        return resumed

    def _write(self, unique: int, fh: int, offset: int, size: int) -> Awaitable[None] | None:
        """A WRITE read into the buffers: its bytes stay where the kernel put
        them when it is large, else they are copied out."""
        self._splicing = size >= HELD_WRITE and self._pipes is not None and self._splices(fh)
        data: bytes | memoryview
        if size > len(self._data):  # a region's tail was too short: the rest went to the spill
            data = b"".join((self._data, memoryview(self._spill)[:size - len(self._data)]))
            self._new_buffer()
        elif size >= HELD_WRITE:
            data = self._take(size)  # the kernel wrote the bytes there: they stay, no copy (arena full: copied)
            if self._answered_now(unique, fh, offset, data):
                return None
        else:
            data = bytes(memoryview(self._data)[:size])
        return self._answer_write(unique, fh, offset, data)

    def _message(self, received: int) -> bytes:
        """The request as one piece, for the codec."""
        if received <= HEAD:
            return bytes(self._head[:received])
        rest, room = received - HEAD, len(self._data)
        if rest <= room:
            return b"".join((self._head, memoryview(self._data)[:rest]))
        return b"".join((self._head, self._data, memoryview(self._spill)[:rest - room]))

    def _splices(self, fh: int) -> bool:
        """Whether the next request goes into a pipe after a large WRITE of
        ``fh``: only for WRITEs from the page cache. The kernel copies a direct
        writer's bytes into a pipe, and the worker would copy them again;
        read from /dev/fuse, they are copied once, into the arena."""
        return self._from_page_cache is None or self._from_page_cache(fh)

    def _answered_now(self, unique: int, fh: int, offset: int, data: bytes | memoryview | PipedWrite) -> bool:
        """A WRITE the write path could take at once (``write_now``): answered
        here, or by the worker it was handed to. False: it needs a task."""
        written = self._operations.write_now(fh, offset, data)
        if _handed(data):
            self.counts["write"] += 1
            self.counts["write_at_once"] += 1
            self.counts["write_by_worker"] += 1
            return True  # its worker answers it once it has the bytes
        if written is None:
            return False
        if isinstance(data, PipedWrite) and data.state == PENDING:
            _empty(data)  # taken, yet neither handed nor landed: its bytes go to their region first
        self.counts["write"] += 1
        self.counts["write_at_once"] += 1
        self._channel.reply(codec.reply_write(unique, written))
        return True

    async def _answer_write(self, unique: int, fh: int, offset: int, data: bytes | memoryview | PipedWrite) -> None:
        self.counts["write"] += 1
        handed = False
        try:
            written = await self._operations.write(fh, offset, data)
        except FSError as err:
            if not _handed(data):  # else its worker answers it; the failure sticks to the file
                self._channel.reply(failure(unique, err.errno))
            return
        except BaseException:
            if not _handed(data):
                self._channel.reply(codec.reply_error(unique, errno.EIO))
            raise
        finally:
            if isinstance(data, PipedWrite):
                handed = data.state == HANDED
                if data.state == PENDING:
                    _empty(data)  # failed before its bytes were needed: the pipe is free again
        if handed:
            self.counts["write_by_worker"] += 1
            return  # its worker answers it once it has the bytes
        self._channel.reply(codec.reply_write(unique, written))


def _started(coroutine: Coroutine[Any, Any, None]) -> _Resumed | None:
    """Run ``coroutine`` until it first waits: None if it finished (a cached
    LOOKUP or GETATTR, a RELEASE of a reader: no wait, and so no other task
    scheduled), else what resumes it in the task that awaits it next."""
    try:
        trap = coroutine.send(None)
    except StopIteration:
        return None
    return _Resumed(coroutine, trap)


class _Resumed:
    """A coroutine that has run up to its first wait, and the value it yielded
    there: awaiting this hands that value to the event loop and goes on, as
    awaiting the coroutine from its start would have. The task that awaits it
    is the one it started in (the receiving task), with nothing awaited between."""

    __slots__ = ("_coroutine", "_trap")

    def __init__(self, coroutine: Coroutine[Any, Any, None], trap: Any) -> None:
        self._coroutine = coroutine
        self._trap = trap

    def __await__(self) -> Generator[Any, Any, None]:
        coroutine, message = self._coroutine, self._trap
        while True:
            try:
                answer = yield message
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as err:  # noqa: B036  # delivered to the coroutine, which decides
                try:
                    message = coroutine.throw(err)
                except StopIteration:
                    return
            else:
                try:
                    message = coroutine.send(answer)
                except StopIteration:
                    return


def _handed(data: object) -> bool:
    return isinstance(data, PipedWrite) and data.state == HANDED


def _empty(write: PipedWrite) -> None:
    try:
        write.land()
    except OSError as err:
        log.warning("a failed WRITE's pipe could not be emptied: %s", err.strerror)
