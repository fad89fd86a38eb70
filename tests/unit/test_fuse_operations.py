"""The opcode table behind FUSE (:class:`~rapidmount.fuse.operations.Operations`),
against a file system of the test's own: READ replies (who writes them, where
the bytes are, errors and cancellation) and what :meth:`Operations.serve`
answers for other requests.

The device is one end of a SOCK_SEQPACKET pair (each reply one message, as
``/dev/fuse`` takes them); the test reads the replies at the other end.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import stat
import struct
from types import SimpleNamespace

import pytest
import trio
import trio.testing

from rapidmount.core.attributes import Attributes
from rapidmount.core.errors import FSError, NoSuchName
from rapidmount.shared.arena import Arena
from rapidmount.shared import fuse_abi as abi, fuse_codec as codec
from rapidmount.fuse import channel as fuse_channel
from rapidmount.fuse.channel import Channel
from rapidmount.fuse.loop import RequestLoop
from rapidmount.fuse.operations import WORKER_REPLY_MIN, Operations
from rapidmount.shared.views import pieces, slices

KiB, MiB = 1 << 10, 1 << 20
OUT = abi.OUT_HEADER
Op = abi.Opcode


class Device:
    """The kernel's end of the mount's descriptor: the replies written to ``channel``."""

    def __init__(self) -> None:
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (self.ours, self.kernel):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
        self.kernel.setblocking(False)
        self.channel = Channel(self.ours.fileno())

    def written(self) -> bytes:
        """The next reply, or b"" when none was written."""
        try:
            return self.kernel.recv(4 * MiB)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        self.ours.close()
        self.kernel.close()


def error(unique: int, code: int) -> bytes:
    return OUT.pack(OUT.size, -code, unique)


def data_reply(unique: int, data: bytes) -> bytes:
    return OUT.pack(OUT.size + len(data), 0, unique) + data


# -- READ -------------------------------------------------------------------------------------------

class Reads:
    """Operations with worker replies, as the mount makes them: workers are
    told without waiting, and answer later (``answers``); the file system's
    ``read`` and ``read_now`` are the test's."""

    def __init__(self, read, refuse: bool = False, sent: bool = True, read_now=None, workers: bool = True) -> None:
        self.device = Device()
        self.asked: list[tuple[int, int]] = []
        self.handed: list[object] = []
        self.answers: list = []
        self.refuse, self.sent = refuse, sent
        fs = SimpleNamespace(read=read, read_now=read_now or (lambda fh, off, size: None))
        self.operations = Operations(fs, worker_reply_soon=self._soon if workers else None,  # type: ignore[arg-type]
                                     worker_reply_now=self._now if workers else None)

    async def _soon(self, unique, data, on_answer) -> bool:
        await trio.lowlevel.checkpoint()
        return self._now(unique, data, on_answer)

    def _now(self, unique, data, on_answer) -> bool:
        if not self.sent:
            return False
        self.asked.append((unique, len(data)))
        self.handed.append(data)
        self.answers.append(lambda: on_answer(not self.refuse))
        return True

    def read(self, unique: int, fh: int, off: int, size: int) -> None:
        trio.run(self.operations.read, self.device.channel, unique, fh, off, size)

    @property
    def replies(self) -> collections.Counter[str]:
        return self.operations.stats.read_replies

    def recorded(self, operation: str = "read") -> tuple[int, int]:
        """(count, errors) the stats hold for ``operation``."""
        count, errors, _, _ = self.operations.stats.snapshot().get(operation, (0, 0, 0.0, []))
        return count, errors

    def close(self) -> None:
        self.device.close()


def test_a_reply_header_is_len_error_unique():
    assert codec.reply_header(0x1234, 4096) == struct.pack("<IiQ", 16 + 4096, 0, 0x1234)


def test_a_loop_read_goes_to_a_worker_without_waiting_and_its_answer_comes_later():
    data = memoryview(os.urandom(WORKER_REPLY_MIN))

    async def read(fh, off, size, gather=False, reply=None):
        return data

    harness = Reads(read)
    harness.read(5, 1, 0, WORKER_REPLY_MIN)
    assert harness.asked == [(5, WORKER_REPLY_MIN)] and harness.handed == [data]
    assert harness.device.written() == b""
    assert not harness.replies  # not answered yet
    harness.answers.pop()()
    assert harness.replies == {"worker": 1} and harness.device.written() == b""
    assert harness.recorded() == (1, 0)
    harness.close()


def test_a_loop_read_the_worker_could_not_answer_is_written_here_when_its_answer_comes():
    data = os.urandom(WORKER_REPLY_MIN)

    async def read(fh, off, size, gather=False, reply=None):
        return data

    harness = Reads(read, refuse=True)
    harness.read(6, 1, 0, WORKER_REPLY_MIN)
    assert harness.device.written() == b""
    harness.answers.pop()()  # refused, or the worker died first
    assert harness.device.written() == data_reply(6, data)
    assert harness.replies == {"fuse": 1}
    harness.close()


def test_a_loop_read_with_no_worker_or_a_small_one_is_written_here_at_once():
    data = os.urandom(WORKER_REPLY_MIN)

    async def read(fh, off, size, gather=False, reply=None):
        return data[:size]

    harness = Reads(read, sent=False)
    harness.read(7, 1, 0, WORKER_REPLY_MIN)
    assert harness.device.written() == data_reply(7, data)
    assert harness.replies == {"fuse": 1}
    small = Reads(read)
    small.read(8, 1, 0, WORKER_REPLY_MIN - 1)  # just below the size a worker writes
    assert small.asked == [] and small.device.written() == data_reply(8, data[:WORKER_REPLY_MIN - 1])
    assert small.replies == {"fuse": 1}
    harness.close()
    small.close()


def test_a_loop_read_that_fails_is_answered_with_its_errno_and_one_cut_short_with_eio(caplog):
    async def failing(fh, off, size, gather=False, reply=None):
        raise FSError(errno.ESTALE)

    harness = Reads(failing)
    harness.read(9, 1, 0, 4096)
    assert harness.device.written() == error(9, errno.ESTALE)
    assert harness.recorded() == (1, 1)

    async def broken(fh, off, size, gather=False, reply=None):
        raise RuntimeError("a bug")

    harness.operations.fs.read = broken
    with caplog.at_level(logging.ERROR, "rapidmount.fuse"):
        harness.read(10, 1, 0, 4096)  # logged and answered, not raised
    assert harness.device.written() == error(10, errno.EIO)
    assert "a bug" in caplog.text

    async def cut_short(fh, off, size, gather=False, reply=None):
        raise KeyboardInterrupt  # anything else that ends the task

    harness.operations.fs.read = cut_short
    with pytest.raises(KeyboardInterrupt):
        harness.read(11, 1, 0, 4096)
    assert harness.device.written() == error(11, errno.EIO)
    assert harness.device.written() == b""  # one answer each
    assert harness.recorded() == (3, 3) and not harness.replies
    harness.close()


def test_a_cancelled_read_is_answered_eio_and_the_cancellation_goes_on():
    started: list[int] = []

    async def waits(fh, off, size, gather=False, reply=None):
        started.append(off)
        await trio.sleep_forever()

    harness = Reads(waits)

    async def main() -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(harness.operations.read, harness.device.channel, 12, 1, 0, 4096)
                await trio.testing.wait_all_tasks_blocked()
                assert started == [0] and harness.device.written() == b""
                scope.cancel()
        assert scope.cancelled_caught  # the Cancelled went on, out of read

    trio.run(main)
    assert harness.device.written() == error(12, errno.EIO)
    harness.close()


def test_a_loop_read_whose_bytes_need_no_wait_is_answered_at_once_by_a_worker_or_here():
    """``read_now``: bytes the file system has at once go to a worker (its
    call sent now) or, small or with no worker able to take the call now, are
    written here; a read it declines is left for a task."""
    data = memoryview(os.urandom(WORKER_REPLY_MIN))

    async def read(fh, off, size, gather=False, reply=None):
        raise AssertionError("the task's read: not for a read answered at once")

    def read_now(fh, off, size):
        return None if off else data[:size]

    harness = Reads(read, read_now=read_now)
    channel = harness.device.channel
    assert harness.operations.read_now(channel, 5, 1, 0, WORKER_REPLY_MIN)
    assert harness.asked == [(5, WORKER_REPLY_MIN)] and harness.device.written() == b""
    harness.answers.pop()()
    assert harness.replies == {"worker": 1}
    assert harness.operations.read_now(channel, 6, 1, 0, 4 * KiB)  # small: written here
    assert harness.device.written() == data_reply(6, bytes(data[:4 * KiB]))
    assert not harness.operations.read_now(channel, 7, 1, MiB, 4 * KiB)  # declined: nothing written
    assert harness.device.written() == b""
    harness.sent = False  # no worker can take the call now: written here
    assert harness.operations.read_now(channel, 8, 1, 0, WORKER_REPLY_MIN)
    assert harness.device.written() == data_reply(8, bytes(data))
    assert harness.replies == {"worker": 1, "fuse": 2}
    assert harness.recorded() == (3, 0)  # the declined one is the task's to count
    harness.close()


def test_a_read_now_that_fails_is_left_to_the_read_s_task(caplog):
    def broken(fh, off, size):
        raise RuntimeError("a bug in read_now")

    async def read(fh, off, size, gather=False, reply=None):
        return b"from the task"

    harness = Reads(read, read_now=broken)
    with caplog.at_level(logging.ERROR, "rapidmount.fuse"):
        assert not harness.operations.read_now(harness.device.channel, 9, 1, 0, 13)
    assert harness.device.written() == b"" and "a bug in read_now" in caplog.text
    harness.read(9, 1, 0, 13)
    assert harness.device.written() == data_reply(9, b"from the task")
    harness.close()


def test_a_loop_read_over_several_blocks_is_gathered_from_their_views_in_one_reply():
    blocks = [os.urandom(64 * KiB) for _ in range(3)]
    asked: list[bool] = []

    async def read(fh, off, size, gather=False, reply=None):
        asked.append(gather)
        return slices(blocks, 1000, 1000 + size)

    want = b"".join(blocks)[1000:1000 + WORKER_REPLY_MIN]
    for sent in (True, False):
        harness = Reads(read, sent=sent)
        harness.read(11, 1, 1000, WORKER_REPLY_MIN)
        if sent:  # a worker is handed the whole length, its views in order
            assert harness.asked == [(11, WORKER_REPLY_MIN)] and harness.device.written() == b""
            assert bytes(harness.handed[0]) == want and len(pieces(harness.handed[0])) == 3
        else:  # written here: one writev of the header and each block's view
            assert harness.device.written() == data_reply(11, want)
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


def test_arena_offsets_of_views_and_of_what_is_not_in_it():
    arena = Arena(4 * MiB)
    offset, view = arena.allocate(256 * KiB)
    assert arena.offset_of(view) == offset
    assert arena.offset_of(view[4096:8192]) == offset + 4096
    assert arena.offset_of(bytes(view)) is None
    assert arena.offset_of(memoryview(bytearray(10))) is None
    assert arena.offset_of(memoryview(b"read-only")) is None
    assert arena.offset_of(view[:0]) is None


def test_a_loop_read_the_storage_answered_where_its_bytes_landed_is_not_written_again():
    """A read straight from a worker's stream: the worker wrote the reply as
    the bytes landed (``reply.sent``), so nothing is written here and no
    worker is asked; unsent, the read is answered as any read. Worker replies
    off: no ``reply`` is offered at all."""
    data = os.urandom(4 * KiB)
    offered = []

    async def read(fh, off, size, gather=False, reply=None):
        offered.append(reply)
        if reply is not None and off == 0:
            reply.sent = True
        return data

    harness = Reads(read)
    harness.read(11, 1, 0, 4 * KiB)
    assert offered[-1].unique == 11 and offered[-1].sent
    assert harness.device.written() == b"" and harness.asked == []
    assert harness.replies == {"landed": 1}
    harness.read(12, 1, 4 * KiB, 4 * KiB)
    assert offered[-1].unique == 12 and not offered[-1].sent
    assert harness.device.written() == data_reply(12, data)
    harness.close()

    off = Reads(read, workers=False)
    off.read(13, 1, 0, 4 * KiB)
    assert offered[-1] is None and off.device.written() == data_reply(13, data)
    assert off.replies == {"fuse": 1}
    off.close()


class _Os:
    """The channel's ``os``, whose writev fails with ``code`` once."""

    def __init__(self, code: int) -> None:
        self.code: int | None = code

    def writev(self, fd: int, buffers) -> int:
        code, self.code = self.code, None
        if code is not None:
            raise OSError(code, os.strerror(code))
        return os.writev(fd, buffers)

    def __getattr__(self, name: str):
        return getattr(os, name)


def test_a_read_reply_the_kernel_refuses_is_answered_eio_and_one_to_an_interrupted_read_is_dropped(monkeypatch):
    async def read(fh, off, size, gather=False, reply=None):
        return memoryview(b"abc")

    harness = Reads(read)
    monkeypatch.setattr(fuse_channel, "os", _Os(errno.EINVAL))  # refused: the kernel still waits for an answer
    harness.read(3, 1, 0, 3)
    assert harness.device.written() == error(3, errno.EIO)
    assert harness.device.written() == b"" and not harness.replies
    monkeypatch.setattr(fuse_channel, "os", _Os(errno.ENOENT))  # interrupted: nobody waits for it any more
    harness.read(4, 1, 0, 3)
    assert harness.device.written() == b""
    harness.close()


def test_the_channel_says_whether_the_kernel_took_a_reply(monkeypatch, caplog):
    device = Device()
    channel = device.channel
    assert channel.reply(error(1, errno.EIO)) and device.written() == error(1, errno.EIO)
    assert channel.reply_vector([codec.reply_header(2, 6), b"ab", memoryview(b"cdef")])
    assert device.written() == data_reply(2, b"abcdef")
    device.kernel.close()  # the kernel refuses anything more
    with caplog.at_level(logging.INFO, "rapidmount.fuse"):
        assert not channel.reply(error(3, errno.EIO))
        assert not channel.reply_vector([codec.reply_header(4, 1), b"x"])
    assert len(caplog.records) == 2
    device.ours.close()


# -- every other request ----------------------------------------------------------------------------

def request(opcode: int, unique: int, body: bytes = b"", nodeid: int = 1) -> bytes:
    return abi.IN_HEADER.pack(abi.IN_HEADER.size + len(body), opcode, unique, nodeid, 0, 0, 0, 0) + body


def attributes(ino: int, mode: int = stat.S_IFREG | 0o644, size: int = 0) -> Attributes:
    return Attributes(st_ino=ino, st_mode=mode, st_nlink=1, st_size=size, st_uid=1000, st_gid=1000,
                      st_blksize=MiB, st_blocks=(size + 511) // 512, st_atime_ns=10**18, st_mtime_ns=10**18,
                      st_ctime_ns=10**18, entry_timeout=60.0, attr_timeout=30.0)


class FakeFS:
    """The core's calls the tests make; ``fails`` is raised by the next call that looks."""

    def __init__(self) -> None:
        self.names: dict[tuple[int, bytes], int] = {(1, b"there"): 5}
        self.sizes = {1: 0, 5: 1234}
        self.forgotten: list[list[tuple[int, int]]] = []
        self.opened: list[tuple[int, int]] = []
        self.fails: BaseException | None = None
        self.waits = False
        self.meta = SimpleNamespace(negative_timeout=lambda: 2.5)
        self.backing: dict[int, int] = {}  # fh -> the backing id of a passthrough open

    def _fail(self) -> None:
        fails, self.fails = self.fails, None
        if fails is not None:
            raise fails

    async def lookup(self, parent: int, name: bytes):
        await trio.lowlevel.checkpoint()
        self._fail()
        ino = self.names.get((parent, name))
        if ino is None:
            raise NoSuchName(7.5)
        return SimpleNamespace(ino=ino)

    async def getattr(self, ino: int):
        await trio.lowlevel.checkpoint()
        if self.waits:
            await trio.sleep_forever()
        self._fail()
        return SimpleNamespace(ino=ino)

    def attributes_of(self, inode) -> Attributes:
        return attributes(inode.ino, size=self.sizes.get(inode.ino, 0))

    def forget(self, items: list[tuple[int, int]]) -> None:
        self.forgotten.append(items)

    async def open(self, ino: int, flags: int) -> tuple[int, bool, bool]:
        self.opened.append((ino, flags))
        return 40 + len(self.opened), False, bool(flags & os.O_SYNC)

    def backing_of(self, fh: int) -> int | None:
        return self.backing.get(fh)


class Serving:
    def __init__(self) -> None:
        self.device = Device()
        self.fs = FakeFS()
        self.operations = Operations(self.fs)  # type: ignore[arg-type]

    def serve(self, message: bytes) -> bytes:
        """The reply to ``message``, decoded by the codec and served; b"" for none."""
        header, body = codec.decode(message)
        trio.run(self.operations.serve, self.device.channel, header, body)
        return self.device.written()

    def recorded(self, operation: str) -> tuple[int, int]:
        count, errors, _, _ = self.operations.stats.snapshot().get(operation, (0, 0, 0.0, []))
        return count, errors

    def close(self) -> None:
        self.device.close()


def entry(reply: bytes) -> tuple[int, int, tuple[int, ...]]:
    """(error, unique, fuse_entry_out's fields) of an entry reply."""
    length, code, unique = OUT.unpack_from(reply)
    assert length == len(reply) == OUT.size + abi.ENTRY_OUT.size
    return code, unique, abi.ENTRY_OUT.unpack_from(reply, OUT.size)


def test_a_lookup_answers_the_entry_with_its_attributes_and_timeouts():
    serving = Serving()
    code, unique, fields = entry(serving.serve(request(Op.LOOKUP, 1, b"there\0")))
    nodeid, generation, entry_valid, attr_valid, entry_nsec, attr_nsec, ino, size = fields[:8]
    assert (code, unique, nodeid, ino, size) == (0, 1, 5, 5, 1234)
    assert (entry_valid, entry_nsec, attr_valid, attr_nsec) == (60, 0, 30, 0)
    assert fields[6 + 9] == stat.S_IFREG | 0o644  # st_mode
    assert serving.recorded("lookup") == (1, 0)
    serving.close()


def test_a_lookup_of_a_missing_name_answers_a_negative_entry_the_kernel_may_cache():
    serving = Serving()
    code, unique, fields = entry(serving.serve(request(Op.LOOKUP, 2, b"missing\0")))
    nodeid, _, entry_valid, attr_valid, entry_nsec, attr_nsec = fields[:6]
    assert (code, unique, nodeid) == (0, 2, 0)  # nodeid 0: no such name, and no reference taken
    assert (entry_valid, entry_nsec, attr_valid, attr_nsec) == (7, 500_000_000, 0, 0)  # NoSuchName's 7.5 s
    serving.fs.fails = FSError(errno.ENOENT)  # an ENOENT with no timeout of its own: the mount's
    code, unique, fields = entry(serving.serve(request(Op.LOOKUP, 3, b"missing\0")))
    assert (code, unique, fields[0], fields[2], fields[4]) == (0, 3, 0, 2, 500_000_000)
    serving.fs.fails = FSError(errno.EACCES)  # any other failure is a failure
    assert serving.serve(request(Op.LOOKUP, 4, b"missing\0")) == error(4, errno.EACCES)
    assert serving.recorded("lookup") == (3, 1)
    serving.close()


def test_an_fserror_is_answered_with_its_errno():
    serving = Serving()
    serving.fs.fails = FSError(errno.ESTALE)
    assert serving.serve(request(Op.GETATTR, 5, abi.GETATTR_IN.pack(0, 0), nodeid=5)) == error(5, errno.ESTALE)
    assert serving.recorded("getattr") == (1, 1)
    serving.close()


def test_an_unexpected_exception_is_answered_eio_logged_and_the_next_request_served(caplog):
    """Through the loop: the bug costs its own request an EIO, nothing more."""
    device = Device()
    fs = FakeFS()
    fs.fails = RuntimeError("a bug in getattr")
    operations = Operations(fs)  # type: ignore[arg-type]
    loop = RequestLoop(device.channel, operations, collections.Counter())
    getattr_in = abi.GETATTR_IN.pack(0, 0)

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(loop.run)
                device.kernel.send(request(Op.GETATTR, 6, getattr_in, nodeid=5))
                await trio.testing.wait_all_tasks_blocked()
                assert device.written() == error(6, errno.EIO)
                device.kernel.send(request(Op.GETATTR, 7, getattr_in, nodeid=5))
                await trio.testing.wait_all_tasks_blocked()
                reply = device.written()
                assert OUT.unpack_from(reply) == (OUT.size + abi.ATTR_OUT.size, 0, 7)
                assert abi.ATTR_OUT.unpack_from(reply, OUT.size)[2:4] == (5, 1234)  # attr_valid..., ino, size
                loop.stop()

    with caplog.at_level(logging.ERROR, "rapidmount.fuse"):
        trio.run(main)
    assert "a bug in getattr" in caplog.text
    assert operations.stats.snapshot()["getattr"][:2] == (2, 1)
    device.close()


def test_a_cancelled_request_is_answered_eio_and_the_cancellation_goes_on():
    serving = Serving()
    serving.fs.waits = True
    header, body = codec.decode(request(Op.GETATTR, 8, abi.GETATTR_IN.pack(0, 0)))

    async def main() -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serving.operations.serve, serving.device.channel, header, body)
                await trio.testing.wait_all_tasks_blocked()
                assert serving.device.written() == b""
                scope.cancel()
        assert scope.cancelled_caught

    trio.run(main)
    assert serving.device.written() == error(8, errno.EIO)
    serving.close()


def test_forget_and_batch_forget_get_no_reply_and_the_core_forgets():
    serving = Serving()
    assert serving.serve(request(Op.FORGET, 9, abi.FORGET_IN.pack(3), nodeid=5)) == b""
    batch = abi.BATCH_FORGET_IN.pack(2) + abi.FORGET_ONE.pack(5, 1) + abi.FORGET_ONE.pack(6, 4)
    assert serving.serve(request(Op.BATCH_FORGET, 10, batch, nodeid=0)) == b""
    assert serving.fs.forgotten == [[(5, 3)], [(5, 1), (6, 4)]]
    serving.close()


@pytest.mark.parametrize("flags, noflush", [
    (os.O_RDONLY, True),
    (os.O_RDONLY | os.O_NOATIME, True),
    (os.O_WRONLY, False),
    (os.O_RDWR, False),
    (os.O_RDONLY | os.O_TRUNC, False),  # truncates: its close has something to flush
])
def test_a_read_only_open_is_told_to_skip_flush_at_close(flags, noflush):
    serving = Serving()
    reply = serving.serve(request(Op.OPEN, 11, abi.OPEN_IN.pack(flags, 0), nodeid=5))
    assert OUT.unpack_from(reply) == (OUT.size + abi.OPEN_OUT.size, 0, 11)
    fh, open_flags, backing_id = abi.OPEN_OUT.unpack_from(reply, OUT.size)
    assert (fh, backing_id) == (41, 0) and serving.fs.opened == [(5, flags)]
    assert bool(open_flags & abi.FOPEN_NOFLUSH) is noflush
    assert not open_flags & (abi.FOPEN_DIRECT_IO | abi.FOPEN_KEEP_CACHE)
    serving.close()


def test_an_open_carries_the_core_s_direct_io_and_keep_cache_and_noflush_can_be_turned_off():
    serving = Serving()

    async def direct(ino, flags):
        return 50, True, True

    serving.fs.open = direct
    reply = serving.serve(request(Op.OPEN, 12, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=5))
    _, open_flags, _ = abi.OPEN_OUT.unpack_from(reply, OUT.size)
    assert open_flags == abi.FOPEN_DIRECT_IO | abi.FOPEN_KEEP_CACHE | abi.FOPEN_NOFLUSH
    serving.operations.noflush_read_only = False
    reply = serving.serve(request(Op.OPEN, 13, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=5))
    assert abi.OPEN_OUT.unpack_from(reply, OUT.size)[1] == abi.FOPEN_DIRECT_IO | abi.FOPEN_KEEP_CACHE
    serving.close()


def test_a_passthrough_open_names_its_backing_file_and_neither_direct_io_nor_keep_cache():
    serving = Serving()
    serving.fs.backing[41] = 7
    reply = serving.serve(request(Op.OPEN, 14, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=5))
    fh, open_flags, backing_id = abi.OPEN_OUT.unpack_from(reply, OUT.size)
    assert (fh, backing_id) == (41, 7)
    assert open_flags == abi.FOPEN_PASSTHROUGH | abi.FOPEN_NOFLUSH
    serving.close()


@pytest.mark.parametrize("opcode, body", [
    (Op.MKNOD, abi.MKNOD_IN.pack(stat.S_IFIFO | 0o644, 0, 0o022) + b"fifo\0"),
    (Op.GETXATTR, abi.GETXATTR_IN.pack(0) + b"user.x\0"),
    (Op.SETLK, None),  # not decoded at all: a header alone
])
def test_an_opcode_not_in_the_table_is_answered_enosys_and_the_core_is_not_asked(opcode, body):
    serving = Serving()
    serving.operations.fs = None  # any call to the core would fail with EIO, not ENOSYS
    if body is None:
        header = codec.Header(abi.IN_HEADER.size, opcode, 14, 5, 0, 0, 0)
    else:
        header, body = codec.decode(request(opcode, 14, body, nodeid=5))
    assert opcode not in serving.operations.table
    trio.run(serving.operations.serve, serving.device.channel, header, body)
    assert serving.device.written() == error(14, errno.ENOSYS)
    assert serving.operations.stats.snapshot() == {}  # no operation ran
    serving.close()
