"""Appends whose bytes stay in this process (the FUSE process's side of the
data plane, driven from trio against the emulator): the worker reads large
writes straight from here with process_vm_readv, small ones go through the
arena, in order; where a worker cannot read here, everything goes through
the arena; a worker killed mid-append loses nothing, whichever kind of
worker takes the object over."""

from __future__ import annotations

import os
import random
import signal

import pytest

from rapidmount.shared.peer_memory import DISABLE_ENV
from rapidmount.dataplane.pool import WorkerConnection
from rapidmount.dataplane.append_pieces import APPEND_PIECE, HELD_APPEND_PIECE, PEER_WRITE_MIN
from tests.conftest import ZONAL_BUCKET
from tests.workerstore import make_worker_store, run_with_workers

MiB = 1 << 20


def _count_appends(monkeypatch) -> dict[str, int]:
    """How many calls of each append op reach the workers."""
    ops: dict[str, int] = {}
    call, call_soon = WorkerConnection.call, WorkerConnection.call_soon

    async def counting_call(self, op, args, **kwargs):
        ops[op] = ops.get(op, 0) + 1
        return await call(self, op, args, **kwargs)

    async def counting_call_soon(self, op, args, on_answer, **kwargs):
        ops[op] = ops.get(op, 0) + 1
        return await call_soon(self, op, args, on_answer, **kwargs)

    monkeypatch.setattr(WorkerConnection, "call", counting_call)
    monkeypatch.setattr(WorkerConnection, "call_soon", counting_call_soon)
    return ops


def _writes(seed: int) -> list[bytes]:
    """Large and small writes mixed, around the threshold and the piece size."""
    rng = random.Random(seed)
    sizes = [MiB, 10_000, 3 * MiB + 5, 100, PEER_WRITE_MIN, PEER_WRITE_MIN - 1, APPEND_PIECE - 7, 1, MiB + 1,
             *(rng.choice((rng.randrange(1, PEER_WRITE_MIN), rng.randrange(PEER_WRITE_MIN, 3 * MiB)))
               for _ in range(20))]
    return [rng.randbytes(size) for size in sizes]


def test_large_writes_are_read_from_this_process_and_small_ones_copied_in_order(emulator, monkeypatch):
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)
    writes = _writes(1)
    ops = _count_appends(monkeypatch)

    async def main():
        assert store.pool.live()[0].reads_our_memory
        appender = store.open_appender("mixed.bin")
        await appender.create()
        for data in writes:
            await appender.append(data)
        assert await appender.flush() == sum(map(len, writes))
        assert not appender._retained and store.arena.used == 0  # every byte confirmed: nothing kept
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "mixed.bin") == b"".join(writes)
    assert ops.get("append_peer", 0) >= 8 and ops.get("append", 0) >= 5


@pytest.mark.parametrize(("write_buffer", "piece"), [(32 * MiB, HELD_APPEND_PIECE), (8 * MiB, APPEND_PIECE)])
def test_held_writes_go_to_the_worker_in_pieces_of_a_quarter_of_the_write_buffer(emulator, monkeypatch,
                                                                                  write_buffer, piece):
    """One call and one answer per held piece, not per message of the stream:
    8 MiB at most, a quarter of --write-buffer (never under one message)."""
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1, write_buffer=write_buffer)
    writes = [random.Random(index).randbytes(MiB) for index in range(24)]
    ops = _count_appends(monkeypatch)

    async def main():
        appender = store.open_appender("pieces.bin")
        await appender.create()
        for data in writes:
            await appender.append(data)
        assert await appender.flush() == 24 * MiB
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "pieces.bin") == b"".join(writes)
    assert ops.get("append_peer", 0) == 24 * MiB // piece


def test_appends_go_through_the_arena_where_workers_cannot_read_this_process(emulator, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")  # as a worker refused by Yama, seccomp or a non-dumpable parent
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)
    writes = _writes(2)
    ops = _count_appends(monkeypatch)

    async def main():
        connection = store.pool.live()[0]
        assert not connection.reads_our_memory and DISABLE_ENV in connection.peer_refusal
        appender = store.open_appender("arena.bin")
        await appender.create()
        for data in writes:
            await appender.append(data)
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "arena.bin") == b"".join(writes)
    assert "append_peer" not in ops


def test_a_worker_killed_mid_append_loses_no_held_byte(emulator):
    """SIGKILL of the worker in the middle of a large append, between flushes:
    another takes the object over at its persisted size and reads the rest
    again from this process, which kept it."""
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2)
    writes = [os.urandom(MiB + 333) for _ in range(40)]

    async def main():
        appender = store.open_appender("killed.bin")
        await appender.create()
        for index, data in enumerate(writes):
            await appender.append(data)
            if index in (9, 25):
                os.kill(appender._connection.pid, signal.SIGKILL)
        assert await appender.flush() == sum(map(len, writes))
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "killed.bin") == b"".join(writes)
    assert store.stream_events.write["reconnect"] >= 2


def test_held_bytes_are_sent_as_a_copy_to_a_worker_that_cannot_read_them(emulator, monkeypatch):
    """The worker that takes the object over cannot read this process (its
    replacement started where reads are refused): what it resends, and what
    comes after, reaches it in the message, exactly."""
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)
    writes = [os.urandom(MiB + 77) for _ in range(16)]

    async def main():
        appender = store.open_appender("moved.bin")
        await appender.create()
        for index, data in enumerate(writes):
            await appender.append(data)
            if index == 6:
                assert appender._connection.reads_our_memory
                monkeypatch.setenv(DISABLE_ENV, "1")  # the replacement starts with it
                os.kill(appender._connection.pid, signal.SIGKILL)
        assert await appender.flush() == sum(map(len, writes))
        assert not appender._connection.reads_our_memory
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "moved.bin") == b"".join(writes)
