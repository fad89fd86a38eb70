"""Scan-ahead's batch reads, as a data-plane worker makes them (asyncio, grpc.aio).

The FUSE process's scan-ahead (:mod:`rapidmount.scanahead.files`) sends a
whole batch of small files in one call; here is how the worker reads them:
per file, on zonal buckets, a lean stream (the range in the first message,
the request side closed at once), falling back to a full reader with its
retries, and elsewhere one ``ReadObject``; or, with ``--compose-prefetch``
on buckets that can compose, through temporary composite objects of up to
32 files, each part checked against its source's CRC32C. The worker then
writes each file's bytes into the arena region the FUSE process named.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

import grpc

from rapidmount.shared import wire
from rapidmount.workers.client.errors import ChecksumMismatch, RetryPolicy, StorageError
from rapidmount.workers.client.fastwire import decode_bidi_read_response
from rapidmount.workers.client.reader import BidiObjectReader, RangeObjectReader, StreamBroken
from rapidmount.workers.client.storage import StorageClient
from rapidmount.storage.seam import COMPOSE_MAX_SOURCES

log = logging.getLogger("rapidmount.reader")


async def read_once(client: StorageClient, name: str, generation: int, offset: int, length: int, *,
                    zonal: bool, retry: RetryPolicy, stall_timeout: float = 60.0,
                    on_event: Callable[[str], None] | None = None) -> bytes | memoryview:
    """One range of one object over a stream of its own, closed afterwards.

    For reads that no file handle owns (prefetching files ahead of a scan);
    redirects, resumption, CRC32C checks and the retry deadline are the same.
    """
    reader: BidiObjectReader | RangeObjectReader
    if zonal:
        reader = BidiObjectReader(client, name, generation, retry=retry, stall_timeout=stall_timeout,
                                  on_event=on_event)
    else:
        reader = RangeObjectReader(client, name, generation, retry=retry, stall_timeout=stall_timeout,
                                   on_event=on_event)
    try:
        return await reader.read(offset, length)
    finally:
        await reader.close()


async def read_objects_whole(client: StorageClient, items: list[tuple[str, int, int]], *, zonal: bool,
                             concurrency: int, retry: RetryPolicy, stall_timeout: float = 60.0,
                             on_event: Callable[[str], None] | None = None
                             ) -> list[bytes | memoryview | StorageError]:
    """The first ``length`` bytes of each ``(name, generation, length)``, concurrently.

    For prefetching many small files: one crossing from trio for the whole
    batch, and per object a lean stream (the range in the first message, the
    request side closed at once, so the service ends the stream after the
    data). Anything unusual on that stream (a redirect, a break, a checksum
    mismatch) falls back to a full reader with its retries. Failures come
    back as :class:`StorageError` values, in order.
    """
    limit = asyncio.Semaphore(concurrency)
    note = on_event or (lambda event: None)

    async def one(name: str, generation: int, length: int) -> bytes | memoryview | StorageError:
        async with limit:
            if zonal:
                note("open")
                try:
                    return await _read_in_one_stream(client, name, generation, length, stall_timeout)
                except Exception as err:  # retried in full below, which reports what stays wrong
                    if isinstance(err, grpc.aio.AioRpcError):
                        client.rpc_errors.add("BidiReadObject", err.code())
                    note("reconnect")
            try:
                return await read_once(client, name, generation, 0, length, zonal=zonal, retry=retry,
                                       stall_timeout=stall_timeout, on_event=on_event)
            except StorageError as err:
                return err

    return list(await asyncio.gather(*(one(*item) for item in items)))


async def _read_in_one_stream(client: StorageClient, name: str, generation: int, length: int,
                              stall_timeout: float) -> bytes | memoryview:
    spec = wire.storage.BidiReadObjectSpec(bucket=client.bucket_resource, object=name, generation=generation)
    request = wire.storage.BidiReadObjectRequest(
        read_object_spec=spec, read_ranges=[wire.storage.ReadRange(read_offset=0, read_length=length, read_id=1)])
    # A one-message request iterator: gRPC sends it and half-closes by itself,
    # which costs less than awaiting write() and done_writing().
    call = client.rpc("BidiReadObject", decode_bidi_read_response)(iter((request,)), metadata=client.metadata())
    chunks: list[bytes | memoryview] = []
    received = 0
    try:
        async with asyncio.timeout(stall_timeout):
            async for response in call:
                for chunk in response.chunks:
                    if chunk.read_id != 1 or chunk.read_offset != received:
                        raise StreamBroken(f"unexpected chunk at {chunk.read_offset}")
                    if not chunk.crc_ok:
                        raise ChecksumMismatch(f"CRC32C mismatch in {name!r} at {chunk.read_offset}")
                    if chunk.content:
                        chunks.append(chunk.content)
                        received += len(chunk.content)
    except BaseException:
        call.cancel()
        raise
    if received != length:
        raise StreamBroken(f"{name!r}: got {received} of {length} bytes")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_objects_composed(client: StorageClient, items: list[tuple[str, int, int, int | None]], *,
                                concurrency: int, retry: RetryPolicy, temporary_name: Callable[[], str],
                                stall_timeout: float = 60.0, on_event: Callable[[str], None] | None = None
                                ) -> list[bytes | memoryview | StorageError]:
    """Whole small objects ``(name, generation, size, crc32c)``, read by composing them.

    Up to 32 sources are composed (their generations pinned) into one
    temporary object, which is read with one call and deleted at once; each
    part is checked against its source's CRC32C. Buckets without compose
    (zonal ones) or any failure fall back to reading the objects one by one.
    """
    limit = asyncio.Semaphore(concurrency)
    compose = client.rpc("ComposeObject")

    async def group(members: list[tuple[str, int, int, int | None]]) -> list[memoryview | None]:
        async with limit:
            name = temporary_name()
            request = wire.storage.ComposeObjectRequest(
                destination=wire.storage.Object(bucket=client.bucket_resource, name=name),
                source_objects=[wire.storage.ComposeObjectRequest.SourceObject(name=source, generation=generation)
                                for source, generation, _, _ in members],
                if_generation_match=0)  # the temporary name is new: never replace an object
            try:
                record = await compose(request, metadata=client.metadata(), timeout=retry.deadline)
            except grpc.aio.AioRpcError as err:
                client.rpc_errors.add("ComposeObject", err.code())
                return [None] * len(members)
            try:
                data = await read_once(client, name, record.generation, 0, record.size, zonal=False,
                                       retry=retry, stall_timeout=stall_timeout, on_event=on_event)
            except StorageError:
                data = None
            finally:
                try:
                    await client.delete_object(name, if_generation_match=record.generation)
                except StorageError as err:
                    log.warning("could not delete the temporary object %r: %s", name, err,
                                extra={"object": name})
            if data is None or len(data) != sum(size for _, _, size, _ in members):
                return [None] * len(members)
            view, offset = memoryview(data), 0
            parts: list[memoryview | None] = []
            for _, _, size, crc in members:
                part = view[offset:offset + size]
                offset += size
                parts.append(part if crc is None or wire.crc32c(part) == crc else None)
            return parts

    groups = [items[start:start + COMPOSE_MAX_SOURCES] for start in range(0, len(items), COMPOSE_MAX_SOURCES)]
    answers: list[bytes | memoryview | StorageError | None] = [
        part for parts in await asyncio.gather(*(group(g) for g in groups)) for part in parts]
    missing = [index for index, answer in enumerate(answers) if answer is None]
    if missing:
        alone = await read_objects_whole(client, [items[i][:3] for i in missing], zonal=False,
                                         concurrency=concurrency, retry=retry, stall_timeout=stall_timeout,
                                         on_event=on_event)
        for index, answer in zip(missing, alone):
            answers[index] = answer
    return cast(list[bytes | memoryview | StorageError], answers)  # no None left: each was read alone
