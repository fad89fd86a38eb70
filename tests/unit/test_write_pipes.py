"""The pipes a large WRITE's bytes travel in, from /dev/fuse to a worker:
which pipe is free, where the bytes land when a worker is lost part-way,
and the worker's side, which reads them and answers the WRITE."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import socket
import struct
import types

import pytest
import trio
import trio.testing

from rapidmount.workers import write_fills
from rapidmount.fuse import write_pipes as write_pipes_module
from rapidmount.shared import sysctl
from rapidmount.shared.messages import FILL, NOTICE
from rapidmount.shared.fuse_codec import reply_write as write_reply
from rapidmount.dataplane.pool import WorkerPool
from rapidmount.workers.worker import Worker
from rapidmount.fuse.write_pipes import (F_SETPIPE_SZ, HANDED, LANDED, PENDING, PipedWrite, WritePipes, open_write_pipes,
                                              pipe_capacity)
from rapidmount.shared.views import landed

KiB, MiB = 1 << 10, 1 << 20
#: Within the kernel's default fs.pipe-max-size (1 MiB): no limit to raise.
CAPACITY = 1 * MiB


def spliced(pipes: WritePipes, data: bytes, unique: int = 7) -> tuple[PipedWrite, bytearray]:
    """A WRITE's bytes put into a free pipe, as the kernel's splice would, and the region they go to."""
    pipe = pipes.take()
    assert pipe is not None
    os.write(pipe.write_fd, data)
    region = bytearray(len(data))
    return PipedWrite(pipe, memoryview(region), 4096, unique), region


def test_a_pipe_holds_the_pages_of_the_largest_write_and_its_headers():
    assert pipe_capacity(1 * MiB) == 2 * MiB  # 256 pages, one more unaligned, one of headers: 512 slots
    assert pipe_capacity(4 * MiB) == 8 * MiB
    assert pipe_capacity(512 * KiB) == 1 * MiB


def test_only_an_empty_pipe_is_taken_whoever_emptied_it():
    pipes = WritePipes(2, CAPACITY)
    try:
        first, _ = spliced(pipes, b"a" * 1000)
        second, _ = spliced(pipes, b"b" * 1000)
        assert pipes.take() is None  # both hold a WRITE's bytes
        os.read(second.pipe.read_fd, 1000)  # its worker read them
        assert pipes.take() is second.pipe
        assert first.land() is first.view and first.state == LANDED and bytes(first.view) == b"a" * 1000
        assert pipes.take() is first.pipe
    finally:
        pipes.close()


def test_landing_reads_the_bytes_once_and_an_arriving_write_lands_for_whoever_needs_its_bytes():
    pipes = WritePipes(1, CAPACITY)
    try:
        data = os.urandom(300 * KiB)
        write, region = spliced(pipes, data)
        assert len(write) == len(data) and write.state == PENDING
        assert bytes(landed(write)) == data and bytes(region) == data
        assert write.land() is write.view  # a second time reads nothing
        assert landed(b"abc") == b"abc"
    finally:
        pipes.close()


@pytest.mark.parametrize("taken_by_worker", [0, 4096, 100_000, 300 * KiB])
def test_a_lost_worker_s_write_gets_the_rest_of_its_bytes_here_an_answer_and_a_new_pipe(taken_by_worker):
    pipes = WritePipes(2, CAPACITY)
    try:
        data = os.urandom(300 * KiB)
        write, region = spliced(pipes, data, unique=41)
        worker = object()
        pipes.handed(write, worker)
        assert write.state == HANDED
        # The worker read the first bytes into the start of the region, then died.
        region[:taken_by_worker] = os.read(write.pipe.read_fd, taken_by_worker) if taken_by_worker else b""
        old = write.pipe
        replaced: list[tuple[int, int]] = []
        pipes.on_replaced = lambda pipe_id, fd: replaced.append((pipe_id, fd))  # for the workers running
        answers: list[tuple[int, int]] = []
        pipes.lost(worker, lambda unique, result: answers.append((unique, result)))
        assert bytes(region) == data
        assert answers == [(41, len(data))]
        assert old not in pipes.pipes and len(pipes.pipes) == 2  # replaced: the old one may still be read
        assert {p.id for p in pipes.pipes}.isdisjoint({old.id})
        assert replaced == [(p.id, p.read_fd) for p in pipes.pipes if p.id > 2]
        assert pipes.landed_here == len(data) - taken_by_worker
        pipes.lost(worker, lambda unique, result: answers.append((unique, result)))
        assert len(answers) == 1  # once
    finally:
        pipes.close()


def test_a_worker_lost_as_the_mount_stops_has_its_writes_landed_and_answered_and_no_pipe_replaced(caplog):
    pipes = WritePipes(1, CAPACITY)
    try:
        data = os.urandom(300 * KiB)
        write, region = spliced(pipes, data, unique=7)
        worker = object()
        pipes.handed(write, worker)
        old = write.pipe
        answers: list[tuple[int, int]] = []
        with caplog.at_level(logging.INFO, logger="rapidmount"):
            pipes.lost(worker, lambda unique, result: answers.append((unique, result)), replace=False)
        assert bytes(region) == data and answers == [(7, len(data))]
        assert pipes.pipes == [old] and old.empty
        assert "replaced" not in caplog.text
    finally:
        pipes.close()


def test_a_lost_worker_s_write_whose_pipe_went_on_to_another_is_only_answered_again():
    pipes = WritePipes(1, CAPACITY)
    try:
        write, region = spliced(pipes, b"x" * 8192, unique=5)
        worker = object()
        pipes.handed(write, worker)
        region[:] = os.read(write.pipe.read_fd, 8192)  # the worker took them, then answered
        later, later_region = spliced(pipes, b"y" * 8192, unique=6)  # the pipe's next WRITE, another worker's
        answers: list[tuple[int, int]] = []
        pipes.lost(worker, lambda unique, result: answers.append((unique, result)))
        assert answers == [(5, 8192)]  # the kernel refuses an answer to an answered WRITE
        assert later.pipe in pipes.pipes and later.land() and bytes(later_region) == b"y" * 8192
    finally:
        pipes.close()


def _limited_by(monkeypatch, knob) -> None:
    """Pipes sized as if this process lacked CAP_SYS_RESOURCE, under the limit in ``knob``."""
    real = write_pipes_module.set_pipe_size

    def set_pipe_size(fd: int, size: int) -> None:
        if size > int(knob.read_text()):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real(fd, size)

    monkeypatch.setattr(write_pipes_module, "set_pipe_size", set_pipe_size)


def test_pipes_are_made_within_the_limit_which_is_raised_when_lower_and_never_lowered(tmp_path, monkeypatch):
    knob = tmp_path / "pipe-max-size"
    _limited_by(monkeypatch, knob)
    knob.write_text("65536\n")
    pipes, why = open_write_pipes(1, 512 * KiB, str(knob))
    assert pipes is not None and why == "" and knob.read_text() == f"{CAPACITY}\n"
    pipes.close()
    knob.write_text(f"{64 * MiB}\n")
    pipes, _ = open_write_pipes(1, 512 * KiB, str(knob))
    assert pipes is not None and knob.read_text() == f"{64 * MiB}\n"
    pipes.close()
    assert open_write_pipes(0, MiB, str(knob)) == (None, "--write-pipes 0")


def test_a_pipe_the_process_may_make_leaves_the_limit_as_it_is(tmp_path):
    knob = tmp_path / "pipe-max-size"
    knob.write_text("65536\n")  # below what is asked, but not what this process is held to
    pipes, why = open_write_pipes(1, 512 * KiB, str(knob))
    assert pipes is not None and why == "" and knob.read_text() == "65536\n"
    pipes.close()


def test_without_room_to_raise_the_limit_writes_stay_in_the_fuse_process(tmp_path, monkeypatch):
    knob = tmp_path / "pipe-max-size"
    knob.write_text("65536\n")
    _limited_by(monkeypatch, knob)
    real_open = open

    def open_(path, mode="r", *args, **kwargs):
        if "w" in mode:
            raise PermissionError(errno.EACCES, "Permission denied")  # not root
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(sysctl, "open", open_, raising=False)
    pipes, why = open_write_pipes(1, MiB, str(knob))
    assert pipes is None
    assert why == ("a pipe for a WRITE of 1024 KiB needs 2048 KiB, and fs.pipe-max-size (64 KiB) could not be "
                   "raised (Permission denied)")
    assert knob.read_text() == "65536\n"


# -- the worker's side ------------------------------------------------------------------------------


class _Arena:
    def __init__(self, size: int) -> None:
        self.buffer = bytearray(size)

    def view(self, offset: int, length: int) -> memoryview:
        return memoryview(self.buffer)[offset:offset + length]


class _Pages:
    def __init__(self, device: int | None) -> None:
        self.device = device


def _worker(pipe_fd: int, device: int | None) -> tuple[Worker, list]:
    worker = object.__new__(Worker)  # no client, no sockets: only the fill is under test
    sent: list = []
    worker.send = sent.append  # type: ignore[method-assign]
    worker.arena = _Arena(1 * MiB)  # type: ignore[assignment]
    worker.pages = _Pages(device)  # type: ignore[assignment]
    worker.write_pipes = {3: pipe_fd}
    return worker, sent


class _Writer:
    """An appendable writer that records what it was given, as bytes at that moment."""

    generation, persisted_size = 1, 0

    def __init__(self) -> None:
        self.appended: list[bytes] = []

    async def append(self, data) -> None:
        self.appended.append(bytes(data))


def test_the_fill_thread_reads_a_write_s_bytes_and_answers_it_and_an_append_of_them_waits_for_it():
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK)
    fcntl.fcntl(write_fd, F_SETPIPE_SZ, CAPACITY)
    kernel, device = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    data = os.urandom(200 * KiB)

    async def main() -> list[bytes]:
        worker, sent = _worker(read_fd, device.fileno())
        worker.fills_done, worker._fill_waiting, worker._fill_futures, worker._gates = 0, False, [], {}
        writer = _Writer()
        worker.appenders = {1: writer}
        worker.start_fills(theirs)
        # The append of the bytes comes first (another socket): it waits for their fill.
        append = asyncio.ensure_future(worker.op_append_arena(1, [(8192, len(data))], 1))
        await asyncio.sleep(0.05)
        assert not append.done() and writer.appended == []
        os.write(write_fd, data)
        ours.send(FILL.pack(3, len(data), 8192, 99))
        assert await asyncio.wait_for(append, 10) == (None, 1, 0)
        assert sent == []
        return writer.appended

    try:
        assert asyncio.run(main()) == [data]
        answer = kernel.recv(100)
        assert answer == write_reply(99, len(data))
        assert struct.unpack("<IiQII", answer) == (24, 0, 99, len(data), 0)
        ours.close()  # the mount gives the worker up: its fill thread ends
    finally:
        for fd in (read_fd, write_fd):
            os.close(fd)
        for sock in (kernel, device, ours, theirs):
            sock.close()


def test_a_later_call_on_the_stream_waits_for_an_append_that_waits_for_its_fill():
    """A flush sent after an append whose bytes are still being read from a
    pipe must not overtake it: the append is taken first."""
    calls: list[str] = []

    class Writer(_Writer):
        async def append(self, data) -> None:
            calls.append("append")

        async def flush(self) -> None:
            calls.append("flush")

    async def main() -> None:
        worker, _ = _worker(-1, None)
        worker.fills_done, worker._fill_waiting, worker._fill_futures, worker._gates = 0, False, [], {}
        worker.appenders = {1: Writer()}
        append = asyncio.ensure_future(worker.op_append_arena(1, [(0, 4096)], 1))
        flush = asyncio.ensure_future(worker.op_appender(1, "name", "flush", (), {}))
        other = asyncio.ensure_future(worker.op_append_arena(1, [(4096, 4096)], 0))
        await asyncio.sleep(0.02)
        assert calls == [] and not flush.done() and not other.done()
        worker.fills_done = 1  # what the fill thread does, then it wakes the loop
        for future in worker._fill_futures:
            future.set_result(None)
        await asyncio.wait_for(asyncio.gather(append, flush, other), 10)
        assert worker._gates == {}

    asyncio.run(main())
    assert calls == ["append", "flush", "append"]


def test_a_worker_without_dev_fuse_asks_the_mount_to_answer():
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK)
    try:
        os.write(write_fd, b"z" * 4096)
        worker, sent = _worker(read_fd, None)
        worker.fill(3, 0, 4096, 12)
        assert bytes(worker.arena.view(0, 4096)) == b"z" * 4096
        assert sent == [(NOTICE, "write_unanswered", (12, 4096))]
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_worker_that_cannot_have_all_of_a_write_s_bytes_stops_so_the_mount_takes_them(monkeypatch):
    read_fd, write_fd = os.pipe2(os.O_NONBLOCK)
    exits: list[int] = []

    def exit_(status: int) -> None:
        exits.append(status)
        raise SystemExit(status)

    monkeypatch.setattr(write_fills.os, "_exit", exit_)
    try:
        os.write(write_fd, b"z" * 100)  # fewer than the WRITE's: the mount took the rest
        worker, sent = _worker(read_fd, None)
        with pytest.raises(SystemExit):
            worker.fill(3, 0, 4096, 12)
        assert exits == [write_fills.EXIT_UNFILLED] and sent == []
        with pytest.raises(SystemExit):
            worker.fill(4, 0, 4096, 13)  # a pipe it does not hold
    finally:
        os.close(read_fd)
        os.close(write_fd)


class _Connection:
    def __init__(self, alive: bool) -> None:
        self.alive = alive


def test_a_stream_leaving_a_live_worker_waits_until_it_has_read_every_write_handed_to_it():
    pipes = WritePipes(2, CAPACITY)
    connection = _Connection(alive=True)
    pool = types.SimpleNamespace(write_pipes=pipes, answer_write=lambda unique, result: None)
    data = os.urandom(64 * KiB)
    write, region = spliced(pipes, data)
    pipes.handed(write, connection)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            settled = trio.Event()

            async def settle() -> None:
                await WorkerPool.fills_settled(pool, connection)  # type: ignore[arg-type]
                settled.set()

            nursery.start_soon(settle)
            await trio.sleep(0.05)
            assert not settled.is_set()  # the worker has not read them yet
            region[:] = os.read(write.pipe.read_fd, len(data))  # now it has
            with trio.fail_after(5):
                await settled.wait()

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))  # its polls take no real time
        assert bytes(region) == data and pipes.landed_here == 0
    finally:
        pipes.close()


def test_a_stream_leaving_a_worker_given_up_has_its_writes_read_here_and_answered():
    pipes = WritePipes(2, CAPACITY)
    connection = _Connection(alive=False)  # closed; its loss not yet handled
    answers: list[tuple[int, int]] = []
    pool = types.SimpleNamespace(write_pipes=pipes, answer_write=lambda unique, result: answers.append((unique, result)))
    data = os.urandom(64 * KiB)
    write, region = spliced(pipes, data, unique=8)
    pipes.handed(write, connection)
    try:
        trio.run(WorkerPool.fills_settled, pool, connection)
        assert bytes(region) == data and answers == [(8, len(data))]
    finally:
        pipes.close()


def test_bytes_a_running_worker_took_between_the_look_and_the_read_are_its(monkeypatch):
    pipes = WritePipes(1, CAPACITY)
    try:
        write, region = spliced(pipes, b"w" * 8192)
        region[:] = b"w" * 8192  # what the worker's read put there
        real_readv = os.readv

        def readv(fd, buffers):
            real_readv(fd, [bytearray(8192)])  # the worker's read, just before ours
            raise BlockingIOError(errno.EAGAIN, "empty")

        monkeypatch.setattr(write_pipes_module.os, "readv", readv)
        assert write.complete() == 0
        assert bytes(region) == b"w" * 8192
    finally:
        pipes.close()
