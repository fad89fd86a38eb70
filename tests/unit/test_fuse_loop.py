"""The mount's one FUSE request loop, without FUSE: what it answers itself,
what it hands to :class:`~rapidmount.fuse.operations.Operations`, what it
refuses, and where a WRITE's bytes land.

The device is one end of a SOCK_SEQPACKET pair (one read is one request, as
on ``/dev/fuse``); the test writes requests into the other end and reads the
replies back. The operations are a recorder with the methods the loop calls.
"""

from __future__ import annotations

import collections
import errno
import os
import socket
import struct

import pytest
import trio
import trio.testing

from rapidmount.core.errors import FSError
from rapidmount.shared.arena import Arena
from rapidmount.fuse.write_pipes import HANDED, PipedWrite, WritePipes
from rapidmount.shared import fuse_abi as abi, fuse_codec as codec
from rapidmount.fuse import loop as fuse_loop
from rapidmount.fuse.channel import Channel
from rapidmount.fuse.init import Negotiated, ProtocolTooOld, Wants
from rapidmount.fuse.loop import HEAD, MAX_WRITE, RequestLoop

KiB, MiB = 1 << 10, 1 << 20
OUT = abi.OUT_HEADER
Op = abi.Opcode


def request(opcode: int, unique: int, body: bytes = b"", *, nodeid: int = 1, length: int | None = None) -> bytes:
    size = abi.IN_HEADER.size + len(body) if length is None else length
    return abi.IN_HEADER.pack(size, opcode, unique, nodeid, 0, 0, 0, 0) + body


def read_request(unique: int, fh: int, offset: int, size: int) -> bytes:
    return request(Op.READ, unique, abi.READ_IN.pack(fh, offset, size, 0, 0, 0))


def write_request(unique: int, fh: int, offset: int, data: bytes) -> bytes:
    return request(Op.WRITE, unique, abi.WRITE_IN.pack(fh, offset, len(data), 0, 0, 0) + data)


def getattr_request(unique: int, nodeid: int = 1) -> bytes:
    return request(Op.GETATTR, unique, abi.GETATTR_IN.pack(0, 0), nodeid=nodeid)


class FakeOperations:
    """What the loop calls, recorded: a READ task waits for ``release_read``
    and answers ``abc``; every other request is recorded and answered empty."""

    def __init__(self, *, write_error: int = 0, write_now=None, read_now=None) -> None:
        self.reads: list[tuple[int, int, int, int]] = []
        self.writes: list[tuple[int, int, object]] = []
        self.served: list[tuple[codec.Header, object]] = []
        self.channels: set[int] = set()  # the descriptors replies were written to
        self.write_error = write_error
        self.write_blocks = False
        self.write_now_call = write_now
        self.read_now_call = read_now
        self.release_read = trio.Event()
        #: What the write operation does with bytes still in a pipe: "land"
        #: them (as a staged file's write), or "hand" them to a worker (as a stream's).
        self.piped = "land"
        self.pipes: WritePipes | None = None
        self.piped_views: list[memoryview] = []

    async def read(self, channel: Channel, unique: int, fh: int, offset: int, size: int) -> None:
        self.channels.add(channel.fd)
        self.reads.append((unique, fh, offset, size))
        await self.release_read.wait()
        channel.reply(OUT.pack(OUT.size + 3, 0, unique) + b"abc")

    def read_now(self, channel: Channel, unique: int, fh: int, offset: int, size: int) -> bool:
        self.channels.add(channel.fd)
        return self.read_now_call is not None and self.read_now_call(channel, unique, fh, offset, size)

    async def write(self, fh: int, offset: int, data) -> int:
        if self.write_blocks:
            await trio.sleep_forever()
        if self.write_error:
            raise FSError(self.write_error)
        if isinstance(data, PipedWrite):
            self.piped_views.append(data.view)  # let go of once its pipe is seen empty
            if self.piped in ("hand", "hand, then fail"):
                assert self.pipes is not None
                self.pipes.handed(data, "worker")
                if self.piped == "hand, then fail":
                    raise FSError(errno.EIO)
            else:
                data.land()
        self.writes.append((fh, offset, data))
        return len(data)

    def write_now(self, fh: int, offset: int, data) -> int | None:
        return None if self.write_now_call is None else self.write_now_call(fh, offset, data)

    async def serve(self, channel: Channel, header: codec.Header, body: object) -> None:
        self.channels.add(channel.fd)
        await trio.lowlevel.checkpoint()  # awaited, not only called
        self.served.append((header, body))
        channel.reply(OUT.pack(OUT.size, 0, header.unique))


class Harness:
    def __init__(self, *, arena: Arena | None = None, write_error: int = 0, max_write: int = MAX_WRITE,
                 pipes: WritePipes | None = None, write_now=None, read_now=None,
                 operations: FakeOperations | None = None) -> None:
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for sock in (self.ours, self.kernel):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
        self.fd = self.ours.fileno()
        self.operations = operations or FakeOperations(write_error=write_error, write_now=write_now,
                                                       read_now=read_now)
        self.operations.pipes = pipes
        self.arena = arena
        self.pipes = pipes
        self.counts: collections.Counter[str] = collections.Counter()
        self.returned = False  # loop.run() returned
        self.blocking_after: bool | None = None
        self.loop = RequestLoop(Channel(self.fd), self.operations, self.counts,  # type: ignore[arg-type]
                                allocate=arena.allocate if arena is not None else None, max_write=max_write,
                                pipes=pipes)

    @property
    def reads(self) -> list[tuple[int, int, int, int]]:
        return self.operations.reads

    @property
    def writes(self) -> list[tuple[int, int, object]]:
        return self.operations.writes

    @property
    def served(self) -> list[tuple[codec.Header, object]]:
        return self.operations.served

    def send(self, message: bytes) -> None:
        self.kernel.send(message)

    def reply(self) -> tuple[int, int, int, bytes]:
        """The next reply: written already (a test reads replies once every task is blocked)."""
        message = self.kernel.recv(4 * MiB, socket.MSG_DONTWAIT)
        length, error, unique = OUT.unpack_from(message)
        assert length == len(message)
        return length, error, unique, message[OUT.size:]

    def run(self, checks, *, end: bool = True) -> None:
        """The loop runs while ``checks`` does; then (``end``) the session
        ends, the loop reads 0 bytes, and ``run`` must return."""
        async def main() -> None:
            self.operations.release_read = trio.Event()
            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._run)
                    await trio.testing.wait_all_tasks_blocked()
                    await checks()
                    if end:
                        self.kernel.shutdown(socket.SHUT_WR)
        try:
            trio.run(main)
        finally:
            self.ours.close()
            self.kernel.close()
            if self.pipes is not None:
                self.pipes.close()
        assert self.operations.channels <= {self.fd}  # every reply on the descriptor its request came from

    async def _run(self) -> None:
        await self.loop.run()
        self.returned = True
        self.blocking_after = os.get_blocking(self.fd)  # the descriptor as run() found it

    def assert_no_reply(self) -> None:
        """Nothing answered (yet)."""
        self.kernel.setblocking(False)
        with pytest.raises(BlockingIOError):
            self.kernel.recv(100)
        self.kernel.setblocking(True)


# -- READ -------------------------------------------------------------------------------------------

def test_a_read_is_handed_its_unique_handle_offset_and_size_and_nothing_is_served():
    harness = Harness()

    async def checks() -> None:
        harness.send(read_request(7, 42, 3 * MiB, 128 * KiB))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reads == [(7, 42, 3 * MiB, 128 * KiB)]
        harness.assert_no_reply()
        harness.operations.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 7, b"abc")

    harness.run(checks)
    assert harness.served == []
    assert harness.counts["read"] == 1 and harness.counts["read_at_once"] == 0
    assert harness.operations.channels == {harness.fd}


def test_a_read_answered_at_once_needs_no_task_and_one_declined_becomes_a_task():
    """``read_now`` answers a READ whose bytes need no wait (the loop counts
    it and receives the next request); one it declines becomes a task."""
    taken: list[tuple[int, int, int, int]] = []

    def read_now(channel: Channel, unique: int, fh: int, offset: int, size: int) -> bool:
        if offset >= MiB:
            return False  # not cached: a task waits for it
        taken.append((unique, fh, offset, size))
        channel.reply(OUT.pack(OUT.size + 2, 0, unique) + b"ok")
        return True

    harness = Harness(read_now=read_now)

    async def checks() -> None:
        harness.send(read_request(7, 42, 0, 128 * KiB))
        harness.send(read_request(8, 42, 2 * MiB, 128 * KiB))
        await trio.testing.wait_all_tasks_blocked()
        assert taken == [(7, 42, 0, 128 * KiB)]
        assert harness.reads == [(8, 42, 2 * MiB, 128 * KiB)]  # the declined one only, as a task
        assert harness.reply() == (OUT.size + 2, 0, 7, b"ok")
        harness.operations.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 8, b"abc")

    harness.run(checks)
    assert harness.counts["read"] == 2 and harness.counts["read_at_once"] == 1
    assert harness.served == []


def test_requests_wait_for_none_other_a_slow_read_leaves_the_loop_receiving():
    harness = Harness()

    async def checks() -> None:
        for unique in range(30, 36):
            harness.send(read_request(unique, 1, unique * MiB, MiB))
        await trio.testing.wait_all_tasks_blocked()
        assert [read[0] for read in harness.reads] == list(range(30, 36))  # all received, none answered yet
        harness.send(write_request(40, 1, 0, b"y" * 10))
        harness.send(getattr_request(41))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in range(2)) == [40, 41]  # answered while the reads wait
        harness.operations.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in range(6)) == list(range(30, 36))

    harness.run(checks)


# -- every other request: decoded and served, refused, dropped ---------------------------------------

def test_other_requests_are_decoded_and_served_with_their_header_and_body():
    harness = Harness()
    target = b"t" * 3000  # a request longer than the loop's headers: its rest read into the buffer after them
    requests = [
        request(Op.GETATTR, 11, abi.GETATTR_IN.pack(abi.GETATTR_FH, 77), nodeid=9),
        request(Op.LOOKUP, 12, b"file.txt\0", nodeid=3),
        request(Op.SYMLINK, 13, b"link\0" + target + b"\0", nodeid=4),
        request(Op.FORGET, 14, abi.FORGET_IN.pack(2), nodeid=5),
    ]

    async def checks() -> None:
        for message in requests:
            harness.send(message)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in requests) == [11, 12, 13, 14]  # the fake answers each

    harness.run(checks)
    served = sorted(harness.served, key=lambda item: item[0].unique)
    assert [(header.opcode, header.unique, header.nodeid, header.length) for header, _ in served] == [
        (Op.GETATTR, 11, 9, len(requests[0])), (Op.LOOKUP, 12, 3, len(requests[1])),
        (Op.SYMLINK, 13, 4, len(requests[2])), (Op.FORGET, 14, 5, len(requests[3]))]
    assert [body for _, body in served] == [codec.Getattr(77), codec.Lookup(b"file.txt"),
                                            codec.Symlink(b"link", target), codec.Forget(2)]
    assert harness.counts["other"] == 4 and harness.reads == [] and harness.writes == []


def test_a_request_served_without_a_wait_needs_no_task_and_every_handler_starts_in_order():
    """A handler runs from the moment its request is received until it first
    waits: one that never waits (a cached GETATTR) is answered before the
    next request is received; the others go on in a task."""
    class Operations(FakeOperations):
        started: list[tuple[int, int]] = []  # (unique, requests received by then)

        async def serve(self, channel: Channel, header: codec.Header, body: object) -> None:
            self.started.append((header.unique, harness.counts["other"]))
            if header.nodeid != 1:
                await trio.lowlevel.checkpoint()  # waits: a task finishes it
            self.served.append((header, body))
            channel.reply(OUT.pack(OUT.size, 0, header.unique))

    harness = Harness(operations=Operations())

    async def checks() -> None:
        for unique, nodeid in [(91, 1), (92, 5), (93, 1), (94, 5)]:
            harness.send(getattr_request(unique, nodeid))
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(harness.reply()[2] for _ in range(4)) == [91, 92, 93, 94]

    harness.run(checks)
    assert Operations.started == [(91, 1), (92, 2), (93, 3), (94, 4)]  # each as its request came
    assert harness.counts["other"] == 4 and harness.counts["other_at_once"] == 2


def test_a_request_longer_than_a_whole_write_buffer_is_decoded_whole_from_the_spill():
    harness = Harness(max_write=4096)  # no arena: a buffer of 4 KiB after the headers, then the spill
    target = os.urandom(4200).replace(b"\0", b"x")

    async def checks() -> None:
        harness.send(request(Op.SYMLINK, 21, b"n" * 200 + b"\0" + target + b"\0"))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 21

    harness.run(checks)
    ((header, body),) = harness.served
    assert header.unique == 21 and body == codec.Symlink(b"n" * 200, target)


def test_the_message_for_the_codec_is_the_request_even_past_a_whole_write():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        loop = RequestLoop(Channel(ours.fileno()), FakeOperations(), collections.Counter())  # type: ignore[arg-type]
        head = bytes(range(HEAD))
        loop._head[:] = head
        tail = os.urandom(MAX_WRITE + 1000)
        loop._data[:MAX_WRITE] = tail[:MAX_WRITE]
        loop._spill[:1000] = tail[MAX_WRITE:]
        assert loop._message(HEAD + len(tail)) == head + tail
        assert loop._message(HEAD + 10) == head + tail[:10]
        assert loop._message(56) == head[:56]
    finally:
        ours.close()
        kernel.close()


@pytest.mark.parametrize("opcode", [9999, Op.GETLK, Op.IOCTL, Op.CUSE_INIT])
def test_an_opcode_the_codec_does_not_decode_gets_enosys_and_the_loop_goes_on(opcode):
    """As libfuse answers an operation a file system leaves out: not a malformed request."""
    harness = Harness()

    async def checks() -> None:
        harness.send(request(opcode, 31, bytes(64)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size, -errno.ENOSYS, 31, b"")
        harness.send(getattr_request(32))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, 0, 32)

    harness.run(checks)
    assert [header.unique for header, _ in harness.served] == [32]
    assert harness.counts["refused"] == 0 and harness.counts["other"] == 2


REFUSED = {
    "body-shorter-than-its-struct": (request(Op.GETATTR, 41, bytes(4)), errno.EINVAL),
    "len-says-more": (request(Op.GETATTR, 41, bytes(16), length=100), errno.EINVAL),
    "len-says-less": (request(Op.GETATTR, 41, bytes(16), length=48), errno.EINVAL),
    "read-whose-len-lies": (request(Op.READ, 41, abi.READ_IN.pack(1, 0, 4096, 0, 0, 0), length=200), errno.EINVAL),
    "read-too-short": (request(Op.READ, 41, abi.READ_IN.pack(1, 0, 4096, 0, 0, 0)[:20]), errno.EINVAL),
    "write-with-fewer-bytes-than-its-size": (
        request(Op.WRITE, 41, abi.WRITE_IN.pack(1, 0, 100, 0, 0, 0) + b"w" * 50), errno.EINVAL),
    "lookup-name-without-its-nul": (request(Op.LOOKUP, 41, b"name"), errno.EINVAL),
    "lookup-empty-name": (request(Op.LOOKUP, 41, b"\0"), errno.EINVAL),
    "lookup-name-too-long": (request(Op.LOOKUP, 41, b"n" * 256 + b"\0"), errno.ENAMETOOLONG),
}


@pytest.mark.parametrize("message, code", list(REFUSED.values()), ids=list(REFUSED))
def test_a_request_the_codec_refuses_gets_its_errno_and_the_loop_goes_on(message, code):
    harness = Harness()

    async def checks() -> None:
        harness.send(message)
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size, -code, 41, b"")
        harness.send(getattr_request(42))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, 0, 42)

    harness.run(checks)
    assert [header.unique for header, _ in harness.served] == [42]
    assert harness.reads == [] and harness.writes == []
    # A name too long is the kernel's ordinary request, answered quietly; the rest are malformed.
    assert harness.counts["refused"] == (0 if code == errno.ENAMETOOLONG else 1)


def test_a_request_too_short_to_name_its_unique_gets_no_reply_and_the_loop_goes_on():
    harness = Harness()

    async def checks() -> None:
        harness.send(getattr_request(51)[:20])
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()  # nothing to answer it with
        harness.send(getattr_request(52))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, 0, 52)

    harness.run(checks)
    assert [header.unique for header, _ in harness.served] == [52]
    assert harness.counts["refused"] == 1


def test_an_interrupt_gets_no_reply_and_its_request_is_answered_as_it_would_be():
    harness = Harness()

    async def checks() -> None:
        harness.send(read_request(21, 1, 0, 4096))
        await trio.testing.wait_all_tasks_blocked()
        harness.send(request(Op.INTERRUPT, 22, abi.INTERRUPT_IN.pack(21)))
        harness.send(request(Op.INTERRUPT, 23, abi.INTERRUPT_IN.pack(999)))  # of no request at all
        harness.send(write_request(24, 1, 0, b"z"))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 24
        harness.assert_no_reply()  # none for an INTERRUPT
        harness.operations.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 21, b"abc")
        harness.send(request(Op.INTERRUPT, 25, abi.INTERRUPT_IN.pack(21)))  # late: 21 was answered
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()

    harness.run(checks)
    assert harness.served == []
    assert harness.counts["interrupt"] == 3


def test_destroy_is_answered_and_ends_the_loop():
    harness = Harness()

    async def checks() -> None:
        harness.send(request(Op.DESTROY, 61))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size, 0, 61, b"")
        assert harness.returned
        harness.send(getattr_request(62))  # nobody reads it
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()

    harness.run(checks, end=False)
    assert harness.served == []
    assert harness.blocking_after  # the descriptor as the loop found it


def test_stop_ends_run_once_the_requests_received_are_answered():
    harness = Harness()

    async def checks() -> None:
        harness.send(read_request(71, 1, 0, 4096))
        await trio.testing.wait_all_tasks_blocked()
        harness.loop.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert not harness.returned  # the READ's task still runs
        harness.send(getattr_request(72))  # after stop(): never received
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()
        harness.operations.release_read.set()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 3, 0, 71, b"abc")
        assert harness.returned
        harness.loop.stop()  # again: nothing happens

    harness.run(checks, end=False)
    assert harness.served == []
    assert harness.blocking_after


def test_stop_with_nothing_under_way_ends_run_at_once():
    harness = Harness()

    async def checks() -> None:
        assert not harness.returned
        harness.loop.stop()
        await trio.testing.wait_all_tasks_blocked()
        assert harness.returned

    harness.run(checks, end=False)


class _Os:
    """The loop's ``os``, whose readv fails with the errnos given first."""

    def __init__(self, *errnos: int) -> None:
        self.errnos = list(errnos)
        self.failed: list[int] = []

    def readv(self, fd: int, buffers) -> int:
        if self.errnos:
            self.failed.append(self.errnos.pop(0))
            raise OSError(self.failed[-1], os.strerror(self.failed[-1]))
        return os.readv(fd, buffers)

    def __getattr__(self, name: str):
        return getattr(os, name)


def test_a_read_interrupted_before_it_read_a_request_is_tried_again(monkeypatch):
    device = _Os(errno.ENOENT, errno.EINTR, errno.EAGAIN)
    monkeypatch.setattr(fuse_loop, "os", device)
    harness = Harness()
    harness.send(getattr_request(81))  # there before the loop's first read

    async def checks() -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, 0, 81)

    harness.run(checks)
    assert device.failed == [errno.ENOENT, errno.EINTR, errno.EAGAIN]
    assert [header.unique for header, _ in harness.served] == [81]


def test_enodev_ends_the_loop_as_the_mount_is_gone(monkeypatch):
    device = _Os(errno.ENODEV)
    monkeypatch.setattr(fuse_loop, "os", device)
    harness = Harness()
    harness.send(getattr_request(82))  # never read

    async def checks() -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert harness.returned
        harness.assert_no_reply()

    harness.run(checks, end=False)
    assert device.failed == [errno.ENODEV] and harness.served == []


def test_another_failure_to_read_a_request_is_raised(monkeypatch):
    monkeypatch.setattr(fuse_loop, "os", _Os(errno.EIO))
    harness = Harness()

    async def checks() -> None:
        await trio.sleep_forever()  # ended by the loop's failure

    with pytest.RaisesGroup(pytest.RaisesGroup(pytest.RaisesExc(OSError, match="reading a FUSE request"))):
        harness.run(checks, end=False)


# -- INIT -------------------------------------------------------------------------------------------

def init_request(unique: int, major: int = 7, minor: int = 45, max_readahead: int = MiB, flags: int = 0) -> bytes:
    """An INIT as a kernel of ``major``.``minor`` sends it: ``fuse_init_in``
    whole from 7.36 (flags2 in ``flags``'s high bits), its first four fields before."""
    if (major, minor) >= (7, abi.INIT_IN_FULL_MINOR):
        body = abi.INIT_IN.pack(major, minor, max_readahead, flags & 0xFFFFFFFF, flags >> 32)
    else:
        body = abi.INIT_IN_COMPAT.pack(major, minor, max_readahead, flags)
    return request(Op.INIT, unique, body, nodeid=0)


def init_reply(message: bytes) -> tuple[int, int, int, tuple[int, ...]]:
    length, error, unique = OUT.unpack_from(message)
    assert length == len(message) == OUT.size + abi.INIT_OUT.size
    return length, error, unique, abi.INIT_OUT.unpack_from(message, OUT.size)


def handshake(*messages: bytes, wants: Wants | None = None) -> tuple[Negotiated, list[bytes]]:
    """``fuse_loop.handshake`` on a descriptor holding ``messages``; what it
    returned, and every reply it wrote."""
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)  # a handshake waiting for more would time out, not hang
    wants = wants or Wants(max_write=4 * MiB, max_readahead=4 * MiB, max_background=64, congestion_threshold=48)

    async def main() -> Negotiated:
        with trio.fail_after(10):
            return await fuse_loop.handshake(Channel(ours.fileno()), wants)

    try:
        for message in messages:
            kernel.send(message)
        negotiated = trio.run(main)
        kernel.setblocking(False)
        replies = []
        while True:
            try:
                replies.append(kernel.recv(MiB))
            except BlockingIOError:
                return negotiated, replies
    finally:
        ours.close()
        kernel.close()


def test_the_handshake_answers_init_with_what_was_negotiated():
    offered = abi.ASYNC_READ | abi.MAX_PAGES | abi.BIG_WRITES | abi.WRITEBACK_CACHE | abi.INIT_EXT | abi.HAS_RESEND
    negotiated, replies = handshake(init_request(1, flags=offered))
    ((reply),) = replies
    assert reply == negotiated.reply
    length, error, unique, fields = init_reply(reply)
    (major, minor, max_readahead, flags, max_background, congestion_threshold, max_write, time_gran, max_pages,
     _map_alignment, flags2, _max_stack_depth, _request_timeout) = fields
    assert (error, unique, major, minor) == (0, 1, 7, 45)
    assert (max_readahead, max_write, max_pages) == (MiB, 4 * MiB, 1024)  # the kernel's readahead is the lower
    assert (max_background, congestion_threshold, time_gran) == (64, 48, 1)
    granted = flags | flags2 << 32
    assert granted & abi.MAX_PAGES and granted & abi.ASYNC_READ and granted & abi.INIT_EXT
    assert not granted & abi.WRITEBACK_CACHE  # offered, never taken
    assert (negotiated.major, negotiated.minor, negotiated.offered, negotiated.granted) == (7, 45, offered, granted)
    assert (negotiated.max_write, negotiated.max_pages, negotiated.retry) == (4 * MiB, 1024, False)


def test_the_handshake_speaks_to_an_older_kernel_at_its_minor():
    negotiated, replies = handshake(init_request(1, minor=34, flags=abi.ASYNC_READ))  # Linux 5.15
    (reply,) = replies
    fields = init_reply(reply)[3]
    assert fields[:2] == (7, 34) and negotiated.minor == 34
    # No MAX_PAGES offered: the kernel splits requests at its default page count.
    assert negotiated.max_write == fields[6] == abi.DEFAULT_MAX_PAGES * abi.PAGE_SIZE


def test_the_handshake_answers_what_comes_before_init_and_a_newer_major_and_waits_for_init():
    negotiated, replies = handshake(
        getattr_request(1),  # nothing is served before INIT
        init_request(2, minor=45)[:50],  # refused by the codec: its errno
        init_request(3, major=8, minor=0),  # a newer major: told 7, and asked again
        init_request(4, flags=abi.MAX_PAGES))
    assert [OUT.unpack_from(reply) for reply in replies[:2]] == [(OUT.size, -errno.EIO, 1),
                                                                 (OUT.size, -errno.EINVAL, 2)]
    assert replies[2] == OUT.pack(OUT.size + 8, 0, 3) + abi.INIT_OUT_COMPAT.pack(7, abi.MAX_MINOR)
    assert init_reply(replies[3])[2] == 4 and replies[3] == negotiated.reply
    assert negotiated.max_write == 4 * MiB and not negotiated.retry


def test_a_kernel_too_old_gets_eproto_and_the_handshake_fails():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    wants = Wants(max_write=MiB, max_readahead=MiB)
    try:
        kernel.send(init_request(5, minor=abi.MIN_MINOR - 1))
        with pytest.raises(ProtocolTooOld):
            trio.run(fuse_loop.handshake, Channel(ours.fileno()), wants)
        kernel.setblocking(False)
        assert kernel.recv(MiB) == OUT.pack(OUT.size, -errno.EPROTO, 5)  # the mount fails, not hangs
    finally:
        ours.close()
        kernel.close()


# -- WRITE: where its bytes land --------------------------------------------------------------------

def test_whole_writes_land_in_slots_of_an_arena_region_which_returns_when_none_holds_it():
    arena = Arena(16 * MiB)
    harness = Harness(arena=arena)
    pieces = [os.urandom(MAX_WRITE) for _ in range(fuse_loop.SLOTS + 1)]

    async def checks() -> None:
        assert arena.used == fuse_loop.SLOTS * MAX_WRITE  # the loop's region, before any request
        for index, piece in enumerate(pieces):
            harness.send(write_request(9 + index, 5, index * MAX_WRITE, piece))
            await trio.testing.wait_all_tasks_blocked()
            assert harness.reply() == (OUT.size + 8, 0, 9 + index, struct.pack("<II", MAX_WRITE, 0))
        offsets = [arena.offset_of(written) for _, _, written in harness.writes]
        assert offsets[1:fuse_loop.SLOTS] == [offsets[0] + n * MAX_WRITE for n in range(1, fuse_loop.SLOTS)]
        assert [bytes(written) for _, _, written in harness.writes] == pieces
        assert [(fh, offset) for fh, offset, _ in harness.writes] == [(5, n * MAX_WRITE) for n in range(len(pieces))]
        assert arena.used == 2 * fuse_loop.SLOTS * MAX_WRITE  # a second region once the first was used up
        del harness.writes[:fuse_loop.SLOTS]
        assert arena.used == fuse_loop.SLOTS * MAX_WRITE  # no WRITE holds the first: it is back

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


def test_with_the_arena_full_every_write_is_copied_out_and_the_buffer_serves_the_next_request():
    """No arena: a WRITE's bytes are copied out into a bytes of their size
    (a large one no longer pins a whole request's buffer), and the loop reads
    the next request into the same buffer: none is overwritten."""
    harness = Harness(arena=None, max_write=2 * MiB)
    whole, part, small = os.urandom(2 * MiB), os.urandom(MiB + 4096), os.urandom(4 * KiB)

    async def checks() -> None:
        harness.send(write_request(5, 1, 0, whole))
        harness.send(write_request(6, 1, len(whole), part))
        harness.send(write_request(7, 1, len(whole) + len(part), small))
        harness.send(write_request(8, 1, 0, bytes(len(whole))))  # read after them: none is overwritten
        await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(4)] == [5, 6, 7, 8]

    harness.run(checks)
    (_, _, first), (_, _, second), (_, _, third), _ = harness.writes
    assert isinstance(first, bytes) and first == whole
    assert isinstance(second, bytes) and second == part
    assert isinstance(third, bytes) and third == small


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
    assert harness.writes[0][:2] == (2, 7)


def test_a_failed_write_is_answered_with_its_errno():
    harness = Harness(write_error=errno.ENOSPC)

    async def checks() -> None:
        harness.send(write_request(4, 1, 0, b"x" * 100))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size, -errno.ENOSPC, 4, b"")
        harness.send(write_request(5, 1, 0, b"x" * 100))  # the loop goes on
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[:3] == (OUT.size, -errno.ENOSPC, 5)

    harness.run(checks)


def test_a_write_cancelled_before_its_answer_is_answered_eio():
    harness = Harness()
    harness.operations.write_blocks = True

    async def main() -> None:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(harness.loop.run)
                harness.send(write_request(4, 1, 0, b"x" * 100))
                await trio.testing.wait_all_tasks_blocked()
                harness.assert_no_reply()  # its task waits
                nursery.cancel_scope.cancel()  # the mount stops

    try:
        trio.run(main)
        assert harness.reply() == (OUT.size, -errno.EIO, 4, b"")  # the kernel waits for no answer in vain
        assert harness.counts["write"] == 1
    finally:
        harness.ours.close()
        harness.kernel.close()


def test_the_kernel_wide_request_limit_is_raised_when_lower_and_never_lowered(tmp_path):
    from rapidmount.daemon import serve as daemon

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


@pytest.mark.parametrize("write_now_declines", [False, True], ids=["no-write-now", "write-now-declines"])
def test_while_large_writes_come_each_next_request_is_spliced_and_a_write_s_bytes_wait_in_its_pipe(
        write_now_declines):
    """A WRITE that ``write_now`` does not take becomes a task, as always."""
    arena = Arena(16 * MiB)
    pipes = WritePipes(2, MiB)
    write_now = _WriteNow(pipes, takes=False) if write_now_declines else None
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
    assert len(spliced) == 2 and all(isinstance(data, PipedWrite) for data in spliced)
    assert [bytes(first), *map(bytes, harness.operations.piped_views)] == pieces
    # Each next to the one before in the region, as if read there.
    offsets = [arena.offset_of(first), *map(arena.offset_of, harness.operations.piped_views)]
    assert offsets == [offsets[0] + n * HALF for n in range(3)]
    assert [data.arena_offset for data in spliced] == offsets[1:]
    assert harness.counts["write"] == 3 and harness.counts["write_at_once"] == harness.counts["write_by_worker"] == 0
    if write_now is not None:
        assert len(write_now.turns_seen) == 3  # asked first, each


def test_a_write_handed_to_a_worker_is_answered_by_it_not_by_the_loop():
    arena = Arena(16 * MiB)
    pipes = WritePipes(2, MiB)
    harness = Harness(arena=arena, pipes=pipes)
    harness.operations.piped = "hand"
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
    big, small, again = os.urandom(HALF), os.urandom(4 * KiB), os.urandom(HALF)

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, big))
        await trio.testing.wait_all_tasks_blocked()
        harness.send(getattr_request(3, nodeid=9))  # spliced: read whole from the pipe, and served
        await trio.testing.wait_all_tasks_blocked()
        harness.send(write_request(2, 5, HALF, again))  # read from the device again
        await trio.testing.wait_all_tasks_blocked()
        harness.send(write_request(4, 5, 2 * HALF, small))  # spliced (after a large WRITE), read whole
        await trio.testing.wait_all_tasks_blocked()
        assert [harness.reply()[2] for _ in range(4)] == [1, 3, 2, 4]
        assert pipes.take() is not None  # the pipe is empty again

    harness.run(checks)
    ((header, body),) = harness.served
    assert (header.opcode, header.unique, header.nodeid) == (Op.GETATTR, 3, 9)
    assert isinstance(body, codec.Getattr)
    assert [bytes(data) for _, _, data in harness.writes] == [big, again, small]
    assert isinstance(harness.writes[1][2], memoryview)  # not spliced: a PipedWrite else
    assert isinstance(harness.writes[2][2], bytes)


def test_a_spliced_write_that_fails_is_answered_with_its_errno_and_its_pipe_is_emptied():
    arena = Arena(16 * MiB)
    pipes = WritePipes(1, MiB)
    harness = Harness(arena=arena, pipes=pipes)

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 1
        harness.operations.write_error = errno.ENOSPC
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
    harness.operations.piped = "hand, then fail"

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply()[2] == 1
        harness.send(write_request(2, 5, HALF, os.urandom(HALF)))
        await trio.testing.wait_all_tasks_blocked()
        harness.assert_no_reply()
        assert pipes.take() is None  # its bytes are left in the pipe for the worker

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


def test_a_small_write_is_never_offered_to_write_now():
    write_now = _WriteNow(None)
    harness = Harness(arena=Arena(16 * MiB), write_now=write_now)

    async def checks() -> None:
        harness.send(write_request(1, 5, 0, b"s" * 100))
        await trio.testing.wait_all_tasks_blocked()
        assert harness.reply() == (OUT.size + 8, 0, 1, struct.pack("<II", 100, 0))

    harness.run(checks)
    assert write_now.turns_seen == [] and [bytes(data) for _, _, data in harness.writes] == [b"s" * 100]
    assert harness.counts["write"] == 1 and harness.counts["write_at_once"] == 0


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
    monkeypatch.setattr(fuse_loop, "TURN_AFTER", 2)  # a queue that fits the socket's buffer
    arena = Arena(16 * MiB)
    write_now = _WriteNow(None)
    harness = Harness(arena=arena, write_now=write_now)
    count = 2 * fuse_loop.TURN_AFTER + 1

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
    assert len(set(seen)) >= count // fuse_loop.TURN_AFTER
    assert all(seen[n] == seen[n - 1] for n in range(1, count) if n % fuse_loop.TURN_AFTER)


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
    assert bytes(harness.operations.piped_views[0]) == pieces[1]
