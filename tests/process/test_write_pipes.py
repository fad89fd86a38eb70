"""WRITEs whose bytes wait in pipes, handed to real worker processes (the
FUSE process's side of the data plane, driven from trio against the
emulator, without FUSE): the worker's fill thread reads them into the
arena before the stream appends them; a worker killed or drained while it
holds some loses no byte."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import trio

from rapidmount.fuse.write_pipes import HANDED, LANDED, PENDING, PipedWrite, WritePipes
from tests.conftest import ZONAL_BUCKET
from tests.workerstore import make_worker_store, run_with_workers

KiB, MiB = 1 << 10, 1 << 20
#: Within the kernel's default fs.pipe-max-size (1 MiB): no limit to raise.
SIZE = 512 * KiB


def _store_with_pipes(emulator) -> tuple[WritePipes, object]:
    """Two workers that hold two pipes."""
    pipes = WritePipes(2, MiB)
    return pipes, make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, write_pipes=pipes)


def _piped(store, pipes: WritePipes, data: bytes, unique: int) -> PipedWrite:
    """A WRITE as the request loop makes it: its region at the arena's cursor, its bytes in a pipe."""
    pipe = pipes.take()
    assert pipe is not None, "every pipe is still full"
    assert os.write(pipe.write_fd, data) == len(data)
    allocated = store.arena.allocate(len(data))
    assert allocated is not None
    offset, view = allocated
    return PipedWrite(pipe, view, offset, unique)


def _run(store, pipes: WritePipes, main, emulator, name: str) -> bytes:
    """Run ``main`` with the store's workers, then close the pipes; the object ``name`` it wrote."""
    try:
        run_with_workers(store, main)
    finally:
        pipes.close()
    return emulator.read_object(ZONAL_BUCKET, name)


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and return once every thread of it has stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().rpartition(")")[2].split()[0])
        if states and all(state in "tT" for state in states):
            return
        time.sleep(0.001)
    raise AssertionError(f"worker {pid} did not stop")


async def _read_by_worker(pipes: WritePipes, write: PipedWrite) -> None:
    """Wait as the kernel's writer would for its answer: until the worker took
    the bytes (or, the worker lost, this process did and replaced the pipe)."""
    with trio.fail_after(10):
        while write.pipe in pipes.pipes and not write.pipe.empty:
            await trio.sleep(0.001)


def test_a_worker_reads_handed_writes_into_the_arena_and_a_stream_that_leaves_it_waits_for_them(emulator):
    """Its worker stopped (SIGSTOP) with a WRITE handed to it and then drained:
    the stream moves to another worker only once the stopped one, continued,
    has read that WRITE's bytes, and the object comes out whole."""
    pipes, store = _store_with_pipes(emulator)
    writes = [os.urandom(SIZE) for _ in range(12)]

    async def main():
        appender = store.open_appender("piped.bin")
        await appender.create()
        for index, data in enumerate(writes[:6]):
            write = _piped(store, pipes, data, index + 1)
            await appender.append(write)
            assert write.state == HANDED
            await _read_by_worker(pipes, write)
        old = appender._connection
        with trio.fail_after(10):  # a stream leaves a draining worker with no append unanswered
            while appender._unanswered:
                await trio.sleep(0.001)
        _stop(old.pid)
        write = _piped(store, pipes, writes[6], 7)
        await appender.append(write)  # handed to the stopped worker: its bytes stay in the pipe
        assert write.state == HANDED and not write.pipe.empty
        old.drain()

        async def carry_on():
            await trio.sleep(2)  # long enough for the stream to have moved, had it not waited
            with contextlib.suppress(ProcessLookupError):  # stopped by the pool meanwhile: then it was lost
                os.kill(old.pid, signal.SIGCONT)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(carry_on)
            await appender.flush()  # the stream leaves the draining worker once it read that WRITE
        assert appender._connection is not old
        for index, data in enumerate(writes[7:], start=7):
            write = _piped(store, pipes, data, index + 1)
            await appender.append(write)
            await _read_by_worker(pipes, write)
        assert await appender.flush() == sum(map(len, writes))
        await appender.close()

    assert _run(store, pipes, main, emulator, "piped.bin") == b"".join(writes)


def test_a_worker_killed_holding_a_handed_write_loses_no_byte(emulator):
    pipes, store = _store_with_pipes(emulator)
    writes = [os.urandom(SIZE) for _ in range(10)]

    async def main():
        appender = store.open_appender("piped-killed.bin")
        await appender.create()
        for index, data in enumerate(writes):
            if index == 4:
                _stop(appender._connection.pid)  # it will never read the next one
            write = _piped(store, pipes, data, index + 1)
            await appender.append(write)
            if index == 4:
                assert write.state == HANDED and not write.pipe.empty
                os.kill(appender._connection.pid, signal.SIGKILL)
            else:
                await _read_by_worker(pipes, write)
        assert await appender.flush() == sum(map(len, writes))
        await appender.close()
        assert pipes.landed_here >= SIZE  # read here after the worker was lost (the next one too, if sent first)
        # Its pipes were replaced; every worker serving now holds the new ones.
        with trio.fail_after(10):
            while not all({pipe.id for pipe in pipes.pipes} <= connection.pipe_ids
                          for connection in store.pool._slots if connection is not None):
                await trio.sleep(0.01)

    assert _run(store, pipes, main, emulator, "piped-killed.bin") == b"".join(writes)
    assert store.stream_events.write["reconnect"] >= 1


def test_a_write_for_a_worker_that_does_not_hold_its_pipe_is_read_here(emulator):
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)
    pipes = WritePipes(1, MiB)  # made after the worker started: it does not hold it
    data = os.urandom(SIZE)

    async def main():
        appender = store.open_appender("piped-here.bin")
        await appender.create()
        write = _piped(store, pipes, data, 1)
        await appender.append(write)
        assert write.state == LANDED and write.pipe.empty
        await appender.close()

    assert _run(store, pipes, main, emulator, "piped-here.bin") == data


def test_appends_that_need_no_wait_are_handed_at_once_and_a_full_piece_is_sent(emulator):
    """``append_now`` hands a WRITE to the stream's worker without a wait
    while its piece has room, and sends the piece the WRITE fills; one while
    another call holds the stream, or while another frame is part-way out to
    the worker, is left as it was for ``append``. The object comes out whole."""
    pipes, store = _store_with_pipes(emulator)  # 8 MiB --write-buffer: pieces of 2 MiB, four WRITEs
    writes = [os.urandom(SIZE) for _ in range(11)]

    async def main():
        appender = store.open_appender("at-once.bin")
        await appender.create()
        taken, unanswered = [], []
        for index, data in enumerate(writes):
            write = _piped(store, pipes, data, index + 1)
            if index == 9:
                async with appender._lock:  # a flush, say, under way
                    taken.append(appender.append_now(write))
            elif index == 10:
                await appender._connection._send_lock.acquire()  # another call's frame part-way out
                taken.append(appender.append_now(write))
                appender._connection._send_lock.release()
            else:
                taken.append(appender.append_now(write))
            unanswered.append(appender._unanswered)
            if taken[-1]:
                assert write.state == HANDED
            else:
                assert write.state == PENDING and not write.pipe.empty  # untouched
                await appender.append(write)
            await _read_by_worker(pipes, write)
        assert taken == [True] * 9 + [False, False]
        assert appender._piece is None or appender._piece.filled < appender._held_capacity
        assert unanswered[3] >= 1 and unanswered[7] >= 1  # the 4th and 8th filled a piece, sent at once
        # A draining worker is left by the next call that may: nothing more goes to it at once.
        extra = os.urandom(SIZE)
        write = _piped(store, pipes, extra, len(writes) + 1)
        appender._connection.draining = True
        assert not appender.append_now(write) and write.state == PENDING
        appender._connection.draining = False
        await appender.append(write)
        await _read_by_worker(pipes, write)
        writes.append(extra)
        assert await appender.flush() == sum(map(len, writes))
        await appender.close()

    assert _run(store, pipes, main, emulator, "at-once.bin") == b"".join(writes)


@pytest.mark.parametrize("socket_takes", ["nothing", "one byte"])
def test_a_piece_call_the_socket_does_not_take_whole_loses_no_byte(emulator, socket_takes):
    """The WRITE that fills a piece is taken at once whatever the worker's
    socket does with the piece's call. Full (it takes nothing): the piece
    stays, and the next append sends it before any later byte. A part (a
    unix socket takes a frame this small whole or not at all; were it ever
    to take part of one, the worker would read garbage): the worker is
    given up, and the stream's bytes are sent again to another."""
    pipes, store = _store_with_pipes(emulator)
    writes = [os.urandom(SIZE) for _ in range(8)]
    name = f"socket-takes-{socket_takes.replace(' ', '-')}.bin"
    full = socket_takes == "nothing"

    async def main():
        appender = store.open_appender(name)
        await appender.create()
        old = appender._connection
        real = old._send_some
        for index, data in enumerate(writes):
            write = _piped(store, pipes, data, index + 1)
            if index == 3:
                old._send_some = (lambda frame: 0) if full else (lambda frame: real(frame[:1]) and 1)
                assert appender.append_now(write)
                del old._send_some
                if full:
                    assert appender._piece.filled == appender._held_capacity and not appender._unanswered
                else:
                    assert not old.alive and appender._lost is old
            elif index == 4 and full:
                assert not appender.append_now(write)  # the full piece must go first
                await appender.append(write)
                assert appender._piece is not None and appender._piece.filled == SIZE
            else:
                await appender.append(write)
            await _read_by_worker(pipes, write)
        assert await appender.flush() == sum(map(len, writes))
        assert (appender._connection is old) == full
        await appender.close()

    assert _run(store, pipes, main, emulator, name) == b"".join(writes)
    assert (store.stream_events.write["reconnect"] >= 1) != full
