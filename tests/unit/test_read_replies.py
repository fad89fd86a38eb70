"""READ replies written in place of pyfuse3's: the layout probe, the offset
check, who answers, and that libfuse's request is ended exactly once.

The request container is a real ``pyfuse3._Container`` with its fields set
at the offsets the module reads; libfuse is a recorder; the device is a pipe,
so the reply's bytes can be read back.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import fcntl
import os
import struct

import pyfuse3
import pytest
import trio

from rapidmount import read_replies
from rapidmount.dataplane.arena import Arena
from rapidmount.dataplane.pagestore import reply_header
from rapidmount.views import pieces, slices
from rapidmount.read_replies import CHECKED_READS, WORKER_REPLY_MIN, ReadReplies

KiB, MiB = 1 << 10, 1 << 20


async def _empty(fh, off, size):
    return b""


class Libfuse:
    """Records how each request ended."""

    def __init__(self) -> None:
        self.ended: list[tuple] = []

    def reply_none(self, req: int) -> None:
        self.ended.append(("none", req))

    def reply_err(self, req: int, code: int) -> int:
        self.ended.append(("err", req, code))
        return 0

    def reply_buf(self, req: int, data: bytes, length: int) -> int:
        self.ended.append(("buf", req, bytes(data[:length])))
        return 0


class Request:
    """A libfuse request (its session, then ``unique``) and pyfuse3's container of it."""

    def __init__(self, unique: int, fh: int, off: int, size: int) -> None:
        self.memory = (ctypes.c_uint64 * 8)(0xdead, unique)
        self.req = ctypes.addressof(self.memory)
        self.container = pyfuse3._Container()
        base = id(self.container)
        ctypes.c_void_p.from_address(base + 80).value = self.req
        ctypes.c_int64.from_address(base + 96).value = off
        ctypes.c_size_t.from_address(base + 104).value = size
        ctypes.c_uint64.from_address(base + 256).value = fh


class Harness:
    def __init__(self, read, worker_reply=None, writev=os.writev) -> None:
        self.libfuse = Libfuse()
        self.reader, self.device = os.pipe()
        os.set_blocking(self.reader, False)
        fcntl.fcntl(self.device, fcntl.F_SETPIPE_SZ, 1 * MiB)  # a whole reply fits
        self.replies = ReadReplies(self.libfuse, read, self.device, worker_reply, collections.Counter(),
                                   writev=writev)
        self.pyfuse3_answered: list[tuple[int, int, int]] = []

        async def pyfuse3_read(c):  # what pyfuse3's coroutine does: take the values, call the operation
            base = id(c)
            values = (ctypes.c_uint64.from_address(base + 256).value, ctypes.c_int64.from_address(base + 96).value,
                      ctypes.c_size_t.from_address(base + 104).value)
            self.pyfuse3_answered.append(values)
            await self.replies.checked_read(*values)

        self.pyfuse3_read = pyfuse3_read

    def install(self) -> None:
        self.replies.install()
        self.replies._pyfuse3_read = self.pyfuse3_read  # in place of pyfuse3's, which needs a session

    def trust(self) -> None:
        self.install()

        async def checks():
            for n in range(CHECKED_READS):
                await self.replies._read_request(Request(n + 1, 1, 0, 10).container)
        trio.run(checks)
        assert self.replies._trusted
        self.libfuse.ended.clear()
        self.replies.counts.clear()

    def reply_written(self) -> bytes:
        try:
            return os.read(self.reader, 4 * MiB)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.reader)
        os.close(self.device)


@pytest.fixture(autouse=True)
def installed():
    """Put pyfuse3's own coroutine back whatever a test did."""
    original = pyfuse3.fuse_read_async
    yield
    pyfuse3.fuse_read_async = original


def test_the_layouts_of_this_pyfuse3_and_libfuse_are_the_ones_expected():
    libfuse, refusal = read_replies.probe()
    assert libfuse is not None, refusal
    assert pyfuse3._Container.__basicsize__ == 264


def test_a_reply_header_is_len_error_unique():
    assert reply_header(0x1234, 4096) == struct.pack("<IiQ", 16 + 4096, 0, 0x1234)


def test_the_first_reads_are_answered_by_pyfuse3_while_the_offsets_are_checked():
    async def read(fh, off, size, gather=False, reply=None):
        return b"x" * size

    harness = Harness(read)
    harness.install()
    assert harness.replies.installed

    last = Request(99, 3, 0, 100)

    async def main():
        for n in range(CHECKED_READS):
            await harness.replies._read_request(Request(10 + n, 3, n * 4096, 4096).container)
        await harness.replies._read_request(last.container)

    trio.run(main)
    assert harness.pyfuse3_answered == [(3, n * 4096, 4096) for n in range(CHECKED_READS)]
    assert harness.replies.counts == {"libfuse": CHECKED_READS, "fuse": 1}
    assert harness.reply_written() == reply_header(99, 100) + b"x" * 100
    assert harness.libfuse.ended == [("none", last.req)]  # pyfuse3's own answers end theirs
    harness.close()


def test_an_offset_that_differs_puts_pyfuse3s_coroutine_back_for_good():
    original = pyfuse3.fuse_read_async

    async def read(fh, off, size, gather=False, reply=None):
        return b""

    harness = Harness(read)
    harness.install()

    async def pyfuse3_read(c):  # pyfuse3 saw other values than the offsets gave
        await harness.replies.checked_read(1, 2, 3)

    harness.replies._pyfuse3_read = pyfuse3_read
    trio.run(harness.replies._read_request, Request(5, 7, 0, 4096).container)
    assert not harness.replies.installed
    assert pyfuse3.fuse_read_async is pyfuse3_read  # what install() found there, put back
    assert original is not pyfuse3_read
    assert not harness.replies._trusted
    harness.close()


def test_a_large_arena_read_is_answered_by_a_worker_and_the_request_only_freed():
    arena = Arena(8 * MiB)
    offset, view = arena.allocate(1 * MiB)
    view[:] = os.urandom(1 * MiB)
    asked = []

    async def read(fh, off, size, gather=False, reply=None):
        return view

    async def worker_reply(unique, data):
        asked.append((unique, arena.offset_of(data), len(data)))
        return True

    harness = Harness(read, worker_reply)
    harness.trust()
    request = Request(77, 1, 0, MiB)
    trio.run(harness.replies._read_request, request.container)
    assert asked == [(77, offset, MiB)]
    assert harness.libfuse.ended == [("none", request.req)]
    assert harness.replies.counts == {"worker": 1}
    assert harness.reply_written() == b""  # nothing written by this process
    harness.close()


def test_a_small_read_and_a_read_no_worker_takes_are_written_here():
    big = os.urandom(WORKER_REPLY_MIN)

    async def read(fh, off, size, gather=False, reply=None):
        return big[:size]

    async def worker_reply(unique, data):
        return False  # no worker holds /dev/fuse yet, or the bytes are not in the arena

    harness = Harness(read, worker_reply)
    harness.trust()
    small, large = Request(1, 1, 0, 4 * KiB), Request(2, 1, 0, WORKER_REPLY_MIN)
    trio.run(harness.replies._read_request, small.container)
    assert harness.reply_written() == reply_header(1, 4 * KiB) + big[:4 * KiB]
    trio.run(harness.replies._read_request, large.container)
    assert harness.reply_written() == reply_header(2, WORKER_REPLY_MIN) + big
    assert harness.libfuse.ended == [("none", small.req), ("none", large.req)]
    assert harness.replies.counts == {"fuse": 2}
    harness.close()


def test_a_reply_the_kernel_refuses_is_made_again_by_libfuse():
    def refused(fd, buffers):
        raise OSError(errno.ENOENT, "interrupted")

    async def read(fh, off, size, gather=False, reply=None):
        return memoryview(b"abc")

    harness = Harness(read, writev=refused)
    harness.trust()
    request = Request(3, 1, 0, 3)
    trio.run(harness.replies._read_request, request.container)
    assert harness.libfuse.ended == [("buf", request.req, b"abc")]
    assert harness.replies.counts == {"libfuse": 1}
    harness.close()


def test_an_error_is_answered_with_its_errno_and_a_cancelled_read_with_eio():
    async def missing(fh, off, size):
        raise pyfuse3.FUSEError(errno.EBADF)

    harness = Harness(_empty)
    harness.trust()
    harness.replies._read = missing
    request = Request(4, 1, 0, 10)
    trio.run(harness.replies._read_request, request.container)
    assert harness.libfuse.ended == [("err", request.req, errno.EBADF)]

    async def cancelled(fh, off, size):
        await trio.sleep_forever()

    harness.replies._read = cancelled

    async def main():
        with trio.move_on_after(0.01):
            await harness.replies._read_request(request.container)

    trio.run(main)
    assert harness.libfuse.ended[-1] == ("err", request.req, errno.EIO)
    harness.close()


def test_a_worker_reply_cut_short_is_answered_by_libfuse_and_the_cancellation_goes_on():
    arena = Arena(4 * MiB)
    _, view = arena.allocate(MiB)

    async def read(fh, off, size, gather=False, reply=None):
        return view

    async def worker_reply(unique, data):
        await trio.sleep_forever()

    harness = Harness(read, worker_reply)
    harness.trust()
    request = Request(8, 1, 0, MiB)

    async def main():
        with trio.move_on_after(0.01) as scope:
            await harness.replies._read_request(request.container)
        assert scope.cancelled_caught

    trio.run(main)
    assert [end[0] for end in harness.libfuse.ended] == ["buf"]
    harness.close()


def test_arena_offsets_of_views_and_of_what_is_not_in_it():
    arena = Arena(4 * MiB)
    offset, view = arena.allocate(256 * KiB)
    assert arena.offset_of(view) == offset
    assert arena.offset_of(view[4096:8192]) == offset + 4096
    assert arena.offset_of(bytes(view)) is None
    assert arena.offset_of(memoryview(bytearray(10))) is None
    assert arena.offset_of(memoryview(b"read-only")) is None
    assert arena.offset_of(view[:0]) is None


# -- READs received by the mount's own request loop: no libfuse request ------------------------

class LoopHarness:
    """ReadReplies as the request loop uses it: ``answer(unique, fh, off, size)``,
    workers told without waiting; the device is a pipe."""

    def __init__(self, read, refuse: bool = False, sent: bool = True, read_now=None) -> None:
        self.reader, self.device = os.pipe()
        os.set_blocking(self.reader, False)
        fcntl.fcntl(self.device, fcntl.F_SETPIPE_SZ, 1 * MiB)
        self.asked: list[tuple[int, int]] = []
        self.answers: list = []
        self.refuse, self.sent = refuse, sent
        self.replies = ReadReplies(None, read, self.device, None, collections.Counter(),
                                   worker_reply_soon=self._soon, worker_reply_now=self._now, read_now=read_now)

    async def _soon(self, unique, data, on_answer) -> bool:
        return self._now(unique, data, on_answer)

    def _now(self, unique, data, on_answer) -> bool:
        if not self.sent:
            return False
        self.asked.append((unique, len(data)))
        self.answers.append(lambda: on_answer(not self.refuse))
        return True

    def written(self) -> bytes:
        try:
            return os.read(self.reader, 2 * MiB)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        os.close(self.reader)
        os.close(self.device)


def test_a_loop_read_goes_to_a_worker_without_waiting_and_its_answer_comes_later():
    data = memoryview(os.urandom(WORKER_REPLY_MIN))

    async def read(fh, off, size, gather=False, reply=None):
        return data

    harness = LoopHarness(read)
    trio.run(harness.replies.answer, 5, 1, 0, WORKER_REPLY_MIN)
    assert harness.asked == [(5, WORKER_REPLY_MIN)] and harness.written() == b""
    assert not harness.replies.counts  # not answered yet
    assert harness.replies.answering == {5}  # an INTERRUPT of it is the loop's to drop
    harness.answers.pop()()
    assert harness.replies.counts == {"worker": 1} and harness.written() == b""
    assert not harness.replies.answering
    harness.close()


def test_a_loop_read_the_worker_could_not_answer_is_written_here_when_its_answer_comes():
    data = os.urandom(WORKER_REPLY_MIN)

    async def read(fh, off, size, gather=False, reply=None):
        return data

    harness = LoopHarness(read, refuse=True)
    trio.run(harness.replies.answer, 6, 1, 0, WORKER_REPLY_MIN)
    assert harness.written() == b""
    harness.answers.pop()()  # refused, or the worker died first
    assert harness.written() == reply_header(6, WORKER_REPLY_MIN) + data
    assert harness.replies.counts == {"fuse": 1}
    harness.close()


def test_a_loop_read_with_no_worker_or_a_small_one_is_written_here_at_once():
    data = os.urandom(WORKER_REPLY_MIN)

    async def read(fh, off, size, gather=False, reply=None):
        return data[:size]

    harness = LoopHarness(read, sent=False)
    trio.run(harness.replies.answer, 7, 1, 0, WORKER_REPLY_MIN)
    assert harness.written() == reply_header(7, WORKER_REPLY_MIN) + data
    assert not harness.replies.answering
    small = LoopHarness(read)
    trio.run(small.replies.answer, 8, 1, 0, 4 * KiB)
    assert small.asked == [] and small.written() == reply_header(8, 4 * KiB) + data[:4 * KiB]
    harness.close()
    small.close()


def test_a_loop_read_that_fails_is_answered_with_its_errno_and_one_cut_short_with_eio():
    async def failing(fh, off, size, gather=False, reply=None):
        raise pyfuse3.FUSEError(errno.ESTALE)

    harness = LoopHarness(failing)
    trio.run(harness.replies.answer, 9, 1, 0, 4096)
    assert harness.written() == struct.pack("<IiQ", 16, -errno.ESTALE, 9)

    async def cut_short(fh, off, size, gather=False, reply=None):
        raise KeyboardInterrupt  # anything else that ends the task

    harness.replies._read = cut_short
    with pytest.raises(KeyboardInterrupt):
        trio.run(harness.replies.answer, 10, 1, 0, 4096)
    assert harness.written() == struct.pack("<IiQ", 16, -errno.EIO, 10)
    harness.close()


def test_a_loop_read_whose_bytes_need_no_wait_is_answered_at_once_by_a_worker_or_here():
    """``answer_now``: bytes ``read_now`` has at once go to a worker (its call
    sent now) or, small or with no worker able to take the call now, are
    written here; a read ``read_now`` declines is left for a task."""
    data = memoryview(os.urandom(WORKER_REPLY_MIN))

    async def read(fh, off, size, gather=False, reply=None):
        raise AssertionError("the task's read: not for a read answered at once")

    def read_now(fh, off, size):
        return None if off else data[:size]

    harness = LoopHarness(read, read_now=read_now)
    assert harness.replies.answer_now(5, 1, 0, WORKER_REPLY_MIN)
    assert harness.asked == [(5, WORKER_REPLY_MIN)] and harness.written() == b""
    assert harness.replies.answering == {5}  # until the worker's answer
    harness.answers.pop()()
    assert harness.replies.counts == {"worker": 1} and not harness.replies.answering
    assert harness.replies.answer_now(6, 1, 0, 4 * KiB)  # small: written here
    assert harness.written() == reply_header(6, 4 * KiB) + data[:4 * KiB]
    assert not harness.replies.answer_now(7, 1, MiB, 4 * KiB)  # declined: nothing written
    assert harness.written() == b"" and not harness.replies.answering
    harness.sent = False  # no worker can take the call now: written here
    assert harness.replies.answer_now(8, 1, 0, WORKER_REPLY_MIN)
    assert harness.written() == reply_header(8, WORKER_REPLY_MIN) + data
    assert not harness.replies.answering
    harness.close()


def test_a_loop_read_over_several_blocks_is_gathered_from_their_views_in_one_reply():
    blocks = [os.urandom(64 * KiB) for _ in range(3)]
    asked: list[bool] = []

    async def read(fh, off, size, gather=False, reply=None):
        asked.append(gather)
        return slices(blocks, 1000, 1000 + size)

    for sent in (True, False):
        harness = LoopHarness(read, sent=sent)
        trio.run(harness.replies.answer, 11, 1, 1000, WORKER_REPLY_MIN)
        want = b"".join(blocks)[1000:1000 + WORKER_REPLY_MIN]
        if sent:  # a worker is handed the whole length, its views in order
            assert harness.asked == [(11, WORKER_REPLY_MIN)] and harness.written() == b""
        else:  # written here: one writev of the header and each block's view
            assert harness.written() == reply_header(11, WORKER_REPLY_MIN) + want
        harness.close()
    assert asked == [True, True]


def test_slices_are_views_of_the_parts_they_span():
    parts = [bytearray(b"abcd"), bytearray(b"efgh"), bytearray(b"ij")]
    gathered = slices(parts, 3, 9)
    assert bytes(gathered) == b"defghi" and len(gathered) == 6
    assert [bytes(part) for part in gathered.parts] == [b"d", b"efgh", b"i"]
    parts[1][0:1] = b"E"  # views, not copies
    assert bytes(gathered) == b"dEfghi"
    assert slices(parts, 4, 8).parts == (memoryview(parts[1]),)
    assert pieces(gathered) == gathered.parts and pieces(b"x") == (b"x",)


def test_a_loop_read_the_storage_answered_where_its_bytes_landed_is_not_written_again():
    """A read straight from a worker's stream: the worker wrote the reply as
    the bytes landed (``reply.sent``), so the loop writes nothing and asks no
    worker; unsent, the loop answers as for any read. Worker replies off: no
    ``reply`` is offered at all."""
    data = os.urandom(4 * KiB)
    offered = []

    async def read(fh, off, size, gather=False, reply=None):
        offered.append(reply)
        if reply is not None and off == 0:
            reply.sent = True
        return data

    harness = LoopHarness(read)
    trio.run(harness.replies.answer, 11, 1, 0, 4 * KiB)
    assert offered[-1].unique == 11 and offered[-1].sent
    assert harness.written() == b"" and harness.asked == []
    assert harness.replies.counts == {"landed": 1} and not harness.replies.answering
    trio.run(harness.replies.answer, 12, 1, 4 * KiB, 4 * KiB)
    assert not offered[-1].sent and harness.written() == reply_header(12, 4 * KiB) + data
    harness.close()

    reader, device = os.pipe()
    off = ReadReplies(None, read, device, None, collections.Counter())
    trio.run(off.answer, 13, 1, 0, 4 * KiB)
    assert offered[-1] is None and os.read(reader, MiB) == reply_header(13, 4 * KiB) + data
    os.close(reader)
    os.close(device)
