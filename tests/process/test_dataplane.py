"""The data plane with real worker processes against the emulator: several
streams per file spread over workers, reads and appends that survive a
worker killed with SIGKILL, calls that cross their stream's close, and the
arena's byte budget."""

from __future__ import annotations

import errno
import os
import signal

import pytest
import trio

from rapidmount.storage.errors import StorageError
from rapidmount.storage.seam import ObjectReader
from tests.conftest import FLAT_BUCKET, ZONAL_BUCKET, bidi_streams
from tests.polling import until
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
        assert isinstance(reader, ObjectReader) and reader.streams == 0 and not reader.stream_open
        await read_blocks(reader, size, block, at_once, out, on_block)
        assert reader.stream_open
        streams = reader.streams
        await reader.close()
        assert not reader.stream_open
        return streams

    streams = run_with_workers(store, main)
    return bytes(out), streams


def test_streams_are_added_by_load_on_several_workers_with_the_first_read_handle(emulator):
    # Stream k opens a span (32 MiB) further into the object: the fourth past 96 MiB.
    data = os.urandom(104 * MiB)
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
    data = os.urandom(72 * MiB)  # three streams: a span (32 MiB) further in for each
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


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_blocks_read_in_one_call_land_in_regions_of_their_own(emulator, bucket):
    """read_blocks: consecutive ranges in one call, each block a region of the
    arena of its own (freed with its last view); the arena too full for all
    of them: block by block, the bytes still exact."""
    data = os.urandom(7 * MiB + 12345)
    generation = emulator.seed(bucket, "blocks.bin", data)
    store = make_worker_store(emulator.endpoint, bucket, arena_size=16 * MiB)

    async def main():
        reader = store.open_reader("blocks.bin", generation)
        lengths = [2 * MiB, 2 * MiB, 2 * MiB, MiB + 12345]
        blocks = await reader.read_blocks(0, lengths, [None] * 4)
        assert [bytes(block) for block in blocks] == [data[:2 * MiB], data[2 * MiB:4 * MiB],
                                                      data[4 * MiB:6 * MiB], data[6 * MiB:]]
        assert all(isinstance(block, memoryview) for block in blocks)
        assert store.arena.used == 2 * MiB * 3 + (MiB + 12345 + (64 << 10) - 1) // (64 << 10) * (64 << 10)
        del blocks[0]
        assert store.arena.used < 6 * MiB + 2 * MiB  # the first block's region is free again
        hold = await reader.read(0, 8 * MiB)  # the arena has 16 MiB: now too little for 4 more blocks
        again = await reader.read_blocks(2 * MiB, [2 * MiB] * 2 + [MiB + 12345], [None] * 3)
        assert b"".join(bytes(block) for block in again) == data[2 * MiB:]
        del hold, again, blocks
        assert store.arena.used == 0
        await reader.close()

    run_with_workers(store, main)


def test_a_block_that_cannot_be_read_fails_its_whole_call(emulator):
    generation = emulator.seed(ZONAL_BUCKET, "short.bin", b"y" * (3 * MiB))
    store = make_worker_store(emulator.endpoint, ZONAL_BUCKET)
    emulator.seed(ZONAL_BUCKET, "short.bin", b"replaced")

    async def main():
        reader = store.open_reader("short.bin", generation)
        with pytest.raises(StorageError) as caught:
            await reader.read_blocks(0, [MiB, MiB, MiB], [None] * 3)
        assert caught.value.errno == errno.ESTALE
        assert store.arena.used == 0
        await reader.close()

    run_with_workers(store, main)


@pytest.mark.parametrize("bucket", [ZONAL_BUCKET, FLAT_BUCKET])
def test_batch_reads_land_in_the_arena_under_its_budget(emulator, bucket):
    """Scan-ahead's batches come back as views of arena regions, as read
    answers do, not as bytes in the message; past the arena, as bytes."""
    blobs = {f"b/{i}": os.urandom(300_000 + i) for i in range(6)}
    generations = dict(zip(blobs, emulator.seed_many(bucket, blobs)))
    store = make_worker_store(emulator.endpoint, bucket, arena_size=4 * MiB)
    names = iter(range(100))

    async def main():
        whole = await store.read_objects_whole([(name, generations[name], len(blob)) for name, blob in blobs.items()],
                                               concurrency=3)
        assert all(isinstance(answer, memoryview) for answer in whole)
        assert store.arena.used == 6 * 320 * 1024  # five 64 KiB granules each
        composed = await store.read_objects_composed(
            [(name, generations[name], len(blob), None) for name, blob in blobs.items()], concurrency=2,
            temporary_name=lambda: f"tmp/{next(names)}")
        assert [bytes(answer) for answer in composed] == list(blobs.values())
        assert [bytes(answer) for answer in whole] == list(blobs.values())
        del whole, composed
        assert store.arena.used == 0  # freed with their last views
        big = os.urandom(5 * MiB)
        generation = emulator.seed(bucket, "b/big", big)
        (past,) = await store.read_objects_whole([("b/big", generation, len(big))], concurrency=1)
        assert not isinstance(past, memoryview) and bytes(past) == big  # the arena is too small: in the answer

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
        data, _, sent = await connection.call("read", (999_997, ("o", 0, True, None, None), 0, 4096, None))
        assert len(data) == 4096 and not sent  # other streams are not affected; no READ to answer
        await connection.notify("close_reader", 999_997)
        # A read sent before that close, run after it: the stream is not opened again.
        with pytest.raises(StorageError) as caught:
            await connection.call("read", (999_997, ("o", 0, True, None, None), 4096, 4096, None))
        assert caught.value.errno == errno.EBADF
        await trio.to_thread.run_sync(until, lambda: not bidi_streams(emulator), 5.0,
                                      "every stream ended at the service")  # while the worker runs

    run_with_workers(store, main)
