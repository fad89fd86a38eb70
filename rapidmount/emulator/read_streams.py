"""The read streams: BidiReadObject and ReadObject.

BidiReadObject answers the spec at once (metadata + read handle), then
serves every range in its own task; ranges interleave chunk by chunk
through one write lock. ReadObject sends one range as a stream of chunks.

With ``--stream-bandwidth``, each read stream's chunks are paced by its own
token bucket (``pacing.StreamPacer``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from rapidmount.shared import wire

from . import chunks, convert, handles
from .blobs import BlobReader
from .pacing import StreamPacer
from .rpc import Code, Environment, RpcError, first_message, invalid, logger
from .stream_faults import StreamMeter, presented_token

S = wire.storage

MAX_RANGES_PER_MESSAGE = 100
# Ranges served at once per stream; beyond it the stream stops reading
# requests, so flow control pushes back on the client.
MAX_ACTIVE_RANGES = 1000


def _read_chunk(env: Environment, reader: BlobReader, method: str, object_name: str,
                position: int, count: int) -> tuple[bytes, int]:
    data, crc = reader.read_chunk(position, count) if count else (b"", 0)
    if env.faults.claim_corruption(method, object_name):
        crc ^= 0xFFFFFFFF
    return data, crc


def _chunk_length(position: int, end: int) -> int:
    """At most 2 MiB, ending on a 2 MiB boundary: after a range's first chunk
    every chunk is a whole stored segment (served without copying)."""
    return min(end - position, wire.MAX_CHUNK_BYTES - position % wire.MAX_CHUNK_BYTES)


# ---------------------------------------------------------------- BidiReadObject

class BidiReadSession:
    METHOD = "BidiReadObject"

    def __init__(self, env: Environment, context: grpc.aio.ServicerContext) -> None:
        self._env = env
        self._context = context
        self._write_lock = asyncio.Lock()
        self._slots = asyncio.Semaphore(MAX_ACTIVE_RANGES)
        self._active: set[int] = set()
        self._reader: BlobReader | None = None
        self._name = ""
        self._meter: StreamMeter | None = None
        self._pacer = StreamPacer(env.faults)  # one cap per stream, shared by its ranges
        self._broken = False

    async def run(self, requests: Any) -> None:
        first = await first_message(requests)
        if first is None:
            return
        try:
            await self._open(first)
            async with asyncio.TaskGroup() as ranges:
                # Ranges of the first message ride on the open's round trip.
                await self._schedule(ranges, first.read_ranges, round_trip=False)
                async for request in requests:
                    self._env.check_stream(self._context)
                    if request.HasField("read_object_spec"):
                        raise invalid("read_object_spec is only allowed in the first message of a stream")
                    await self._schedule(ranges, request.read_ranges)
            # The client half-closed and every range is served: end OK.
        finally:
            if self._reader is not None:
                self._reader.close()

    async def _open(self, first: Any) -> None:
        if not first.HasField("read_object_spec"):
            raise invalid("the first BidiReadObjectRequest must carry read_object_spec")
        env, spec = self._env, first.read_object_spec
        bucket = env.resolve_object(self._context, self.METHOD, spec.bucket, spec.object, "read_object_spec.")
        self._name = name = spec.object
        generation = spec.generation
        if spec.HasField("read_handle"):
            env.counters.bump("BidiReadObject with read_handle")
            try:
                pinned = handles.parse_read_handle(spec.read_handle.handle, bucket, name)
            except handles.BadHandle as exc:
                raise invalid(str(exc)) from None
            if generation and generation != pinned:
                raise invalid(f"read_handle names generation {pinned} but the spec asks for {generation}")
            generation = pinned
        presented = presented_token(env, self._context, spec)
        token = env.faults.pending_redirect("read", bucket, name, presented)
        if token is None and not env.faults.follows_redirect(presented):
            token = env.faults.claim_redirect("read", self.METHOD, bucket, name)
        if token:
            raise self._redirect(bucket, name, generation, token)
        record, resource, self._reader = env.store.open_reader_resource(bucket, name, generation,
                                                                        convert.preconditions(spec))
        self._meter = StreamMeter(env.faults, "broken-read", self.METHOD, name)
        size = self._reader.size()
        if size != record.size:  # appended to since the row was read: describe what is readable now
            resource = convert.object_proto(record, size).SerializeToString()
        await env.round_trip()
        # From the stored resource bytes: no Object message is built.
        await self._context.write(chunks.encode_read_open(
            resource, handles.read_handle(bucket, name, record.generation)))

    def _redirect(self, bucket: str, name: str, generation: int, token: str) -> RpcError:
        error = S.BidiReadObjectRedirectedError(routing_token=token)
        live = self._env.store.find_object(bucket, name)
        if live is not None:
            error.read_handle.handle = handles.read_handle(bucket, name, generation or live.generation)
        return RpcError(Code.ABORTED, f"redirected: retry with routing_token={token} in "
                                      "x-goog-request-params", [error])

    def _range_error(self, read_id: int, code: grpc.StatusCode, message: str) -> RpcError:
        status = wire.status_pb2.Status(code=code.value[0], message=message)
        detail = S.BidiReadObjectError(read_range_errors=[S.ReadRangeError(read_id=read_id, status=status)])
        return RpcError(code, message, [detail])

    async def _schedule(self, group: asyncio.TaskGroup, ranges: Any, *, round_trip: bool = True) -> None:
        if len(ranges) > MAX_RANGES_PER_MESSAGE:
            raise invalid(f"a BidiReadObjectRequest may carry at most {MAX_RANGES_PER_MESSAGE} "
                          f"read_ranges, got {len(ranges)}")
        seen: set[int] = set()
        for read_range in ranges:
            if read_range.read_id in self._active or read_range.read_id in seen:
                raise invalid(f"read_id {read_range.read_id} is already in use on this stream")
            seen.add(read_range.read_id)
        inline_ok = not (round_trip and self._env.faults.latency_s > 0)
        for read_range in ranges:
            offset = self._start_offset(read_range)
            read_id, length = read_range.read_id, read_range.read_length
            logger.debug("%s %r: read_id %d at %d, length %d", self.METHOD, self._name, read_id, offset, length)
            await self._slots.acquire()
            self._active.add(read_id)
            if inline_ok and 0 < length <= _chunk_length(offset, offset + length):
                # One chunk and no modelled wait: serve it now, without a task
                # (the common small read). Longer ranges get a task each, so
                # they interleave chunk by chunk.
                await self._serve(read_id, offset, length, False)
            else:
                group.create_task(self._serve(read_id, offset, length, round_trip))

    def _start_offset(self, read_range: S.ReadRange) -> int:
        assert self._reader is not None
        if read_range.read_length < 0:
            raise self._range_error(read_range.read_id, Code.OUT_OF_RANGE,
                                    f"read_length {read_range.read_length} is negative")
        size = self._reader.size()
        offset = read_range.read_offset
        if offset < 0:
            return max(0, size + offset)  # counts back from the end
        if offset > size:
            raise self._range_error(read_range.read_id, Code.OUT_OF_RANGE,
                                    f"read_offset {offset} is beyond the object size {size}")
        return offset

    async def _serve(self, read_id: int, offset: int, length: int, round_trip: bool) -> None:
        assert self._reader is not None and self._meter is not None
        try:
            if round_trip:
                await self._env.round_trip()
            # Unfinalized objects grow: serve what is persisted now.
            size = self._reader.size()
            end = size if length == 0 else min(size, offset + length)
            position = offset
            while True:
                # Metered under the write lock: ranges interleave, and a
                # broken-read must cut after exactly N bytes on the wire.
                async with self._write_lock:
                    if self._broken:
                        return  # another range broke the stream; the task group is ending it
                    try:
                        self._env.check_stream(self._context)
                    except RpcError:
                        self._broken = True
                        raise
                    count, broken = self._meter.allowance(_chunk_length(position, end))
                    last = not broken and position + count >= end
                    if count or last:
                        # Paced under the lock: the cap is the stream's, and
                        # the other ranges could not send meanwhile anyway.
                        delay = self._pacer.charge(count)
                        if delay:
                            await asyncio.sleep(delay)
                        data, crc = _read_chunk(self._env, self._reader, self.METHOD, self._name, position, count)
                        await self._context.write(chunks.encode_range_chunk(data, crc, position, read_id, last))
                    self._meter.add(count)
                    self._broken = broken
                if broken:
                    raise self._meter.broken()
                if last:
                    return
                position += count
        finally:
            self._active.discard(read_id)
            self._slots.release()


# ---------------------------------------------------------------- ReadObject

async def read_object(env: Environment, request: Any, context: grpc.aio.ServicerContext) -> None:
    method = "ReadObject"
    bucket = env.resolve_object(context, method, request.bucket, request.object)
    if request.read_limit < 0:
        raise RpcError(Code.OUT_OF_RANGE, f"read_limit {request.read_limit} is negative")
    record, reader = env.store.open_reader(bucket, request.object, request.generation,
                                           convert.preconditions(request))
    try:
        size = reader.size()
        offset = request.read_offset
        if offset < 0:
            offset = max(0, size + offset)
        elif offset > size:
            raise RpcError(Code.OUT_OF_RANGE, f"read_offset {offset} is beyond the object size {size}")
        end = size if request.read_limit == 0 else min(size, offset + request.read_limit)
        meter = StreamMeter(env.faults, "broken-read", method, request.object)
        pacer = StreamPacer(env.faults)
        await env.round_trip()
        position, first = offset, True
        while first or position < end:
            count, broken = meter.allowance(_chunk_length(position, end))
            response = S.ReadObjectResponse()
            if count:
                delay = pacer.charge(count)
                if delay:
                    await asyncio.sleep(delay)
                data, crc = _read_chunk(env, reader, method, request.object, position, count)
                response.checksummed_data.content = data
                response.checksummed_data.crc32c = crc
            if first:
                response.metadata.CopyFrom(convert.object_proto(record, size))
                response.content_range.start = offset
                response.content_range.end = end
                response.content_range.complete_length = size
                if record.finalized:
                    response.object_checksums.crc32c = record.crc32c
                    if record.md5:
                        response.object_checksums.md5_hash = record.md5
            if count or first:
                await context.write(response)
            first = False
            meter.add(count)
            position += count
            if broken:
                raise meter.broken()
    finally:
        reader.close()

