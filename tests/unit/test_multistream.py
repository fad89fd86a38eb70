"""Several read streams per open file: the choice (StreamPolicy), the reader
over fake streams, and the real stack (GrpcStore -> bridge -> BidiObjectReader)
against the emulator with a per-stream bandwidth cap."""

from __future__ import annotations

import asyncio
import errno

import grpc
import pytest
import trio

from rapidmount.client.multistream import DEFAULT_MAX_BYTES, DEFAULT_MAX_RANGES, MultiStreamReader, StreamPolicy
from rapidmount.client.storage import StorageClient
from rapidmount.storage.errors import StorageError
from rapidmount.storage.grpc_store import GrpcStore
from rapidmount.storage.retry import RetryPolicy
from rapidmount.storage.seam import ObjectReader
from tests.conftest import FLAT_BUCKET, ZONAL_BUCKET

MiB = 1 << 20

# -- the policy, without I/O --------------------------------------------------------------------


def test_defaults_are_two_ranges_or_eight_mib():
    assert (DEFAULT_MAX_RANGES, DEFAULT_MAX_BYTES) == (2, 8 * MiB)
    policy = StreamPolicy(4)
    assert (policy.max_ranges, policy.max_bytes) == (2, 8 * MiB)


def test_the_first_range_goes_to_the_first_stream():
    policy = StreamPolicy(4)
    assert policy.choose([]) == 0
    assert policy.choose([(0, 0)]) == 0  # an idle first stream takes it: nothing opens early


def test_a_new_stream_opens_only_when_every_stream_is_loaded():
    policy = StreamPolicy(4, max_ranges=2, max_bytes=8 * MiB)
    assert policy.choose([(1, 2 * MiB)]) == 0            # under both thresholds
    assert policy.choose([(2, 4 * MiB)]) == 1            # 2 ranges in flight: open another
    assert policy.choose([(1, 8 * MiB)]) == 1            # 8 MiB in flight: open another
    assert policy.choose([(2, 4 * MiB), (1, 2 * MiB)]) == 1  # the second has room
    assert policy.choose([(2, 4 * MiB), (2, 4 * MiB)]) == 2


def test_up_to_the_limit_then_the_least_loaded():
    policy = StreamPolicy(3)
    loads = [(3, 6 * MiB), (2, 4 * MiB), (4, 8 * MiB)]
    assert policy.choose(loads) == 1  # all loaded, at the limit: fewest bytes
    assert policy.choose([(2, 4 * MiB), (3, 4 * MiB), (2, 4 * MiB)]) == 0  # ties: fewer ranges, then the oldest
    assert policy.choose([(5, 1 * MiB), (1, 2 * MiB), (9, 9 * MiB)]) == 0  # bytes first


def test_one_stream_never_opens_another():
    policy = StreamPolicy(1)
    assert policy.choose([(100, 1 << 30)]) == 0


def test_least_loaded():
    assert StreamPolicy.least_loaded([(5, 10 * MiB)]) == 0
    assert StreamPolicy.least_loaded([(5, 10 * MiB), (3, 6 * MiB), (1, 6 * MiB)]) == 2


def test_policy_rejects_nonsense():
    for args in ((0,), (2, 0, 1), (2, 1, 0)):
        with pytest.raises(ValueError):
            StreamPolicy(args[0], max_ranges=args[1] if len(args) > 1 else 2,
                         max_bytes=args[2] if len(args) > 2 else 1)


# -- the reader over fake streams ---------------------------------------------------------------


class _FakeStream:
    """Stands in for a BidiObjectReader: reads wait until released."""

    def __init__(self, index: int, generation: int, read_handle, routing_token) -> None:
        self.index = index
        self.generation = generation
        self.opened_with = (read_handle, routing_token)
        self.read_handle = None
        self.routing_token = None
        self.pending: list[tuple[int, int, asyncio.Future]] = []
        self.closed = False
        self.idle = True
        self.stream_open = False
        self.answered_event = asyncio.Event()

    @property
    def answered(self) -> bool:
        return self.answered_event.is_set()

    async def wait_answered(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.answered_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    def answer(self) -> None:
        self.read_handle = b"handle"  # the service answers the first message with one
        self.answered_event.set()

    async def read(self, offset: int, length: int):
        if self.closed:
            raise StorageError("closed", errno_=errno.EBADF)
        self.idle = False
        self.stream_open = True
        future = asyncio.get_running_loop().create_future()
        self.pending.append((offset, length, future))
        return await future

    def finish(self, error: Exception | None = None) -> None:
        if error is not None:
            self.stream_open = False
        self.answered_event.set()
        for offset, length, future in self.pending:
            if not future.done():
                if error is None:
                    future.set_result(bytes([self.index]) * length)
                else:
                    future.set_exception(error)
        self.pending.clear()

    async def close(self) -> None:
        self.closed = True
        self.stream_open = False
        self.finish(StorageError("stream closed", errno_=errno.EBADF))


class _FakeMulti(MultiStreamReader):
    def _new_stream(self, generation, read_handle, routing_token):
        stream = _FakeStream(len(getattr(self, "_streams", [])), generation, read_handle, routing_token)
        self.made = getattr(self, "made", []) + [stream]
        return stream


def _fake(max_streams: int = 4) -> _FakeMulti:
    return _FakeMulti(None, "obj", 7, retry=RetryPolicy(deadline=1.0), policy=StreamPolicy(max_streams))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_reader_adds_streams_by_load_reusing_the_first_handle():
    async def main():
        reader = _fake(4)
        assert reader.idle and not reader.stream_open and reader.streams == 1
        tasks = [asyncio.create_task(reader.read(i * 2 * MiB, 2 * MiB)) for i in range(10)]
        await _settle()
        # Two ranges load the first stream; the rest wait for its first answer and handle.
        assert reader.streams == 1 and len(reader.made[0].pending) == 2
        reader.made[0].answer()
        await _settle()
        assert reader.streams == 4 and not reader.idle and reader.stream_open
        assert [len(s.pending) for s in reader.made] == [3, 3, 2, 2]
        assert reader.made[0].opened_with == (None, None)
        assert all(s.opened_with == (b"handle", None) and s.generation == 7 for s in reader.made[1:])
        for stream in reader.made:
            stream.finish()
        results = await asyncio.gather(*tasks)
        assert [r[0] for r in results] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 1]
        assert reader.loads() == [(0, 0)] * 4
        await reader.close()
        assert all(s.closed for s in reader.made)
        with pytest.raises(StorageError):
            await reader.read(0, 1)

    asyncio.run(main())


def test_one_range_at_a_time_stays_on_one_stream():
    async def main():
        reader = _fake(4)
        for i in range(5):
            task = asyncio.create_task(reader.read(i, 1))
            await _settle()
            reader.made[0].finish()
            await task
        assert reader.streams == 1

    asyncio.run(main())


def test_an_error_on_one_stream_fails_only_its_ranges():
    async def main():
        reader = _fake(2)
        tasks = [asyncio.create_task(reader.read(i * MiB, MiB)) for i in range(4)]
        await _settle()
        reader.made[0].answer()
        await _settle()
        assert [len(s.pending) for s in reader.made] == [2, 2]
        reader.made[1].finish(StorageError("gone", errno_=errno.EIO))
        reader.made[0].finish()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [isinstance(r, StorageError) for r in results] == [False, False, True, True]
        # The failed stream's load is released; it takes ranges again.
        assert reader.loads() == [(0, 0), (0, 0)]
        await reader.close()

    asyncio.run(main())


def test_no_second_stream_after_the_first_failed_without_a_handle():
    async def main():
        reader = _fake(4)
        tasks = [asyncio.create_task(reader.read(i * MiB, MiB)) for i in range(4)]
        await _settle()
        assert reader.streams == 1 and len(reader.made[0].pending) == 2
        reader.made[0].finish(StorageError("stale", errno_=errno.ESTALE))
        await _settle()
        assert reader.streams == 1 and len(reader.made[0].pending) == 2  # the waiters went to the first
        reader.made[0].finish(StorageError("stale", errno_=errno.ESTALE))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [r.errno for r in results] == [errno.ESTALE] * 4
        await reader.close()

    asyncio.run(main())


def test_a_waiting_range_takes_the_first_stream_when_its_load_drops():
    async def main():
        reader = _fake(4)
        tasks = [asyncio.create_task(reader.read(i * MiB, MiB)) for i in range(3)]
        await _settle()
        assert len(reader.made[0].pending) == 2
        # The first two complete but no handle comes (a service that sends none on this stream).
        for offset, length, future in reader.made[0].pending:
            future.set_result(b"x" * length)
        reader.made[0].pending.clear()
        await asyncio.wait_for(asyncio.gather(*tasks[:2]), 1)
        await asyncio.sleep(0.12)  # the waiter looks again
        assert reader.streams == 1 and len(reader.made[0].pending) == 1
        reader.made[0].finish()
        await tasks[2]
        await reader.close()

    asyncio.run(main())


def test_max_streams_one_is_the_plain_reader():
    async def main():
        reader = _fake(1)
        tasks = [asyncio.create_task(reader.read(i, 1)) for i in range(6)]
        await _settle()
        assert reader.streams == 1 and len(reader.made[0].pending) == 6
        await reader.close()
        assert all(isinstance(r, StorageError) for r in await asyncio.gather(*tasks, return_exceptions=True))

    asyncio.run(main())


# -- the real stack against the emulator ------------------------------------------------------------


class _SpecSpy:
    """Wraps a client's BidiReadObject so each stream's first message is recorded."""

    def __init__(self, client: StorageClient) -> None:
        self.first_specs: list = []
        original = client.rpc

        def rpc(method, *args, **kwargs):
            factory = original(method, *args, **kwargs)
            if method != "BidiReadObject":
                return factory

            def open_call(*call_args, **call_kwargs):
                return _CallSpy(factory(*call_args, **call_kwargs), self.first_specs)
            return open_call

        client.rpc = rpc


class _CallSpy:
    def __init__(self, call, specs: list) -> None:
        self._call = call
        self._specs = specs

    async def write(self, request):
        if request.HasField("read_object_spec"):
            self._specs.append(request.read_object_spec)
        return await self._call.write(request)

    def __getattr__(self, name):
        return getattr(self._call, name)


@pytest.fixture
def make_store(emulator, bridge):
    channels = []

    def make(bucket: str, read_streams: int) -> tuple[GrpcStore, _SpecSpy]:
        async def connect():
            channel = grpc.aio.insecure_channel(emulator.endpoint)
            channels.append(channel)
            client = StorageClient(channel, bucket)
            return client, await client.get_layout()

        client, layout = bridge.run_blocking(connect)
        spy = _SpecSpy(client)
        store = GrpcStore(bridge, client, layout, retry=RetryPolicy(deadline=10.0, initial_backoff=0.01),
                          stall_timeout=10.0, write_buffer=8 << 20, read_streams=read_streams)
        return store, spy

    yield make
    for channel in channels:
        bridge.run_blocking(channel.close)


def _read_blocks(store: GrpcStore, name: str, generation: int, size: int, block: int, at_once: int) -> bytes:
    """Read the object in ``block``-sized ranges, ``at_once`` in flight, as readahead does."""
    out = bytearray(size)

    async def main():
        reader = store.open_reader(name, generation)
        assert isinstance(reader, ObjectReader) and reader.idle
        offsets = iter(range(0, size, block))

        async def worker():
            for offset in offsets:
                data = await reader.read(offset, block)
                out[offset:offset + len(data)] = data

        async with trio.open_nursery() as nursery:
            for _ in range(at_once):
                nursery.start_soon(worker)
        assert reader.stream_open
        await reader.close()
        assert not reader.stream_open

    trio.run(main)
    return bytes(out)


def test_capped_streams_concurrent_reads_open_several_streams_with_exact_bytes(emulator, make_store):
    import os

    data = os.urandom(24 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "big.bin", data)
    emulator.set_stream_bandwidth(40_000_000)
    store, spy = make_store(ZONAL_BUCKET, 4)
    assert _read_blocks(store, "big.bin", generation, len(data), 2 * MiB, 8) == data
    assert store.stream_events.read["open"] == 4
    assert store.stream_events.read["reconnect"] == 0
    # The first stream opens without a handle; the others reuse the one it was given.
    assert len(spy.first_specs) == 4
    assert not spy.first_specs[0].HasField("read_handle")
    assert all(spec.HasField("read_handle") and spec.read_handle.handle and spec.generation == generation
               for spec in spy.first_specs[1:])


def test_one_read_stream_stays_one_and_small_reads_stay_on_one(emulator, make_store):
    import os

    data = os.urandom(8 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "one.bin", data)
    emulator.set_stream_bandwidth(40_000_000)
    store, _ = make_store(ZONAL_BUCKET, 1)
    assert _read_blocks(store, "one.bin", generation, len(data), 2 * MiB, 4) == data
    assert store.stream_events.read["open"] == 1
    store4, _ = make_store(ZONAL_BUCKET, 4)
    # A small file read whole, one range at a time: one stream even with --read-streams 4.
    assert _read_blocks(store4, "one.bin", generation, 1 * MiB, 1 * MiB, 1) == data[:1 * MiB]
    assert _read_blocks(store4, "one.bin", generation, len(data), 1 * MiB, 1) == data
    assert store4.stream_events.read["open"] == 2  # one per handle


def test_a_broken_stream_among_several_resumes_with_exact_bytes(emulator, make_store):
    import os

    data = os.urandom(16 * MiB)
    generation = emulator.seed(ZONAL_BUCKET, "broken.bin", data)
    emulator.set_stream_bandwidth(40_000_000)
    emulator.add_fault("broken-read:after=3000000")
    store, _ = make_store(ZONAL_BUCKET, 4)
    assert _read_blocks(store, "broken.bin", generation, len(data), 2 * MiB, 8) == data
    assert store.stream_events.read["reconnect"] == 1
    assert store.stream_events.read["open"] >= 3  # at least two streams, one of them reopened


def test_a_replaced_generation_fails_every_stream_with_estale(emulator, make_store):
    generation = emulator.seed(ZONAL_BUCKET, "gone.bin", b"x" * (4 * MiB))
    store, _ = make_store(ZONAL_BUCKET, 4)
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
        # The first stream was refused before any read handle came back: no other stream was made
        # (the waiting ranges went to the first, which tried again and was refused again).
        assert reader._reader.streams == 1
        await reader.close()

    trio.run(main)


def test_non_zonal_buckets_keep_range_reads(emulator, make_store):
    generation = emulator.seed(FLAT_BUCKET, "f", b"abcdef")
    store, _ = make_store(FLAT_BUCKET, 4)

    async def main():
        reader = store.open_reader("f", generation)
        assert bytes(await reader.read(1, 3)) == b"bcd"
        assert not reader.stream_open
        await reader.close()

    trio.run(main)
