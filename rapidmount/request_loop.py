"""The mount's own FUSE request loop: READ and WRITE answered without libfuse.

pyfuse3's loop hands every request to libfuse, which allocates a request,
calls pyfuse3's handler, which copies a WRITE's bytes into a new ``bytes``
and makes a coroutine that pyfuse3's loop awaits. On the data path that was
most of the FUSE process's work per MiB. This loop reads each request from
``/dev/fuse`` itself, into buffers of its own:

* a READ is parsed here and answered with a write of the reply to
  ``/dev/fuse`` (by a worker or by this process, :mod:`rapidmount.read_replies`);
  one within a block the cache holds is answered at once, with no task
  (``read_now``), and the next request received;
* a WRITE's bytes are read by the kernel straight into the shared-memory
  region (or, the arena full, the ``bytes``) the write path then keeps (a
  WRITE of 512 KiB or more is never copied in this process), and its reply
  is written here;
* while WRITEs of 512 KiB or more come, each request is spliced into a pipe
  instead (:mod:`~rapidmount.dataplane.write_pipes`): only its headers are
  read here, and the worker appending the file reads a WRITE's bytes into
  their region and answers it;
* a large WRITE the write path can take without a wait (an append to a
  streaming file, ``write_now``) is taken at once, with no task: the loop
  answers it, or leaves that to the worker it was handed to, and receives
  the next request;
* an INTERRUPT of a request answered here is dropped (the request is
  answered soon anyway);
* every other request goes to libfuse (``fuse_session_process_buf``), which
  calls pyfuse3's handler as pyfuse3's own loop would; the coroutine the
  handler makes is awaited here (FORGET's handler calls the mount's
  ``forget`` itself, which is taken the same way).

Requests are received and handled as pyfuse3 does: by a pool of tasks, one
receiving at a time, each awaiting the request it received, another task
started when none is left waiting. So every handler starts in the order
its request came, as before.

libfuse needs its session, which pyfuse3 keeps in a C variable of its own:
:func:`probe` finds it in pyfuse3's symbol table and checks that libfuse
gives that session's descriptor as the mount's ``/dev/fuse``. Anything else
leaves every request with pyfuse3's loop, with a log line that says why.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import struct
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, cast

import pyfuse3
import trio

from rapidmount.dataplane.pagestore import error_reply
from rapidmount.dataplane.write_pipes import HANDED, PENDING, Pipe, PipedWrite, WritePipes
from rapidmount.locks import QuickLock

log = logging.getLogger("rapidmount.fuse")

FUSE_READ, FUSE_WRITE, FUSE_INTERRUPT = 15, 16, 36

#: ``fuse_in_header``: len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding.
IN_HEADER = struct.Struct("<IIQQIIIHH")
#: ``fuse_read_in`` and ``fuse_write_in`` begin alike: fh, offset, size, read or write flags.
READ_WRITE_IN = struct.Struct("<QQII")
#: ``fuse_out_header`` (len, error, unique), then ``fuse_write_out`` (size, padding).
WRITE_OUT = struct.Struct("<IiQII")
#: A WRITE's headers (``fuse_in_header`` and ``fuse_write_in``): what is read before its bytes.
HEAD = IN_HEADER.size + 40
#: The largest WRITE libfuse 3 asks the kernel for (256 pages), unless the
#: mount asks for larger requests (:func:`raise_request_size`).
MAX_WRITE = 256 * 4096
#: An arena region for WRITE buffers holds this many of MAX_WRITE (one
#: allocation per this many 1 MiB WRITEs), or one of the largest if larger.
SLOTS = 4
#: The smallest WRITE whose bytes stay where the kernel put them (a region, or a pipe).
HELD_WRITE = MAX_WRITE // 2
#: Room after a whole WRITE, so that the buffer is never too small for a request.
SPILL = 64 * 4096
PAGE = 4096
#: WRITEs answered in a row without a task before the loop lets other tasks run.
TURN_AFTER = 16
#: ``PyBytesObject``'s header before its bytes, on 64-bit CPython.
BYTES_HEADER = 32
#: pyfuse3 keeps libfuse's session in this C variable.
SESSION_SYMBOL = b"__pyx_v_7pyfuse3_session"

#: Receives a READ: ``(unique, fh, offset, size)``; it writes the reply itself,
#: and keeps ``unique`` in the loop's ``answering`` set until then.
ReadHandler = Callable[[int, int, int, int], Awaitable[None]]
#: The mount's write operation: ``(fh, offset, data)`` -> bytes written.
#: ``data`` is ``bytes`` or a view of the arena, given up by the loop.
WriteHandler = Callable[[int, int, Any], Awaitable[int]]
#: The mount's write done at once if it needs no wait: ``(fh, offset, data)`` ->
#: bytes written, or None (then the WRITE becomes a task calling WriteHandler).
WriteNow = Callable[[int, int, Any], "int | None"]
#: A READ answered at once if it needs no wait: ``(unique, fh, offset, size)`` ->
#: True once answered (or left to a worker), False (nothing done: it becomes a task).
ReadNow = Callable[[int, int, int, int], bool]
#: Whether the WRITEs of handle ``fh`` come from the page cache, whose pages the
#: kernel lends a pipe; a direct handle's bytes are copied into the pipe instead.
FromPageCache = Callable[[int], bool]
#: Shared memory for a WRITE's bytes: ``length`` -> ``(offset, view)``, or None when full.
Allocate = Callable[[int], "tuple[int, memoryview] | None"]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


class _FuseBuf(ctypes.Structure):
    """libfuse 3's ``struct fuse_buf``."""

    _fields_ = [("size", ctypes.c_size_t), ("flags", ctypes.c_int), ("mem", ctypes.c_void_p),
                ("fd", ctypes.c_int), ("pos", ctypes.c_int64)]


class Libfuse:
    """libfuse's session calls, and libc's ``readv``, through ctypes."""

    def __init__(self, lib: ctypes.CDLL, libc: ctypes.CDLL) -> None:
        self.process_buf = lib.fuse_session_process_buf
        self.process_buf.argtypes, self.process_buf.restype = (ctypes.c_void_p, ctypes.POINTER(_FuseBuf)), None
        self.session_fd = lib.fuse_session_fd
        self.session_fd.argtypes, self.session_fd.restype = (ctypes.c_void_p,), ctypes.c_int
        self.exit = lib.fuse_session_exit
        self.exit.argtypes, self.exit.restype = (ctypes.c_void_p,), None
        self.exited = lib.fuse_session_exited
        self.exited.argtypes, self.exited.restype = (ctypes.c_void_p,), ctypes.c_int
        self.readv = libc.readv
        self.readv.argtypes, self.readv.restype = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_int), ctypes.c_ssize_t
        self.version = libfuse_version(lib)


def _symbol_offset(path: str, name: bytes) -> int | None:
    """The value of symbol ``name`` in the ELF64 symbol table of ``path``, if there is one."""
    with open(path, "rb") as file:
        elf = file.read()
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + index * shentsize) for index in range(shnum)]
    for _, kind, _, _, offset, size, link, _, _, entsize in sections:
        if kind != 2 or not entsize:  # SHT_SYMTAB
            continue
        strings = elf[sections[link][4]:sections[link][4] + sections[link][5]]
        at = strings.find(b"\0" + name + b"\0")
        if at < 0:
            return None
        for symbol in range(offset, offset + size, entsize):
            st_name, _, _, _, value, _ = struct.unpack_from("<IBBHQQ", elf, symbol)
            if st_name == at + 1:
                return int(value)
    return None


def _load_base(path: str) -> int | None:
    """Where the shared object ``path`` begins in this process (its mapping at file offset 0)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == real and int(fields[2], 16) == 0:
                return int(fields[0].split("-")[0], 16)
    return None


def probe(device: int) -> tuple[Libfuse | None, int, str]:
    """libfuse's calls and pyfuse3's session, or ``(None, 0, why not)``."""
    if sys.byteorder != "little" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None, 0, "not a 64-bit little-endian machine"
    if not hasattr(pyfuse3, "fuse_write_async"):
        return None, 0, f"pyfuse3 {pyfuse3.__version__} has no request coroutines to take"
    probe_bytes = b"probe"
    if ctypes.cast(ctypes.c_char_p(probe_bytes), ctypes.c_void_p).value != id(probe_bytes) + BYTES_HEADER:
        return None, 0, "bytes objects have another layout"
    module = getattr(pyfuse3, "__file__", None) or ""
    try:
        offset = _symbol_offset(module, SESSION_SYMBOL)
        base = _load_base(module)
    except (OSError, struct.error) as err:
        return None, 0, f"cannot read pyfuse3's symbols: {err}"
    if offset is None or base is None:
        return None, 0, "pyfuse3's session is not in its symbol table"
    try:
        # PyDLL: libfuse calls pyfuse3's handlers, which need the interpreter lock held.
        libfuse = Libfuse(ctypes.PyDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3"),
                          ctypes.CDLL(None, use_errno=True))
    except (OSError, AttributeError) as err:
        return None, 0, f"cannot load libfuse: {err}"
    session = ctypes.c_void_p.from_address(base + offset).value
    if not session or libfuse.session_fd(session) != device:
        return None, 0, "pyfuse3's session does not hold the mount's /dev/fuse"
    return libfuse, session, ""


_bytes_from_string = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_from_string.argtypes, _bytes_from_string.restype = (ctypes.c_void_p, ctypes.c_ssize_t), ctypes.py_object


def _new_bytes(size: int) -> bytes:
    """A ``bytes`` of ``size`` bytes not yet written: the kernel writes them
    before anyone else sees the object."""
    return _bytes_from_string(None, size)  # type: ignore[no-any-return]


class RequestLoop:
    """Receives the mount's FUSE requests in place of ``pyfuse3.main``."""

    def __init__(self, libfuse: Libfuse, session: int, device: int, read: ReadHandler, write: WriteHandler,
                 counts: collections.Counter[str], *, allocate: Allocate | None = None,
                 answering: set[int] | None = None, min_tasks: int = 4, max_tasks: int = 128,
                 max_write: int = MAX_WRITE, operations: Any = None, pipes: WritePipes | None = None,
                 write_now: WriteNow | None = None, read_now: ReadNow | None = None,
                 from_page_cache: FromPageCache | None = None) -> None:
        self._libfuse = libfuse
        self._session = session
        self._device = device
        self._read = read
        self._read_now = read_now
        self._write = write
        self._write_now = write_now
        self.counts = counts
        self._min_tasks = min_tasks
        self._max_tasks = max_tasks
        self._lock = QuickLock()  # one task receives at a time
        self._tasks = 0
        self._waiting = 0  # tasks waiting to receive
        self._ended = False
        # Uniques of the READs and WRITEs received here and not answered yet:
        # a WRITE's the loop keeps; a READ's its handler keeps (its reply may
        # be written after the handler returned), in this same set.
        self.answering: set[int] = set() if answering is None else answering
        self._captured: Coroutine[Any, Any, None] | None = None
        self._taken: dict[str, Any] = {}
        # pyfuse3 calls ``operations.forget`` itself for FORGET and keeps the
        # coroutine for its own loop: taken here too, or no FORGET ever runs.
        self._operations = operations
        self._own_forget: Any = None  # an instance's own forget, put back at the end
        # The buffers a request is read into: its headers, a WRITE's bytes, then room for anything longer.
        self._max_write = max_write
        self._region_size = max(SLOTS * MAX_WRITE, max_write)  # the largest WRITE fits a new one
        self._head = ctypes.create_string_buffer(HEAD)
        self._spill = ctypes.create_string_buffer(max_write + SPILL)
        self._allocate = allocate
        self._iov = (_IoVec * 3)(_IoVec(ctypes.addressof(self._head), HEAD), _IoVec(0, 0),
                                 _IoVec(ctypes.addressof(self._spill), max_write + SPILL))
        # The same vector in parts: the headers alone, and what follows them (from a pipe).
        self._head_iov = (_IoVec * 1).from_address(ctypes.addressof(self._iov))
        self._rest_iov = (_IoVec * 2).from_address(ctypes.addressof(self._iov) + ctypes.sizeof(_IoVec))
        self._pipes = pipes
        self._from_page_cache = from_page_cache
        self._splicing = False  # large WRITEs come: splice the next request
        self._spare: Pipe | None = None  # a pipe taken, and still empty: nothing was spliced into it
        self._region_offset = 0  # the region's offset in the arena
        self._data: bytes | memoryview = b""
        self._region: memoryview | None = None  # the arena region ``_data`` is part of
        self._region_address = 0
        self._cursor = 0  # where ``_data`` begins in the region: what is before it, WRITEs own
        self._new_buffer()

    def _new_buffer(self) -> None:
        """The next request's bytes after its headers go to the start of a new
        arena region (the worker that sends a WRITE's bytes reads them there;
        the region returns to the arena once no WRITE holds a part of it), or
        to a new ``bytes`` when the arena is full."""
        allocated = self._allocate(self._region_size) if self._allocate is not None else None
        self._region, self._cursor = (None, 0) if allocated is None else (allocated[1], 0)
        self._region_offset = allocated[0] if allocated is not None else 0
        if self._region is not None:
            self._region_address = ctypes.addressof(ctypes.c_char.from_buffer(self._region))
            self._at_cursor()
        else:
            self._data = _new_bytes(self._max_write)
            self._iov[1].base, self._iov[1].length = id(self._data) + BYTES_HEADER, self._max_write

    def _at_cursor(self) -> None:
        assert self._region is not None
        end = min(self._cursor + self._max_write, self._region_size)
        self._data = self._region[self._cursor:end]
        self._iov[1].base, self._iov[1].length = self._region_address + self._cursor, end - self._cursor

    def _take(self, size: int) -> bytes | memoryview:
        """The first ``size`` bytes of the buffer, which the kernel wrote a
        WRITE's bytes into: the WRITE's now. The next request goes after them
        (page-aligned) while the region has room for another WRITE as large
        (and at least 1 MiB), else to a new buffer."""
        data = self._data if size == len(self._data) else memoryview(self._data)[:size]
        if self._region is not None:
            self._cursor += -(-size // PAGE) * PAGE
            if self._region_size - self._cursor >= max(size, MAX_WRITE):
                self._at_cursor()
                return data
        self._new_buffer()
        return data

    # -- pyfuse3's handlers, through libfuse ------------------------------------------------------

    def _take_coroutines(self) -> None:
        """pyfuse3's C handlers call ``pyfuse3.fuse_<op>_async`` by name and keep
        the coroutine for their loop; wrapped, it comes here instead."""
        for name in dir(pyfuse3):
            if name.startswith("fuse_") and name.endswith("_async"):
                original = getattr(pyfuse3, name)
                self._taken[name] = original
                setattr(pyfuse3, name, self._capturing(original))
        operations = self._operations
        if operations is not None:
            self._own_forget = vars(operations).get("forget")
            operations.forget = self._capturing(operations.forget)

    def _give_back_coroutines(self) -> None:
        for name, original in self._taken.items():
            setattr(pyfuse3, name, original)
        self._taken.clear()
        if self._operations is not None:
            if self._own_forget is None:
                del self._operations.forget  # the class's method again
            else:
                self._operations.forget = self._own_forget

    def _capturing(self, original: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
        def capture(*args: Any) -> None:
            self._captured = original(*args)
        return capture

    async def _by_libfuse(self, message: bytes) -> None:
        buffer = _FuseBuf(len(message), 0, ctypes.cast(ctypes.c_char_p(message), ctypes.c_void_p), -1, 0)
        self._captured = None
        self._libfuse.process_buf(self._session, ctypes.byref(buffer))
        coroutine, self._captured = self._captured, None
        self.counts["libfuse"] += 1
        if coroutine is not None:
            await coroutine

    # -- the loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the session ends (unmounted, or ``pyfuse3.terminate()``)."""
        flags = fcntl.fcntl(self._device, fcntl.F_GETFL)
        fcntl.fcntl(self._device, fcntl.F_SETFL, flags | os.O_NONBLOCK)
        self._take_coroutines()
        try:
            async with trio.open_nursery() as nursery:
                self._tasks = 1
                nursery.start_soon(self._serve, nursery)
        finally:
            self._give_back_coroutines()
            fcntl.fcntl(self._device, fcntl.F_SETFL, flags)

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
        """The next request, parsed, as the awaitable that answers it; None once the session ended.
        WRITEs answered at once (``write_now``) are not returned: the next request is received."""
        libfuse = self._libfuse
        in_a_row = 0
        while not self._ended:
            if in_a_row >= TURN_AFTER:
                in_a_row = 0
                await trio.lowlevel.checkpoint()  # the WRITEs kept coming: let the others run
                continue
            pipe = None
            if self._splicing and self._pipes is not None:
                # The pipe the last try found nothing for is still empty (unless replaced meanwhile).
                spare, self._spare = self._spare, None
                pipe = spare if spare is not None and spare in self._pipes.pipes else self._pipes.take()
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
                received = libfuse.readv(self._device, self._iov, 3)
                if received > 0:
                    request = self._parse(received)
                    if request is not None:
                        return request
                    in_a_row += 1
                    continue
                code = ctypes.get_errno() if received < 0 else errno.ENODEV
            if code == errno.EAGAIN:
                if libfuse.exited(self._session):
                    break
                try:
                    await trio.lowlevel.wait_readable(self._device)
                except trio.ClosedResourceError:  # pyfuse3.terminate()
                    break
                in_a_row = 0  # the others ran meanwhile
            elif code == errno.ENODEV:  # unmounted
                libfuse.exit(self._session)
                break
            elif code not in (errno.EINTR, errno.ENOENT):  # ENOENT: interrupted before it was read
                raise OSError(code, f"reading a FUSE request: {os.strerror(code)}")
        self._ended = True
        return None

    def _from_pipe(self, pipe: Pipe, spliced: int) -> Awaitable[None] | None:
        """A request spliced into ``pipe``: a large WRITE whose bytes can go
        to the region at the cursor is answered with its bytes left there;
        anything else is read whole and parsed as if read from the device.
        None: answered already."""
        libfuse = self._libfuse
        got = libfuse.readv(pipe.read_fd, self._head_iov, 1)
        if got != min(spliced, HEAD):
            raise OSError(errno.EIO, f"read {got} of a request's first {min(spliced, HEAD)} bytes from its pipe")
        if spliced > HEAD:
            _, opcode, unique, _, _, _, _, _, _ = IN_HEADER.unpack_from(self._head.raw)
            if opcode == FUSE_WRITE:
                fh, offset, size, _ = READ_WRITE_IN.unpack_from(self._head.raw, IN_HEADER.size)
                self._splicing = self._splices(fh)
                if size >= HELD_WRITE and spliced == HEAD + size:
                    if self._region is not None and size > len(self._data):
                        self._new_buffer()  # the region's tail is too short
                    if self._region is not None and size <= len(self._data):
                        arena_offset = self._region_offset + self._cursor
                        write = PipedWrite(pipe, cast(memoryview, self._take(size)), arena_offset, unique)
                        if self._answered_now(unique, fh, offset, write):
                            return None
                        return self._answer_write(unique, fh, offset, write)
            rest = libfuse.readv(pipe.read_fd, self._rest_iov, 2)
            if rest != spliced - HEAD:
                raise OSError(errno.EIO, f"read {rest} of a request's last {spliced - HEAD} bytes from its pipe")
            got += rest
        return self._parse(got)

    def _parse(self, received: int) -> Awaitable[None] | None:
        """The request read into the buffers, as the awaitable that answers it; None: answered already."""
        head = self._head.raw
        _, opcode, unique, _, _, _, _, _, _ = IN_HEADER.unpack_from(head)
        if opcode == FUSE_READ:
            fh, offset, size, _ = READ_WRITE_IN.unpack_from(head, IN_HEADER.size)
            if self._read_now is not None and self._read_now(unique, fh, offset, size):
                self.counts["read"] += 1
                self.counts["read_at_once"] += 1
                return None
            return self._answer_read(unique, fh, offset, size)
        if opcode == FUSE_WRITE:
            fh, offset, size, _ = READ_WRITE_IN.unpack_from(head, IN_HEADER.size)
            self._splicing = size >= HELD_WRITE and self._pipes is not None and self._splices(fh)
            if received != HEAD + size:  # not the layout expected: libfuse knows better
                return self._by_libfuse(self._message(head, received))
            data = self._data
            if size > len(data):  # a region's tail was too short: the rest went to the spill
                data = b"".join((data, memoryview(self._spill)[:size - len(data)]))
                self._new_buffer()
            elif size >= HELD_WRITE and (isinstance(data, memoryview) or size == len(data)):
                # The kernel wrote the bytes there: they stay, no copy (a bytes
                # of the arena-full case only whole, so the write path keeps it).
                data = self._take(size)
                if self._answered_now(unique, fh, offset, data):
                    return None
            else:
                data = bytes(memoryview(data)[:size])
            return self._answer_write(unique, fh, offset, data)
        self._splicing = False
        if opcode == FUSE_INTERRUPT and struct.unpack_from("<Q", head, IN_HEADER.size)[0] in self.answering:
            return self._dropped()  # its request is answered here, soon
        return self._by_libfuse(self._message(head, received))

    def _splices(self, fh: int) -> bool:
        """Whether the next request goes into a pipe after a large WRITE of
        ``fh``: only for WRITEs from the page cache. The kernel copies a direct
        writer's bytes into a pipe, and the worker would copy them once more;
        read from /dev/fuse, they are copied once, into the arena."""
        return self._from_page_cache is None or self._from_page_cache(fh)

    def _answered_now(self, unique: int, fh: int, offset: int, data: memoryview | bytes | PipedWrite) -> bool:
        """A WRITE the write path could take at once (``write_now``): answered
        here, or by the worker it was handed to. False: it needs a task."""
        if self._write_now is None:
            return False
        written = self._write_now(fh, offset, data)
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
        self.reply(WRITE_OUT.pack(WRITE_OUT.size, 0, unique, written, 0))
        return True

    async def _dropped(self) -> None:
        self.counts["interrupt"] += 1

    def _message(self, head: bytes, received: int) -> bytes:
        """The request as one piece, for libfuse."""
        if received <= HEAD:
            return head[:received]
        rest, room = received - HEAD, len(self._data)
        if rest <= room:
            return head + memoryview(self._data)[:rest]
        return b"".join((head, self._data, memoryview(self._spill)[:rest - room]))

    async def _answer_read(self, unique: int, fh: int, offset: int, size: int) -> None:
        self.counts["read"] += 1
        await self._read(unique, fh, offset, size)

    async def _answer_write(self, unique: int, fh: int, offset: int, data: bytes | memoryview | PipedWrite) -> None:
        self.counts["write"] += 1
        self.answering.add(unique)
        handed = False
        try:
            written = await self._write(fh, offset, data)
        except pyfuse3.FUSEError as err:
            if not _handed(data):  # else its worker answers it; the failure sticks to the file
                self.reply(error_reply(unique, err.errno))
            return
        except BaseException:
            if not _handed(data):
                self.reply(error_reply(unique, errno.EIO))
            raise
        finally:
            self.answering.discard(unique)
            if isinstance(data, PipedWrite):
                handed = data.state == HANDED
                if data.state == PENDING:
                    _empty(data)  # failed before its bytes were needed: the pipe is free again
        if handed:
            self.counts["write_by_worker"] += 1
            return  # its worker answers it once it has the bytes
        self.reply(WRITE_OUT.pack(WRITE_OUT.size, 0, unique, written, 0))

    def reply(self, message: bytes) -> None:
        """Write a reply; one the kernel no longer waits for (ENOENT: interrupted, or aborted) is dropped."""
        try:
            os.write(self._device, message)
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.warning("a FUSE reply was refused: %s", err.strerror)


def _handed(data: object) -> bool:
    return isinstance(data, PipedWrite) and data.state == HANDED


def _empty(write: PipedWrite) -> None:
    try:
        write.land()
    except OSError as err:
        log.warning("a failed WRITE's pipe could not be emptied: %s", err.strerror)


#: libfuse 3's ``se->bufsize``: 256 pages, and a page for the headers.
LIBFUSE_BUFSIZE = MAX_WRITE + PAGE
#: How much of libfuse's session is searched for it: its ``struct
#: fuse_session`` is 920 bytes in 3.14, with the field at 904.
_SESSION_SCAN = 920
#: The libfuse versions whose INIT reply takes ``max_write`` and ``max_pages``
#: from that field alone (from 3.17 a limit of its own caps them).
_LIBFUSE_SIZED_BY_BUFSIZE = ((3, 6), (3, 16))


def libfuse_version(lib: ctypes.CDLL) -> tuple[int, int] | None:
    """libfuse's (major, minor), from ``fuse_pkgversion()``."""
    try:
        version = lib.fuse_pkgversion
    except AttributeError:
        return None
    version.argtypes, version.restype = (), ctypes.c_char_p
    parts = (version() or b"").decode(errors="replace").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def raise_request_size(session: int, size: int, version: tuple[int, int] | None) -> tuple[int, str]:
    """Have libfuse offer the kernel READs and WRITEs of up to ``size`` bytes.

    libfuse 3.6-3.16 answers INIT with ``max_write`` and ``max_pages`` from
    its session's buffer size, fixed at 256 pages, and nothing else sets
    them. The field is found by its value (exactly once in the session) and
    set before the session answers INIT; this loop reads every request into
    buffers of its own, so libfuse never reads into a buffer of that size.
    Returns the largest request to expect, and why it is not ``size``
    (MAX_WRITE for another libfuse, or where the field is not found)."""
    if size <= MAX_WRITE:
        return MAX_WRITE, ""
    low, high = _LIBFUSE_SIZED_BY_BUFSIZE
    if version is None or not low <= version <= high:
        return MAX_WRITE, f"libfuse {version} does not size its requests as 3.6-3.16 do"
    fields = [offset for offset in range(0, _SESSION_SCAN, 8)
              if ctypes.c_size_t.from_address(session + offset).value == LIBFUSE_BUFSIZE]
    if len(fields) != 1:
        return MAX_WRITE, f"libfuse's session holds its buffer size {len(fields)} times where once was expected"
    ctypes.c_size_t.from_address(session + fields[0]).value = size + PAGE
    return size, ""
