"""The client's streams against the emulator, in this process: streams that
close, cancel or lose an answer at awkward moments end at the service and
leave nothing behind."""

from __future__ import annotations

import asyncio
import gc
import os

import pytest

from rapidmount.workers.client import reader as reader_module
from rapidmount.workers.client.connect import connect
from rapidmount.workers.client.reader import BidiObjectReader
from rapidmount.workers.client.stall import read_within
from rapidmount.workers.client.writer import AppendableWriter
from rapidmount.storage.errors import StorageError
from rapidmount.workers.retry import RetryPolicy
from tests.conftest import ZONAL_BUCKET, bidi_streams
from tests.polling import until_async
from tests.workerstore import worker_settings

MiB = 1 << 20


class WatchedLock(asyncio.Lock):
    """A stream's write lock that tells when a task starts waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.contended = asyncio.Event()

    async def acquire(self) -> bool:
        if self.locked():
            self.contended.set()
        return await super().acquire()


def test_a_stream_closed_while_it_opens_is_ended_at_the_service(emulator):
    """Found by R4: a read stream closed while it was being opened (its call
    started, waiting for the lock of its first message) stayed open at the
    service for good, as did an append stream cancelled before its first answer."""
    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        try:
            reader = BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=5), stall_timeout=10)
            reader._write_lock = lock = WatchedLock()
            async with lock:  # the stream's first message waits here
                reading = asyncio.get_running_loop().create_task(reader.read(0, 4096))
                await asyncio.wait_for(lock.contended.wait(), 10)
                await reader.close()
            with pytest.raises(StorageError):
                await reading
            emulator.set_latency(2000)  # the first answer of the append stream comes late
            writer = AppendableWriter(client, "new", retry=RetryPolicy(deadline=5), buffer_limit=MiB,
                                      stall_timeout=10)
            creating = asyncio.get_running_loop().create_task(writer.create())
            await until_async(lambda: bidi_streams(emulator).get("BidiWriteObject"), 10,
                              "the append stream reached the service")
            creating.cancel()
            with pytest.raises(asyncio.CancelledError):
                await creating
            await until_async(lambda: not bidi_streams(emulator), 5, "every stream ended at the service")
        finally:
            await client.channel.close()

    asyncio.run(main())


def test_closing_a_read_stream_ends_it_even_if_a_cancellation_is_swallowed(emulator, monkeypatch):
    """Found by R4: Python 3.11's ``asyncio.wait_for`` can swallow a
    cancellation that lands with a message. The read stream's supervisor then
    went on waiting for the next message, close() waited on it for good, and
    the stream stayed open at the service."""

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
        try:
            closing = asyncio.get_running_loop().create_task(reader.close())
            done, _ = await asyncio.wait({closing}, timeout=5)
            assert done, "close() of the read stream hung"
            await until_async(lambda: not bidi_streams(emulator), 5, "the read stream ended at the service")
        finally:
            await client.channel.close()  # ends whatever hung, so that the test does not

    asyncio.run(main())


def test_a_finalize_whose_answer_is_lost_finds_the_object_finalized_with_every_byte(emulator, caplog):
    """The service finalized the object, but its answer came after the stall
    timeout: the writer's retry cannot reopen a finalized object, and must
    not report a failure for a finalize that worked. It looks: the object is
    finalized at its generation, with exactly the bytes written."""

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

    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        unhandled = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context["message"]))
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        reader = BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=5), stall_timeout=10)
        assert len(await reader.read(0, 4096)) == 4096  # the stream is open
        reader._write_lock = lock = WatchedLock()
        async with lock:  # the next read waits here to send its range
            reading = asyncio.get_running_loop().create_task(reader.read(4096, 4096))
            await asyncio.wait_for(lock.contended.wait(), 10)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
        assert not reader._pending
        await reader.close()
        await client.channel.close()
        del reading
        gc.collect()  # a future dropped with an unretrieved error reports it here
        return unhandled

    assert asyncio.run(main()) == []


def test_an_aborted_writer_never_reads_the_bytes_it_kept_again(emulator):
    """The FUSE process lets go of the bytes a worker's writer keeps (its own
    memory, or the arena) once the writer is aborted: a close or a sender
    still running then must not read them, nor open a stream again."""
    from rapidmount.shared.peer_memory import PeerBytes, address_of

    held = [os.urandom(MiB) for _ in range(5)]
    aborted = False
    reads_after = []

    class Watched(PeerBytes):
        def read_into(self, address: int) -> None:
            if aborted:
                reads_after.append(len(self))
            super().read_into(address)

    async def main():
        nonlocal aborted
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        try:
            writer = AppendableWriter(client, "aborted", retry=RetryPolicy(deadline=5), buffer_limit=64 * MiB,
                                      stall_timeout=10)
            await writer.create()
            emulator.set_latency(300)  # the close's flush waits for its answer
            for data in held:
                await writer.append(Watched(os.getpid(), [(address_of(data), len(data))]))
            closing = asyncio.get_running_loop().create_task(writer.close())
            await asyncio.sleep(0.1)
            aborted = True
            await writer.abort()
            with pytest.raises((StorageError, asyncio.CancelledError)):  # its stream was cancelled under it
                await closing
            assert len(writer._retained) == 0 and not reads_after
            await until_async(lambda: not bidi_streams(emulator), 5, "no stream left at the service")
        finally:
            await client.channel.close()

    asyncio.run(main())


class _SilentCall:
    """A call whose read() waits until the call is cancelled, as grpc.aio's does."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True

    async def read(self):
        await self.cancelled.wait()
        raise asyncio.CancelledError()


def test_a_stall_cancels_the_call_and_never_the_task_that_reads_it():
    """Cancelling a task that waits in read() leaks gRPC memory at every stall
    (asyncio.wait_for did that): the timer cancels the call, and the reading
    task's own cancellation still goes through as one."""

    async def main():
        call = _SilentCall()
        with pytest.raises(TimeoutError):
            await read_within(call, 0.05)
        assert call.cancelled.is_set()
        quiet = _SilentCall()
        reading = asyncio.get_running_loop().create_task(read_within(quiet, 30))
        await asyncio.sleep(0)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert not quiet.cancelled.is_set()

    asyncio.run(main())


def test_a_read_stream_that_stalls_is_broken_retried_and_fails_within_its_deadline(emulator):
    emulator.seed(ZONAL_BUCKET, "o", os.urandom(MiB))

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        try:
            reader = BidiObjectReader(client, "o", 0, retry=RetryPolicy(deadline=1.0), stall_timeout=0.2)
            emulator.set_latency(600)
            with pytest.raises(StorageError, match="no data for 0.2s"):
                await reader.read(0, 4096)
            emulator.set_latency(0)
            assert bytes(await reader.read(0, 4096)) == emulator.read_object(ZONAL_BUCKET, "o")[:4096]
            await reader.close()
            await until_async(lambda: not bidi_streams(emulator), 5, "every stream ended at the service")
        finally:
            await client.channel.close()

    asyncio.run(main())


def test_a_writer_flushes_in_the_background_so_appends_do_not_wait_for_the_buffer(emulator):
    """Past half the buffer, the sender flushes what it sent while appends go
    on: the buffer empties, no append waits for a flush of its own, and
    appends made while a flush's answer is late break nothing."""
    data = os.urandom(24 * MiB)
    events: list[str] = []

    async def main():
        client, _ = await connect(worker_settings(emulator.endpoint, ZONAL_BUCKET), None)
        try:
            writer = AppendableWriter(client, "ahead", retry=RetryPolicy(deadline=10), buffer_limit=8 * MiB,
                                      stall_timeout=10, on_event=events.append)
            await writer.create()
            persist, waited = writer._persist, []

            async def persist_counted() -> None:
                waited.append(writer.written)
                await persist()

            writer._persist = persist_counted
            for at in range(0, len(data), MiB):
                if at == 12 * MiB:
                    emulator.set_latency(100)  # a flush's answer comes late: appends go on meanwhile
                await writer.append(data[at:at + MiB])
                if writer._sender is not None and at < 20 * MiB:
                    await writer._sender  # the sender kept up (appends that outrun it are below)
                if at == 16 * MiB:
                    emulator.set_latency(0)
            assert not waited, f"appends waited for flushes at {waited}"
            assert writer.persisted_size >= 8 * MiB  # flushed without a flush() call
            assert await writer.flush() == len(data)
            await writer.close()
        finally:
            await client.channel.close()

    asyncio.run(main())
    assert emulator.read_object(ZONAL_BUCKET, "ahead") == data
    assert "reconnect" not in events
