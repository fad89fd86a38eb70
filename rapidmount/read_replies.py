"""READ replies written by the process that holds the bytes.

pyfuse3 answers every READ itself: its read coroutine copies the reply into
the kernel on the FUSE process's one thread, which was most of that process's
system time on sequential reads. A data-plane worker holds the same
``/dev/fuse`` descriptor (for page-cache stores) and maps the arena the bytes
are in, and the kernel matches a reply to its READ by the request's
``unique`` alone. So a worker can write the reply, and the FUSE process only
frees libfuse's request.

pyfuse3 gives a read handler neither the request nor its ``unique``. This
module replaces pyfuse3's read coroutine (``pyfuse3.fuse_read_async``, which
pyfuse3 looks up by name at every READ) with one that reads them at fixed
offsets in pyfuse3's request container and in libfuse's request. Those are
private structures, so :func:`probe` checks them before anything changes:

* ``pyfuse3._Container`` has the size of the layout below (:data:`_CONTAINER`);
* libfuse's ``fuse_req_ctx(req)`` is ``req + 64``: the request begins with its
  session, ``unique``, a counter and a mutex, as in libfuse 3.x;
* the first READs (:data:`CHECKED_READS`) are answered by pyfuse3's own
  coroutine, while the handle, offset and size read at those offsets are
  compared with the ones pyfuse3 passes; one difference puts pyfuse3's
  coroutine back for good.

Whoever writes a reply, libfuse's request is then freed exactly once: with
``fuse_reply_none`` after a reply the kernel took, or by libfuse's own
``fuse_reply_buf`` or ``fuse_reply_err`` otherwise. A reply the kernel refuses
with ENOENT (the READ was interrupted, or, were the offsets ever wrong, no
such request) is made again by libfuse, which knows the request for sure.
"""

from __future__ import annotations

import collections
import contextvars
import ctypes
import ctypes.util
import errno
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pyfuse3

from rapidmount.dataplane.pagestore import error_reply, reply_header
from rapidmount.storage.seam import ReadReply
from rapidmount.views import pieces

log = logging.getLogger("rapidmount.fuse")

#: Smaller replies are written by the FUSE process: a hop to a worker would
#: cost a random read more latency than the copy it saves.
WORKER_REPLY_MIN = 128 * 1024
#: READs answered by pyfuse3's own coroutine while the offsets are checked.
CHECKED_READS = 4


@dataclass(frozen=True)
class _Layout:
    """Offsets in pyfuse3 3.x's ``_Container`` (PyObject header, rdev, a
    ``fuse_file_info``, ino, parent, req, flags, mode, off, size, a ``struct
    stat``, fh) on 64-bit Linux, and of ``unique`` in libfuse's request."""

    size: int = 264
    req: int = 80
    off: int = 96
    length: int = 104
    fh: int = 256
    unique: int = 8
    ctx: int = 64


_CONTAINER = _Layout()
#: pyfuse3's read coroutine, looked up by this name at every READ.
_PYFUSE3_READ = "fuse_read_async"

#: Answers a READ from a worker: ``(unique, data)`` -> True once the kernel
#: took the reply, False when it refused it (ENOENT) or no worker can write it.
WorkerReply = Callable[[int, Any], Awaitable[bool]]
#: Has a worker answer a READ without waiting: ``(unique, data, on_answer)``
#: -> True once sent (``on_answer(taken)`` runs later, in the FUSE process),
#: False when no worker can write it.
WorkerReplySoon = Callable[[int, Any, Callable[[bool], None]], Awaitable[bool]]
#: As WorkerReplySoon, sent at once or not at all: False when the call cannot go now.
WorkerReplyNow = Callable[[int, Any, Callable[[bool], None]], bool]
#: The mount's read done at once if it needs no wait: ``(fh, offset, size)`` ->
#: the bytes, or None (then the READ becomes a task).
ReadNow = Callable[[int, int, int], Any]


class _Libfuse:
    """libfuse's calls that end a request, and ``fuse_req_ctx`` for the layout check, through ctypes."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.reply_none = lib.fuse_reply_none
        self.reply_none.argtypes, self.reply_none.restype = (ctypes.c_void_p,), None
        self.reply_err = lib.fuse_reply_err
        self.reply_err.argtypes, self.reply_err.restype = (ctypes.c_void_p, ctypes.c_int), ctypes.c_int
        self.reply_buf = lib.fuse_reply_buf
        self.reply_buf.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
        self.reply_buf.restype = ctypes.c_int
        self.req_ctx = lib.fuse_req_ctx
        self.req_ctx.argtypes, self.req_ctx.restype = (ctypes.c_void_p,), ctypes.c_void_p


def probe() -> tuple[_Libfuse | None, str]:
    """libfuse's calls, or None with the reason the layouts cannot be trusted."""
    container = getattr(pyfuse3, "_Container", None)
    if not hasattr(pyfuse3, _PYFUSE3_READ) or container is None:
        return None, f"pyfuse3 {pyfuse3.__version__} has no read coroutine to replace"
    if container.__basicsize__ != _CONTAINER.size or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None, f"pyfuse3 {pyfuse3.__version__}'s request container has another layout"
    name = ctypes.util.find_library("fuse3") or "libfuse3.so.3"
    try:
        libfuse = _Libfuse(ctypes.CDLL(name))
    except (OSError, AttributeError) as err:
        return None, f"cannot load libfuse: {err}"
    base = 1 << 20  # fuse_req_ctx only adds an offset: no request is touched
    if libfuse.req_ctx(base) != base + _CONTAINER.ctx:
        return None, "libfuse's request has another layout"
    return libfuse, ""


class ReadReplies:
    """Answers READs in place of pyfuse3's read coroutine (see the module's text).

    ``read`` is the mount's read operation (what pyfuse3 would call);
    ``device`` the FUSE process's ``/dev/fuse`` descriptor; ``worker_reply``
    lets a worker write replies of at least :data:`WORKER_REPLY_MIN` bytes;
    ``counts`` counts replies by who wrote them.
    """

    def __init__(self, libfuse: _Libfuse | None, read: Callable[..., Awaitable[Any]], device: int,
                 worker_reply: WorkerReply | None, counts: collections.Counter[str], *,
                 worker_reply_soon: WorkerReplySoon | None = None, worker_reply_now: WorkerReplyNow | None = None,
                 read_now: ReadNow | None = None,
                 writev: Callable[[int, list[Any]], int] = os.writev) -> None:
        self._libfuse = libfuse
        self._read = read
        self._read_now = read_now
        self._device = device
        self._worker_reply = worker_reply
        self._worker_reply_soon = worker_reply_soon
        self._worker_reply_now = worker_reply_now
        #: READs :meth:`answer` took and whose reply is not written yet (the
        #: request loop drops an INTERRUPT of one of them).
        self.answering: set[int] = set()
        self.counts = counts
        self._writev = writev
        self._pyfuse3_read: Callable[[Any], Awaitable[None]] = getattr(pyfuse3, _PYFUSE3_READ)
        # The offsets matched for CHECKED_READS READs while installed. Only a
        # mismatch uninstalls before that, so a trusted one is still installed.
        self._trusted = False
        self._checked = 0
        self._expected: contextvars.ContextVar[tuple[int, int, int] | None] = contextvars.ContextVar(
            "expected_read", default=None)

    @property
    def installed(self) -> bool:
        return bool(getattr(pyfuse3, _PYFUSE3_READ) == self._read_request)

    def install(self) -> None:
        self._pyfuse3_read = getattr(pyfuse3, _PYFUSE3_READ)
        setattr(pyfuse3, _PYFUSE3_READ, self._read_request)

    def uninstall(self) -> None:
        if self.installed:
            setattr(pyfuse3, _PYFUSE3_READ, self._pyfuse3_read)

    async def checked_read(self, fh: int, off: int, size: int) -> Any:
        """The read operation pyfuse3's coroutine calls, with the values it
        took from the request: while the offsets are checked, they must be the
        ones read here."""
        expected = self._expected.get()
        if expected is not None and expected != (fh, off, size):
            log.warning("READ replies stay with pyfuse3: its request container held %s where %s was expected",
                        expected, (fh, off, size))
            self.uninstall()
        return await self._read(fh, off, size)

    async def answer(self, unique: int, fh: int, off: int, size: int) -> None:
        """Answer READ ``unique``, received by the mount's own request loop
        (:mod:`rapidmount.request_loop`): there is no libfuse request, so
        every reply, an error too, is written to ``/dev/fuse`` here.
        ``unique`` stays in :attr:`answering` until its reply is written."""
        answering = self.answering
        answering.add(unique)
        pending = False
        # A read straight from a worker's stream is answered by that worker as
        # its bytes land, unless worker replies are off.
        reply = None if self._worker_reply_soon is None else ReadReply(unique)
        try:
            data = await self._data(fh, off, size, lambda code: self._write_error(unique, code), gather=True,
                                    reply=reply)
            if data is None:
                return
            if reply is not None and reply.sent:
                self.counts["landed"] += 1
                return
            if self._worker_reply_soon is not None and len(data) >= WORKER_REPLY_MIN:
                pending = await self._worker_reply_soon(unique, data, self._answered(unique, data))
                if pending:
                    return  # the READ's task ends here; the answer comes to ``_answered``
            self._write_reply(unique, data)
        finally:
            if not pending:
                answering.discard(unique)

    def answer_now(self, unique: int, fh: int, off: int, size: int) -> bool:
        """Answer READ ``unique`` at once if its bytes need no wait
        (``read_now``): a worker writes the reply if its call can go now,
        else this process. False: nothing done, the READ needs :meth:`answer`."""
        data = None if self._read_now is None else self._read_now(fh, off, size)
        if data is None:
            return False
        if self._worker_reply_now is not None and len(data) >= WORKER_REPLY_MIN:
            self.answering.add(unique)
            if self._worker_reply_now(unique, data, self._answered(unique, data)):
                return True
            self.answering.discard(unique)
        self._write_reply(unique, data)
        return True

    def _answered(self, unique: int, data: Any) -> Callable[[bool], None]:
        """What runs at a worker's answer to the reply of READ ``unique``."""
        def answered(taken: bool) -> None:
            self.answering.discard(unique)
            if taken:
                self.counts["worker"] += 1
            else:  # refused (interrupted: refused here too), or the worker died first
                self._write_reply(unique, data)
        return answered

    async def _data(self, fh: int, off: int, size: int, fail: Callable[[int], object], *,
                    gather: bool = False, reply: ReadReply | None = None) -> Any | None:
        """The bytes of a READ (``gather``: maybe a :class:`Gathered` of views;
        ``reply``: the READ, which the storage may answer itself), or None once
        ``fail(errno)`` answered it (EIO, and the exception goes on, for
        anything but a FUSEError). pyfuse3's own read takes neither."""
        try:
            if gather or reply is not None:
                return await self._read(fh, off, size, gather, reply)
            return await self._read(fh, off, size)
        except pyfuse3.FUSEError as err:
            fail(err.errno)
            return None
        except BaseException:
            fail(errno.EIO)
            raise

    def _write_reply(self, unique: int, data: Any) -> None:
        """This process writes the reply; one the kernel no longer waits for is dropped."""
        try:
            self._writev(self._device, [reply_header(unique, len(data)), *pieces(data)])
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.info("a READ reply was refused (%s)", err.strerror)
                self._write_error(unique, errno.EIO)  # the kernel still waits for an answer
            return
        self.counts["fuse"] += 1

    def _write_error(self, unique: int, code: int) -> None:
        try:
            self._writev(self._device, [error_reply(unique, code)])
        except OSError:
            pass  # the kernel no longer waits for it

    async def _read_request(self, c: Any) -> None:
        """pyfuse3's ``fuse_read_async``: answer the READ in container ``c``."""
        base = id(c)
        layout = _CONTAINER
        req = ctypes.c_void_p.from_address(base + layout.req).value or 0
        fh = ctypes.c_uint64.from_address(base + layout.fh).value
        off = ctypes.c_int64.from_address(base + layout.off).value
        size = ctypes.c_size_t.from_address(base + layout.length).value
        if not self._trusted:
            # pyfuse3's coroutine answers; checked_read compares what it passes.
            token = self._expected.set((fh, off, size))
            try:
                await self._pyfuse3_read(c)
            finally:
                self._expected.reset(token)
            self.counts["libfuse"] += 1
            self._checked += 1
            self._trusted = self._checked >= CHECKED_READS and self.installed
            return
        libfuse = self._libfuse
        assert libfuse is not None  # installed into pyfuse3 only with libfuse's calls
        data = await self._data(fh, off, size, lambda code: libfuse.reply_err(req, code))
        if data is not None:
            await self._answer(req, ctypes.c_uint64.from_address(req + _CONTAINER.unique).value, data)

    async def _answer(self, req: int, unique: int, data: Any) -> None:
        """Reply ``data`` to READ ``unique`` whose libfuse request is ``req``
        (pyfuse3's loop), and free the request exactly once."""
        libfuse = self._libfuse
        assert libfuse is not None  # a request comes with libfuse
        if self._worker_reply is not None and len(data) >= WORKER_REPLY_MIN:
            try:
                taken = await self._worker_reply(unique, data)
            except BaseException:
                self._by_libfuse(req, data)  # refused by the kernel if the worker had answered
                raise
            if taken:
                self.counts["worker"] += 1
                libfuse.reply_none(req)
                return
        try:
            self._writev(self._device, [reply_header(unique, len(data)), data])
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.info("a READ reply was refused (%s); libfuse answers it", err.strerror)
            self._by_libfuse(req, data)
            return
        self.counts["fuse"] += 1
        libfuse.reply_none(req)

    def _by_libfuse(self, req: int, data: Any) -> None:
        """libfuse answers (and frees) the request itself; the kernel refuses
        it (ENOENT, which libfuse ignores) if it no longer waits for it."""
        assert self._libfuse is not None  # a request comes with libfuse
        self.counts["libfuse"] += 1
        self._libfuse.reply_buf(req, data if isinstance(data, bytes) else bytes(data), len(data))
