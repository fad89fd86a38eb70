"""The mount's own request loop, without FUSE: what it answers itself, what it
hands to libfuse, and where a WRITE's bytes land.

The device is one end of a SOCK_SEQPACKET pair (one read is one request, as
on ``/dev/fuse``); the test writes requests into the other end and reads the
replies back. libfuse is a recorder that reads the ``struct fuse_buf`` it is
given; readv is libc's own. pyfuse3's handler coroutines are replaced by
recording ones, which the loop then takes as it takes pyfuse3's.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import os
import socket
import struct

import pyfuse3
import pytest
import trio
import trio.testing

from rapidmount import request_loop
from rapidmount.dataplane.arena import Arena
from rapidmount.dataplane.write_pipes import HANDED, PipedWrite, WritePipes
from rapidmount.request_loop import (FUSE_INTERRUPT, FUSE_READ, FUSE_WRITE, HEAD, IN_HEADER, MAX_WRITE, RequestLoop,
                                     _FuseBuf)

KiB, MiB = 1 << 10, 1 << 20
FUSE_GETATTR = 3
OUT = struct.Struct("<IiQ")


def request(opcode: int, unique: int, body: bytes = b"") -> bytes:
    return IN_HEADER.pack(IN_HEADER.size + len(body), opcode, unique, 1, 0, 0, 0, 0, 0) + body


def read_request(unique: int, fh: int, offset: int, size: int) -> bytes:
    return request(FUSE_READ, unique, struct.pack("<QQIIQII", fh, offset, size, 0, 0, 0, 0))


def write_request(unique: int, fh: int, offset: int, data: bytes) -> bytes:
    return request(FUSE_WRITE, unique, struct.pack("<QQIIQII", fh, offset, len(data), 0, 0, 0, 0) + data)


class Libfuse:
    """libfuse's session calls, recorded; libc's readv, real."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.processed: list[bytes] = []
        self.exits = 0
        self.readv = ctypes.CDLL(None, use_errno=True).readv
        self.readv.argtypes = (ctypes.c_int, ctypes.POINTER(request_loop._IoVec), ctypes.c_int)
        self.readv.restype = ctypes.c_ssize_t
        self.handler: str | None = None  # the pyfuse3 handler a processed request calls

    def process_buf(self, session: int, buffer) -> None:
        fuse_buf = buffer._obj if hasattr(buffer, "_obj") else buffer
        assert isinstance(fuse_buf, _FuseBuf) and fuse_buf.flags == 0
        message = ctypes.string_at(fuse_buf.mem, fuse_buf.size)
        self.processed.append(message)
        if self.handler == "operations.forget":  # as pyfuse3's FORGET handler: it keeps the coroutine
            self.loop_operations.forget([(IN_HEADER.unpack_from(message)[3], 1)])
        elif self.handler is not None:
            getattr(pyfuse3, self.handler)(message)

    def session_fd(self, session: int) -> int:
        return self.device

    def exit(self, session: int) -> None:
        self.exits += 1

    def exited(self, session: int) -> int:
        return 0


class Harness:
    def __init__(self, *, arena: Arena | None = None, write_error: int = 0, max_write: int = MAX_WRITE,
                 operations=None, pipes: WritePipes | None = None, write_now=None, read_now=None) -> None:
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (self.ours, self.kernel):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
        self.libfuse = Libfuse(self.ours.fileno())
        self.reads: list[tuple[int, int, int, int]] = []
        self.writes: list[tuple[int, int, object]] = []
        self.handled: list[bytes] = []
        self.write_error = write_error
        self.arena = arena
        self.counts: collections.Counter[str] = collections.Counter()
        self.release_read: trio.Event
        self.loop = RequestLoop(self.libfuse, 1, self.ours.fileno(), self._read, self._write, self.counts,  # type: ignore[arg-type]
                                allocate=arena.allocate if arena is not None else None, max_write=max_write,
                                operations=operations, pipes=pipes, write_now=write_now, read_now=read_now)
        self.libfuse.loop_operations = operations
        #: What the write operation does with bytes still in a pipe: "land"
        #: them (as a staged file's write), or "hand" them to a worker (as a stream's).
        self.piped = "land"
        self.pipes = pipes
        self.piped_views: list[memoryview] = []

    async def _read(self, unique: int, fh: int, offset: int, size: int) -> None:
        # As ReadReplies.answer: the READ is the loop's to answer until its reply is written.
        self.loop.answering.add(unique)
        self.reads.append((unique, fh, offset, size))
        await self.release_read.wait()
        os.write(self.ours.fileno(), OUT.pack(OUT.size + 3, 0, unique) + b"abc")
        self.loop.answering.discard(unique)

    async def _write(self, fh: int, offset: int, data) -> int:
        if self.write_error:
            raise pyfuse3.FUSEError(self.write_error)
        if isinstance(data, PipedWrite):
            self.piped_views.append(data.view)  # let go of once its pipe is seen empty
            if self.piped in ("hand", "hand, then fail"):
                assert self.pipes is not None
                self.pipes.handed(data, "worker")
                if self.piped == "hand, then fail":
                    raise pyfuse3.FUSEError(errno.EIO)
            else:
                data.land()
        self.writes.append((fh, offset, data))
        return len(data)

    def send(self, message: bytes) -> None:
        self.kernel.send(message)

    def reply(self) -> tuple[int, int, int, bytes]:
        message = self.kernel.recv(4 * MiB)
        length, error, unique = OUT.unpack_from(message)
        assert length == len(message)
        return length, error, unique, message[OUT.size:]

    def run(self, checks) -> None:
        async def main() -> None:
            self.release_read = trio.Event()
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self.loop.run)
                    await trio.testing.wait_all_tasks_blocked()
                    await checks()
                    self.kernel.shutdown(socket.SHUT_WR)  # the session ends: the loop reads 0 bytes
        try:
            trio.run(main)
        finally:
            self.ours.close()
            self.kernel.close()
            if self.pipes is not None:
                self.pipes.close()

    def assert_no_reply(self) -> None:
        """Nothing answered (yet): a WRITE left to its worker."""
        self.kernel.setblocking(False)
        with pytest.raises(BlockingIOError):
            self.kernel.recv(100)
        self.kernel.setblocking(True)


def test_a_read_is_handed_its_unique_handle_offset_and_size_and_nothing_goes_to_libfuse():
    harness = Harness()

    async def checks() -> None:
        harness.send(read_request(7, 42, 3 * MiB, 128 * KiB))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reads == [(7, 42, 3 * MiB, 128 * KiB)]
        harness.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 7, b"abc")

    harness.run(checks)
    assert harness.libfuse.processed == []
    assert harness.counts["read"] == 1
    assert harness.libfuse.exits == 1  # the session ended


def test_a_read_answered_at_once_needs_no_task_and_one_declined_becomes_a_task():
    """``read_now`` answers a READ whose bytes need no wait (the loop counts
    it and receives the next request); one it declines becomes a task."""
    taken: list[tuple[int, int, int, int]] = []

    def read_now(unique: int, fh: int, offset: int, size: int) -> bool:
        if offset >= MiB:
            return False  # not cached: a task waits for it
        taken.append((unique, fh, offset, size))
        os.write(harness.ours.fileno(), OUT.pack(OUT.size + 2, 0, unique) + b"ok")
        return True

    harness = Harness(read_now=read_now)

    async def checks() -> None:
        harness.send(read_request(7, 42, 0, 128 * KiB))
        harness.send(read_request(8, 42, 2 * MiB, 128 * KiB))
        await trio.testing.wait_all_tasks_blocked()
        assert taken == [(7, 42, 0, 128 * KiB)]
        assert harness.reads == [(8, 42, 2 * MiB, 128 * KiB)]  # the declined one only, as a task
        assert harness.reply() == (OUT.size + 2, 0, 7, b"ok")
        harness.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 8, b"abc")

    harness.run(checks)
    assert harness.counts["read"] == 2 and harness.counts["read_at_once"] == 1
    assert harness.libfuse.processed == []


def test_whole_writes_land_in_slots_of_an_arena_region_which_returns_when_none_holds_it():
    arena = Arena(16 * MiB)
    harness = Harness(arena=arena)
    pieces = [os.urandom(MAX_WRITE) for _ in range(request_loop.SLOTS + 1)]

    async def checks() -> None:
        assert arena.used == request_loop.SLOTS * MAX_WRITE  # the loop's region, before any request
        for index, piece in enumerate(pieces):
            harness.send(write_request(9 + index, 5, index * MAX_WRITE, piece))
            await trio.testing.wait_all_tasks_blocked()
            assert harness.reply() == (OUT.size + 8, 0, 9 + index, struct.pack("<II", MAX_WRITE, 0))
        offsets = [arena.offset_of(written) for _, _, written in harness.writes]
        assert offsets[1:request_loop.SLOTS] == [offsets[0] + n * MAX_WRITE for n in range(1, request_loop.SLOTS)]
        assert [bytes(written) for _, _, written in harness.writes] == pieces
        assert [(fh, offset) for fh, offset, _ in harness.writes] == [(5, n * MAX_WRITE) for n in range(len(pieces))]
        assert arena.used == 2 * request_loop.SLOTS * MAX_WRITE  # a second region once the first was used up
        del harness.writes[:request_loop.SLOTS]
        assert arena.used == request_loop.SLOTS * MAX_WRITE  # no WRITE holds the first: it is back

    harness.run(checks)
    assert harness.counts["write"] == len(pieces)


def test_a_half_write_keeps_its_region_and_a_small_one_is_copied_out():
    arena = Arena(8 * MiB)
    harness = Harness(arena=arena)
    half, small = os.urandom(MAX_WRITE // 2), os.urandom(4 * KiB)

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, half))
        harness.send(write_request(2, 5, len(half), small))
        await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(2)] == [1, 2]

    harness.run(checks)
    (_, _, first), (_, _, second) = harness.writes
    assert isinstance(first, memoryview) and bytes(first) == half and arena.offset_of(first) is not None
    assert isinstance(second, bytes) and second == small


def test_larger_writes_land_whole_and_smaller_ones_are_packed_into_the_same_region():
    """With requests of up to 2 MiB: a whole WRITE lands without a copy, 1 MiB
    WRITEs follow each other in one region, and one that outgrows a region's
    tail (its end read into the spill) is joined, the next going to a new region."""
    arena = Arena(64 * MiB)
    harness = Harness(arena=arena, max_write=2 * MiB)
    region = 4 * MiB  # four WRITEs of 1 MiB, two of the largest
    sizes = [2 * MiB, MiB, 2 * MiB, 600 * KiB + 100, 2 * MiB]
    pieces = [os.urandom(size) for size in sizes]

    async def checks() -> None:
        assert arena.used == region
        offset = 0
        for index, piece in enumerate(pieces):
            harness.send(write_request(30 + index, 6, offset, piece))
            offset += len(piece)
            await trio.testing.wait_all_tasks_blocked()
            assert harness.reply() == (OUT.size + 8, 0, 30 + index, struct.pack("<II", len(piece), 0))

    harness.run(checks)
    assert [bytes(written) for _, _, written in harness.writes] == pieces
    offsets = [arena.offset_of(written) for _, _, written in harness.writes]
    # 2 MiB, then 1 MiB right after it; the next 2 MiB finds 1 MiB left, runs
    # into the spill and is joined (a copy); 600 KiB and a bit start a new region, and
    # the last 2 MiB follows it at the next page.
    assert offsets[0] is not None and offsets[1] == offsets[0] + 2 * MiB
    assert offsets[2] is None and isinstance(harness.writes[2][2], bytes)
    assert offsets[3] is not None and offsets[3] not in range(offsets[0], offsets[0] + region)
    assert offsets[4] == offsets[3] + 151 * 4096  # 600 KiB and 100 bytes, rounded up to whole pages


def test_with_the_arena_full_only_a_whole_buffer_is_handed_over_and_a_part_is_copied():
    harness = Harness(arena=None, max_write=2 * MiB)
    whole, part = os.urandom(2 * MiB), os.urandom(MiB + 4096)

    async def checks() -> None:
        harness.send(write_request(5, 1, 0, whole))
        harness.send(write_request(6, 1, len(whole), part))
        await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(2)] == [5, 6]

    harness.run(checks)
    (_, _, first), (_, _, second) = harness.writes
    # bytes both: the write path keeps a bytes without copying it again
    assert isinstance(first, bytes) and first == whole
    assert isinstance(second, bytes) and second == part and len(second) == len(part)


def test_with_the_arena_full_a_write_gets_a_bytes_of_its_own():
    harness = Harness(arena=None)
    data = os.urandom(MAX_WRITE)

    async def checks() -> None:
        harness.send(write_request(3, 1, 0, data))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[1] == 0

    harness.run(checks)
    ((_, _, written),) = harness.writes
    assert isinstance(written, bytes) and written == data


def test_a_failed_write_is_answered_with_its_errno():
    harness = Harness(write_error=errno.ENOSPC)

    async def checks() -> None:
        harness.send(write_request(4, 1, 0, b"x" * 100))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size, -errno.ENOSPC, 4, b"")

    harness.run(checks)


def test_other_requests_go_to_libfuse_whole_and_their_coroutine_is_awaited(monkeypatch):
    awaited: list[bytes] = []

    def fuse_getattr_async(message: bytes):
        async def handler() -> None:
            await trio.lowlevel.checkpoint()
            awaited.append(message)
        return handler()

    monkeypatch.setattr(pyfuse3, "fuse_getattr_async", fuse_getattr_async)
    harness = Harness()
    harness.libfuse.handler = "fuse_getattr_async"
    getattr_request = request(FUSE_GETATTR, 11, struct.pack("<IIQ", 0, 0, 0))
    long_request = request(FUSE_GETATTR, 12, os.urandom(3000))

    async def checks() -> None:
        harness.send(getattr_request)
        harness.send(long_request)
        await trio.testing.wait_all_tasks_blocked()

    harness.run(checks)
    assert harness.libfuse.processed == [getattr_request, long_request]
    assert awaited == [getattr_request, long_request]
    assert pyfuse3.fuse_getattr_async is fuse_getattr_async  # given back when the loop ended
    assert harness.counts["libfuse"] == 2


def test_a_forget_whose_coroutine_pyfuse3_keeps_for_itself_is_awaited_here():
    """pyfuse3's FORGET handler calls ``operations.forget`` and keeps the
    coroutine for its own loop, not through a ``fuse_*_async`` function."""
    forgotten: list[list[tuple[int, int]]] = []

    class Operations:
        async def forget(self, inode_list):
            await trio.lowlevel.checkpoint()
            forgotten.append(inode_list)

    operations = Operations()
    harness = Harness(operations=operations)
    harness.libfuse.handler = "operations.forget"
    FUSE_FORGET = 2

    async def checks() -> None:
        assert operations.forget.__name__ == "capture"  # taken while the loop runs
        harness.send(request(FUSE_FORGET, 31, struct.pack("<Q", 1)))
        await trio.testing.wait_all_tasks_blocked()

    harness.run(checks)
    assert forgotten == [[(1, 1)]]
    assert "forget" not in vars(operations)  # the class's method again


def test_an_interrupt_of_a_request_answered_here_is_dropped_and_others_go_to_libfuse():
    harness = Harness()

    async def checks() -> None:
        harness.send(read_request(21, 1, 0, 4096))
        await trio.testing.wait_all_tasks_blocked()
        harness.send(request(FUSE_INTERRUPT, 22, struct.pack("<Q", 21)))
        harness.send(request(FUSE_INTERRUPT, 23, struct.pack("<Q", 999)))
        harness.send(write_request(24, 1, 0, b"z"))
        await trio.testing.wait_all_tasks_blocked()
        harness.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in range(2)) == [21, 24]
        assert not harness.loop.answering  # every reply written
        harness.send(request(FUSE_INTERRUPT, 25, struct.pack("<Q", 21)))  # late: 21 was answered
        await trio.testing.wait_all_tasks_blocked()

    harness.run(checks)
    assert [IN_HEADER.unpack_from(message)[2] for message in harness.libfuse.processed] == [23, 25]
    assert harness.counts["interrupt"] == 1


def test_requests_wait_for_none_other_a_slow_read_leaves_the_loop_receiving():
    harness = Harness()

    async def checks() -> None:
        for unique in range(30, 36):
            harness.send(read_request(unique, 1, unique * MiB, MiB))
        await trio.testing.wait_all_tasks_blocked()
        assert [read[0] for read in harness.reads] == list(range(30, 36))  # all received, none answered yet
        harness.send(write_request(40, 1, 0, b"y" * 10))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 40  # answered while the reads wait
        harness.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in range(6)) == list(range(30, 36))

    harness.run(checks)


def test_the_message_for_libfuse_is_the_request_even_past_a_whole_write():
    harness = Harness()
    try:
        head = bytes(range(HEAD))
        ctypes.memmove(harness.loop._head, head, HEAD)
        tail = os.urandom(MAX_WRITE + 1000)
        ctypes.memmove(harness.loop._iov[1].base, tail, MAX_WRITE)
        ctypes.memmove(harness.loop._spill, tail[MAX_WRITE:], 1000)
        assert harness.loop._message(harness.loop._head.raw, HEAD + len(tail)) == head + tail
        assert harness.loop._message(harness.loop._head.raw, 56) == head[:56]
    finally:
        harness.ours.close()
        harness.kernel.close()


def test_the_probe_finds_pyfuse3s_session_variable_in_its_symbol_table():
    assert request_loop._symbol_offset(pyfuse3.__file__, request_loop.SESSION_SYMBOL)
    assert request_loop._symbol_offset(pyfuse3.__file__, b"no_such_symbol_anywhere") is None
    assert request_loop._load_base(pyfuse3.__file__)


def test_the_probe_refuses_a_session_that_is_not_the_mounts(tmp_path):
    # Before pyfuse3.init, pyfuse3's session is NULL: nothing to serve.
    libfuse, session, why = request_loop.probe(device=12345)
    assert libfuse is None and session == 0 and why


@pytest.mark.parametrize("size", [1, 4 * KiB, MAX_WRITE - 1])
def test_write_replies_carry_the_size_written(size):
    harness = Harness(arena=Arena(4 * MiB))
    data = os.urandom(size)

    async def checks() -> None:
        harness.send(write_request(50, 2, 7, data))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 8, 0, 50, struct.pack("<II", size, 0))

    harness.run(checks)
    assert bytes(harness.writes[0][2]) == data


def test_libfuses_buffer_size_is_raised_only_where_it_is_found_exactly_once():
    session = (ctypes.c_size_t * 128)()
    session[3], session[113] = 7, request_loop.LIBFUSE_BUFSIZE  # at byte 904, as in libfuse 3.14
    address = ctypes.addressof(session)
    raise_to = request_loop.raise_request_size
    assert raise_to(address, MAX_WRITE, (3, 14)) == (MAX_WRITE, "")  # nothing to raise
    assert session[113] == request_loop.LIBFUSE_BUFSIZE
    for version in ((3, 17), (2, 9), None):  # another libfuse: left alone
        size, why = raise_to(address, 4 * MiB, version)
        assert size == MAX_WRITE and "libfuse" in why and session[113] == request_loop.LIBFUSE_BUFSIZE
    assert raise_to(address, 4 * MiB, (3, 14)) == (4 * MiB, "")
    assert session[113] == 4 * MiB + 4096 and session[3] == 7  # libfuse derives max_write and max_pages from it
    session[5] = session[113] = request_loop.LIBFUSE_BUFSIZE  # twice: not a layout to trust
    size, why = raise_to(address, 4 * MiB, (3, 14))
    assert size == MAX_WRITE and "2 times" in why and session[113] == request_loop.LIBFUSE_BUFSIZE
    session[5] = session[113] = 0
    assert raise_to(address, 4 * MiB, (3, 14))[0] == MAX_WRITE


def test_the_libfuse_here_says_its_version():
    lib = ctypes.CDLL(ctypes.util.find_library("fuse3") or "libfuse3.so.3")
    version = request_loop.libfuse_version(lib)
    assert version is not None and version[0] == 3


def test_the_kernel_wide_request_limit_is_raised_when_lower_and_never_lowered(tmp_path):
    from rapidmount import daemon

    knob = tmp_path / "max_pages_limit"
    knob.write_text("256\n")
    assert daemon.kernel_request_size(4 * MiB, str(knob)) == 4 * MiB
    assert knob.read_text().strip() == "1024"
    knob.write_text("4096\n")
    assert daemon.kernel_request_size(4 * MiB, str(knob)) == 4 * MiB
    assert knob.read_text().strip() == "4096"  # higher already: left alone
    knob.write_text("512\n")
    knob.chmod(0o444)
    if os.geteuid() != 0:  # root writes through the mode bits
        assert daemon.kernel_request_size(4 * MiB, str(knob)) == 2 * MiB  # within what it allows
    assert daemon.kernel_request_size(4 * MiB, str(tmp_path / "absent")) == MAX_WRITE  # an older kernel


# -- WRITEs spliced into pipes ----------------------------------------------------------------------

HALF = MAX_WRITE // 2  # the smallest WRITE kept where the kernel put it; its pipe fits the default pipe-max-size


@pytest.mark.parametrize("asked_first", [False, True], ids=["no-write-now", "write-now-declines"])
def test_while_large_writes_come_each_next_request_is_spliced_and_a_write_s_bytes_wait_in_its_pipe(asked_first):
    """A WRITE that ``write_now`` does not take (or without one) becomes a task, as always."""
    arena = Arena(16 * MiB)
    pipes = WritePipes(2, MiB)
    write_now = _WriteNow(pipes, takes=False) if asked_first else None
    harness = Harness(arena=arena, pipes=pipes, write_now=write_now)
    pieces = [os.urandom(HALF) for _ in range(3)]

    async def checks() -> None:
        for index, piece in enumerate(pieces):
            harness.send(write_request(10 + index, 5, index * HALF, piece))
            await trio.testing.wait_all_tasks_blocked()
            assert harness.reply() == (OUT.size + 8, 0, 10 + index, struct.pack("<II", HALF, 0))

    harness.run(checks)
    first, *spliced = [data for _, _, data in harness.writes]
    assert isinstance(first, memoryview)  # read from the device: nothing said large WRITEs come yet
    assert all(isinstance(data, PipedWrite) for data in spliced)
    assert [bytes(first), *map(bytes, harness.piped_views)] == pieces
    # Each next to the one before in the region, as if read there.
    offsets = [arena.offset_of(first), *map(arena.offset_of, harness.piped_views)]
    assert offsets == [offsets[0] + n * HALF for n in range(3)]
    assert [data.arena_offset for data in spliced] == offsets[1:]
    assert harness.counts["write"] == 3 and harness.counts["write_at_once"] == harness.counts["write_by_worker"] == 0
    if write_now is not None:
        assert len(write_now.turns_seen) == 3  # asked first, each


def test_a_write_handed_to_a_worker_is_answered_by_it_not_by_the_loop():
    arena = Arena(16 * MiB)
    pipes = WritePipes(2, MiB)
    harness = Harness(arena=arena, pipes=pipes)
    harness.piped = "hand"
    pieces = [os.urandom(HALF) for _ in range(2)]

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, pieces[0]))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 1
        harness.send(write_request(2, 5, HALF, pieces[1]))
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()  # no answer from the loop
        (_, _, handed) = harness.writes[1]
        assert handed.state == HANDED
        # The worker's part: the bytes into their region (one read), then its answer.
        assert os.readv(handed.pipe.read_fd, [handed.view]) == HALF
        assert bytes(handed.view) == pieces[1]

    harness.run(checks)
    assert harness.counts["write_by_worker"] == 1


def test_a_spliced_request_that_is_not_a_large_write_is_read_whole_and_splicing_stops():
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    harness = Harness(arena=arena, pipes=pipes)
    harness.libfuse.handler = None
    big, small = os.urandom(HALF), os.urandom(4 * KiB)
    getattr_request = request(FUSE_GETATTR, 3, bytes(16))

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, big))
        await trio.testing.wait_all_tasks_blocked()
        harness.send(getattr_request)  # spliced: read whole from the pipe, to libfuse
        await trio.testing.wait_all_tasks_blocked()
        harness.send(write_request(2, 5, HALF, small))  # read from the device again
        await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(2)] == [1, 2]
        assert pipes.take() is not None  # the pipe is empty again

    harness.run(checks)
    assert harness.libfuse.processed == [getattr_request]
    assert [bytes(data) for _, _, data in harness.writes] == [big, small]


def test_a_spliced_write_that_fails_is_answered_with_its_errno_and_its_pipe_is_emptied():
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    harness = Harness(arena=arena, pipes=pipes)

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 1
        harness.write_error = errno.ENOSPC
        harness.send(write_request(2, 5, HALF, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, -errno.ENOSPC, 2)
        assert pipes.take() is not None

    harness.run(checks)


def test_a_write_that_fails_after_its_worker_may_have_answered_it_gets_no_second_answer():
    """Handed over, its worker answers it; a failure after that sticks to the
    file, and the loop does not answer the WRITE again."""
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    harness = Harness(arena=arena, pipes=pipes)
    harness.piped = "hand, then fail"

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 1
        harness.send(write_request(2, 5, HALF, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()

    harness.run(checks)


class _WriteNow:
    """The mount's ``write_now``: takes every WRITE (handing piped ones to a
    "worker") or none, and notes how often another task ran before each."""

    def __init__(self, pipes: WritePipes | None, takes: bool = True, hands: bool = True) -> None:
        self.pipes, self.takes, self.hands = pipes, takes, hands
        self.taken: list[tuple[int, int, object]] = []
        self.views: list[memoryview] = []  # piped WRITEs' regions (let go of once their pipe is seen empty)
        self.turns_seen: list[int] = []
        self.turns = 0  # counted by a task of the test's own

    def __call__(self, fh: int, offset: int, data) -> int | None:
        self.turns_seen.append(self.turns)
        if not self.takes:
            return None
        if isinstance(data, PipedWrite):
            assert self.pipes is not None and data.view is not None
            self.views.append(data.view)
            if self.hands:
                self.pipes.handed(data, "worker")
        self.taken.append((fh, offset, data))
        return len(data)

    async def count_turns(self) -> None:
        for _ in range(1000):  # long past the WRITEs (each turn of this task is a turn of the loop's)
            self.turns += 1
            await trio.lowlevel.checkpoint()


def test_a_write_taken_at_once_is_answered_by_the_loop_or_its_worker_and_needs_no_task():
    arena = Arena(16 * MiB)
    pipes = WritePipes(2, MiB)
    write_now = _WriteNow(pipes)
    harness = Harness(arena=arena, pipes=pipes, write_now=write_now)
    pieces = [os.urandom(HALF) for _ in range(3)]

    async def checks() -> None:
        # Read from the device (nothing said large WRITEs come yet): taken, answered here.
        harness.send(write_request(1, 5, 0, pieces[0]))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 8, 0, 1, struct.pack("<II", HALF, 0))
        # Spliced: handed, answered by its worker (after it read the bytes), not here.
        for index in (1, 2):
            harness.send(write_request(1 + index, 5, index * HALF, pieces[index]))
            await trio.testing.wait_all_tasks_blocked()
            (_, _, handed) = write_now.taken[index]
            assert handed.state == HANDED
            assert os.readv(handed.pipe.read_fd, [handed.view]) == HALF
        harness.assert_no_reply()

    harness.run(checks)
    assert harness.writes == []  # no WRITE became a task
    assert [(fh, offset) for fh, offset, _ in write_now.taken] == [(5, 0), (5, HALF), (5, 2 * HALF)]
    assert bytes(write_now.taken[0][2]) == pieces[0]
    assert [bytes(view) for view in write_now.views] == pieces[1:]
    assert harness.counts["write"] == harness.counts["write_at_once"] == 3
    assert harness.counts["write_by_worker"] == 2


def test_a_piped_write_taken_at_once_but_not_handed_is_landed_here_and_answered():
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    write_now = _WriteNow(pipes, hands=False)
    harness = Harness(arena=arena, pipes=pipes, write_now=write_now)
    pieces = [os.urandom(HALF) for _ in range(2)]

    async def checks() -> None:
        for index, piece in enumerate(pieces):
            harness.send(write_request(1 + index, 5, index * HALF, piece))
            await trio.testing.wait_all_tasks_blocked()
            assert harness.reply() == (OUT.size + 8, 0, 1 + index, struct.pack("<II", HALF, 0))
        assert pipes.take() is not None  # emptied

    harness.run(checks)
    assert [bytes(view) for view in write_now.views] == pieces[1:]
    assert harness.counts["write_at_once"] == 2 and harness.counts["write_by_worker"] == 0


def test_writes_taken_at_once_in_a_row_let_other_tasks_run_between(monkeypatch):
    """A queue of WRITEs all taken at once would keep every other task of the
    mount waiting: the loop lets them run after TURN_AFTER in a row."""
    monkeypatch.setattr(request_loop, "TURN_AFTER", 2)  # a queue that fits the socket's buffer
    arena = Arena(16 * MiB)
    write_now = _WriteNow(None)
    harness = Harness(arena=arena, write_now=write_now)
    count = 2 * request_loop.TURN_AFTER + 1

    async def checks() -> None:
        async with trio.open_nursery() as nursery:
            for index in range(count):  # all queued before the loop reads one
                harness.send(write_request(1 + index, 5, index * HALF, bytes(HALF)))
            nursery.start_soon(write_now.count_turns)
            await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(count)] == list(range(1, count + 1))

    harness.run(checks)
    seen = write_now.turns_seen
    assert len(seen) == count
    # The other task ran after every TURN_AFTER WRITEs, and not between them.
    assert len(set(seen)) >= count // request_loop.TURN_AFTER
    assert all(seen[n] == seen[n - 1] for n in range(1, count) if n % request_loop.TURN_AFTER)


def test_a_pipe_kept_for_the_next_request_is_not_used_once_replaced():
    """After EAGAIN the loop keeps the empty pipe it took for the next try;
    a pipe replaced meanwhile (its worker lost) is closed: the loop takes
    another."""
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    harness = Harness(arena=arena, pipes=pipes)
    pieces = [os.urandom(HALF) for _ in range(2)]

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, pieces[0]))
        await trio.testing.wait_all_tasks_blocked()  # answered; the loop waits, its pipe kept
        assert harness.reply()[2] == 1
        old = pipes.pipes[0]
        pipes._replace(old)
        assert pipes.pipes[0] is not old
        harness.send(write_request(2, 5, HALF, pieces[1]))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 2
        (_, _, spliced) = harness.writes[1]
        assert isinstance(spliced, PipedWrite) and spliced.pipe is pipes.pipes[0]

    harness.run(checks)
    assert bytes(harness.piped_views[0]) == pieces[1]
