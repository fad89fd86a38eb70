"""The data plane with real worker processes against the emulator: several
streams per file spread over workers, reads and appends that survive a
worker killed with SIGKILL, and the arena's byte budget."""

from __future__ import annotations

import errno
import os
import signal

import pytest
import trio

from rapidmount.storage.errors import StorageError
from rapidmount.storage.seam import ObjectReader
from tests.conftest import FLAT_BUCKET, ZONAL_BUCKET
from tests.workerstore import make_worker_store, run_with_workers

MiB = 1 << 20


async def read_blocks(reader, size: int, block: int, at_once: int, out: bytearray, on_block=None) -> None:
    """Read ``size`` bytes in ``block`` ranges, ``at_once`` in flight, as readahead does."""
    offsets = iter(range(0, size, block))

    async def one_at_a_time():
        for offset in offsets:
            data = await reader.read(offset, block)
            out[offset:offset + len(data)] = data
            if on_block is not None:
                await on_block(offset)

    async with trio.open_nursery() as nursery:
        for _ in range(at_once):
            nursery.start_soon(one_at_a_time)


def read_whole(store, name: str, generation: int, size: int, *, block: int = 2 * MiB, at_once: int = 8,
               on_block=None) -> bytes:
    out = bytearray(size)

    async def main():
        reader = store.open_reader(name, generation)
        assert isinstance(reader, ObjectReader) and reader.idle
        await read_blocks(reader, size, block, at_once, out, on_block)
        assert reader.stream_open
        streams = reader.streams
        await reader.close()
        assert not reader.stream_open
        return streams

    streams = run_with_workers(store, main)
    return bytes(out), streams


def test_streams_are_added_by_load_on_several_workers_with_the_first_read_handle(emulator):
    data = os.urandom(24 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "big.bin", data)
    emulator.set_stream_bandwidth(40_000_000)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, read_streams=4)
    emulator.reset_rpc_counts()
    got, streams = read_whole(store, "big.bin", generation, len(data))
    assert got == data
    assert streams == 4 and store.stream_events.read["open"] == 4
    assert store.stream_events.read["reconnect"] == 0
    # The first stream opens without a handle; the three others reuse the one it was given.
    assert emulator.rpc_counts.get("BidiReadObject with read_handle", 0) == 3


def test_one_range_at_a_time_keeps_one_stream(emulator):
    data = os.urandom(8 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "one.bin", data)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, read_streams=4)
    got, streams = read_whole(store, "one.bin", generation, len(data), block=MiB, at_once=1)
    assert got == data and streams == 1


def test_a_broken_stream_among_several_resumes_with_exact_bytes(emulator):
    data = os.urandom(16 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "broken.bin", data)
    emulator.set_stream_bandwidth(40_000_000)
    emulator.add_fault("broken-read:after=3000000")
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, read_streams=4)
    got, _ = read_whole(store, "broken.bin", generation, len(data))
    assert got == data
    assert store.stream_events.read["reconnect"] == 1


def test_a_replaced_generation_fails_every_range_with_estale(emulator):
    generation = emulator.seed(ZONAL_BUCKET, "gone.bin", b"x" * (4 * MiB))
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, read_streams=4)
    emulator.seed(ZONAL_BUCKET, "gone.bin", b"replaced")

    async def main():
        reader = store.open_reader("gone.bin", generation)
        results = []

        async def one(offset):
            try:
                await reader.read(offset, MiB)
            except StorageError as err:
                results.append(err.errno)

        async with trio.open_nursery() as nursery:
            for offset in range(0, 4 * MiB, MiB):
                nursery.start_soon(one, offset)
        assert results == [errno.ESTALE] * 4
        # Refused before any read handle came back: no second stream was made.
        assert reader.streams == 1
        await reader.close()

    run_with_workers(store, main)


def test_non_zonal_buckets_read_ranges_with_read_object(emulator):
    generation = emulator.seed(FLAT_BUCKET, "f", b"abcdef")
    store = make_worker_store(emulator.endpoint, FLAT_BUCKET)

    async def main():
        reader = store.open_reader("f", generation)
        assert bytes(await reader.read(1, 3)) == b"bcd"
        await reader.close()

    run_with_workers(store, main)
    assert emulator.rpc_counts.get("ReadObject", 0) == 1


def test_read_bytes_live_in_the_arena_and_return_to_it(emulator):
    data = os.urandom(4 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "arena.bin", data)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, arena_size=8 * MiB)

    async def main():
        reader = store.open_reader("arena.bin", generation)
        first = await reader.read(0, 2 * MiB)
        assert isinstance(first, memoryview) and bytes(first) == data[:2 * MiB]
        assert store.arena.used == 2 * MiB
        second = await reader.read(2 * MiB, 2 * MiB)
        assert store.arena.used == 4 * MiB
        del first
        assert store.arena.used == 2 * MiB  # freed with its last view
        # The arena full: the bytes cross the socket instead (still exact).
        third = await reader.read(0, 8 * MiB)
        assert bytes(third) == data and not isinstance(third, memoryview)
        assert bytes(second) == data[2 * MiB:]
        await reader.close()

    run_with_workers(store, main)


def _kill_one(store) -> int:
    pid = store.pool.live()[0].pid
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_worker_killed_during_a_read_loses_no_byte(emulator):
    """SIGKILL of a worker mid-read: its ranges are read again on the others, exactly."""
    data = os.urandom(64 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "kill.bin", data)
    emulator.set_stream_bandwidth(100_000_000)
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2, read_streams=4)
    killed = []

    async def kill_midway(offset):
        if offset >= 16 * MiB and not killed:
            killed.append(_kill_one(store))

    got, _ = read_whole(store, "kill.bin", generation, len(data), on_block=kill_midway)
    assert killed and got == data
    assert store.pool.replaced >= 1


def test_a_worker_killed_during_appends_keeps_every_flushed_byte(emulator):
    """SIGKILL of the worker holding an append stream: another takes the object
    over at its persisted size and sends the rest from the arena; every flush
    that succeeded stays, and the object is exactly what was appended."""
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=2)
    pieces = [os.urandom(700_000) for _ in range(24)]

    async def main():
        appender = store.open_appender("appended.log")
        await appender.create()
        flushed = 0
        for index, piece in enumerate(pieces):
            await appender.append(piece)
            if index % 5 == 4:
                flushed = await appender.flush()
                assert emulator.read_object(ZONAL_BUCKET, "appended.log")[:flushed] == b"".join(pieces)[:flushed]
            if index in (7, 16):
                os.kill(appender._connection.pid, signal.SIGKILL)
        assert await appender.flush() == sum(map(len, pieces))
        await appender.close()

    run_with_workers(store, main)
    assert emulator.read_object(ZONAL_BUCKET, "appended.log") == b"".join(pieces)
    assert store.stream_events.write["reconnect"] >= 2


def test_a_killed_worker_is_replaced_and_unary_calls_go_on(emulator):
    emulator.seed(ZONAL_BUCKET, "o", b"x")
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)

    async def main():
        first = store.pool.live()[0].pid
        os.kill(first, signal.SIGKILL)
        assert (await store.get_object("o")).size == 1  # waits for the replacement
        assert store.pool.live()[0].pid != first

    run_with_workers(store, main)
    assert store.pool.replaced == 1


def test_calls_fail_with_eio_when_no_worker_comes_back(emulator, monkeypatch):
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1, deadline=0.5)

    async def main():
        store.pool._stopping = True  # nothing restarts it
        os.kill(store.pool.live()[0].pid, signal.SIGKILL)
        with pytest.raises(StorageError) as caught:
            await store.get_object("o")
        assert caught.value.errno == errno.EIO

    run_with_workers(store, main)


def _streams_end(emulator, timeout: float = 5.0) -> dict[str, int]:
    """The streams still running at the service once they had ``timeout`` seconds to end."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        running = {method: count for method, count in emulator.running_calls.items() if method.startswith("Bidi")}
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def test_a_call_that_crosses_its_streams_close_opens_no_stream(emulator):
    """Found by R4: a read (or an appender's call) that reached the worker
    after its stream's close, the two having crossed on the way, opened a
    stream in the worker that nobody would close; also when the stream had
    served reads before its close."""
    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET, workers=1)

    async def main():
        connection = store.pool.live()[0]
        await connection.notify("close_reader", 999_999)
        with pytest.raises(StorageError) as caught:
            await connection.call("read", (999_999, ("o", 0, True, None, None), 0, 4096, None))
        assert caught.value.errno == errno.EBADF
        await connection.notify("forget_appender", 999_998)
        with pytest.raises(StorageError) as caught:
            await connection.call("appender", (999_998, "new", "create", (), {}))
        assert caught.value.errno == errno.EBADF
        data, _ = await connection.call("read", (999_997, ("o", 0, True, None, None), 0, 4096, None))
        assert len(data) == 4096  # other streams are not affected
        await connection.notify("close_reader", 999_997)
        # A read sent before that close, run after it: the stream is not opened again.
        with pytest.raises(StorageError) as caught:
            await connection.call("read", (999_997, ("o", 0, True, None, None), 4096, 4096, None))
        assert caught.value.errno == errno.EBADF
        assert await trio.to_thread.run_sync(_streams_end, emulator) == {}  # while the worker runs

    run_with_workers(store, main)


def test_a_stream_closed_while_it_opens_is_ended_at_the_service(emulator):
    """Found by R4: a read stream closed while it was being opened (its call
    started, waiting for the lock of its first message) stayed open at the
    service for good, as did an append stream cancelled before its first answer."""
    import asyncio

    from rapidmount.client.connect import connect
    from rapidmount.client.reader import BidiObjectReader
    from rapidmount.client.writer import AppendableWriter
    from rapidmount.storage.retry import RetryPolicy
    from tests.workerstore import worker_settings

    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        reader = BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=5), stall_timeout=10)
        async with reader._write_lock:  # the stream's first message waits here
            reading = asyncio.get_running_loop().create_task(reader.read(0, 4096))
            await asyncio.sleep(0.2)
            await reader.close()
        with pytest.raises(StorageError):
            await reading
        emulator.set_latency(2000)  # the first answer of the append stream comes late
        writer = AppendableWriter(client, "new", retry=RetryPolicy(deadline=5), buffer_limit=MiB, stall_timeout=10)
        creating = asyncio.get_running_loop().create_task(writer.create())
        await asyncio.sleep(0.5)
        creating.cancel()
        with pytest.raises(asyncio.CancelledError):
            await creating
        running = await asyncio.to_thread(_streams_end, emulator)
        await client.channel.close()
        return running

    assert asyncio.run(main()) == {}


def test_closing_a_read_stream_ends_it_even_if_a_cancellation_is_swallowed(emulator, monkeypatch):
    """Found by R4: Python 3.11's ``asyncio.wait_for`` can swallow a
    cancellation that lands with a message. The read stream's supervisor then
    went on waiting for the next message, close() waited on it for good, and
    the stream stayed open at the service."""
    import asyncio

    from rapidmount.client import reader as reader_module
    from rapidmount.client.connect import connect
    from rapidmount.storage.retry import RetryPolicy
    from tests.workerstore import worker_settings

    async def stubborn_wait_for(awaitable, timeout):
        task = asyncio.ensure_future(awaitable)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done():
                    return task.result()  # what the awaited operation itself raised

    monkeypatch.setattr(reader_module.asyncio, "wait_for", stubborn_wait_for)
    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        reader = reader_module.BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=5), stall_timeout=10)
        assert len(await reader.read(0, 4096)) == 4096
        closing = asyncio.get_running_loop().create_task(reader.close())
        done, _ = await asyncio.wait({closing}, timeout=5)
        running = await asyncio.to_thread(_streams_end, emulator, 1.0)
        await client.channel.close()  # ends whatever hung, so that the test does not
        return bool(done), running

    closed, running = asyncio.run(main())
    assert closed, "close() of the read stream hung"
    assert running == {}


def test_a_finalize_whose_answer_is_lost_finds_the_object_finalized_with_every_byte(emulator, caplog):
    """The service finalized the object, but its answer came after the stall
    timeout: the writer's retry cannot reopen a finalized object, and must
    not report a failure for a finalize that worked. It looks: the object is
    finalized at its generation, with exactly the bytes written."""
    import asyncio

    from rapidmount.client.connect import connect
    from rapidmount.client.writer import AppendableWriter
    from rapidmount.storage.retry import RetryPolicy
    from tests.workerstore import worker_settings

    data = os.urandom(3 * MiB + 5)

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        try:
            writer = AppendableWriter(client, "log", retry=RetryPolicy(deadline=10), buffer_limit=8 * MiB,
                                      stall_timeout=0.5)
            await writer.create()
            await writer.append(data)
            await writer.flush()
            finish, delayed = writer._finish, []

            async def finish_answered_late(finished) -> None:
                if not delayed:  # the first finish's answer comes after the stall timeout, later ones at once
                    delayed.append(True)
                    emulator.set_latency(1500)
                    asyncio.get_running_loop().call_later(0.25, emulator.set_latency, 0)
                await finish(finished)

            writer._finish = finish_answered_late
            meta = await writer.finalize()
            return meta, await client.get_object("log")
        finally:
            await client.channel.close()

    caplog.set_level("INFO", logger="rapidmount")
    meta, stored = asyncio.run(main())
    assert any("the answer was lost" in record.getMessage() for record in caplog.records)
    assert meta.finalized and meta.size == len(data)
    assert stored.finalized and stored.generation == meta.generation and stored.size == len(data)
    assert emulator.read_object(ZONAL_BUCKET, "log") == data



def test_a_read_cancelled_while_it_sends_leaves_no_unretrieved_error(emulator):
    """Found by R4 (asyncio logged "Future exception was never retrieved"): a
    read cancelled while it waited to send its range stayed pending, and the
    stream's close then failed a future nobody would await."""
    import asyncio
    import gc

    from rapidmount.client.connect import connect
    from rapidmount.client.reader import BidiObjectReader
    from rapidmount.storage.retry import RetryPolicy
    from tests.workerstore import worker_settings

    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        unhandled = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context["message"]))
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        reader = BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=5), stall_timeout=10)
        assert len(await reader.read(0, 4096)) == 4096  # the stream is open
        async with reader._write_lock:  # the next read waits here to send its range
            reading = asyncio.get_running_loop().create_task(reader.read(4096, 4096))
            await asyncio.sleep(0.1)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
        assert not reader._pending
        await reader.close()
        await client.channel.close()
        del reading
        gc.collect()
        await asyncio.sleep(0)
        return unhandled

    assert asyncio.run(main()) == []


def test_a_workers_private_memory_is_its_rss_anon():
    from rapidmount.dataplane.pool import private_memory
    status = "Name:\tpython\nVmRSS:\t  210000 kB\nRssAnon:\t  123456 kB\nRssFile:\t   20000 kB\nRssShmem:\t   66544 kB\n"
    assert private_memory(status) == 123456 * 1024, "the shared arena (RssShmem) and files do not count"
    assert private_memory("Name:\tkthreadd\n") is None
    from rapidmount.dataplane.pool import _private_memory_of
    assert _private_memory_of(os.getpid()) > 0
