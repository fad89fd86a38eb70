"""Error codes and edge cases over real gRPC, with raw calls on ``wire`` paths.

These express what the official client cannot (malformed requests, exact
response sequences, fencing of a still-open stream) and check the CLI.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import google_crc32c
import grpc
import pytest

from rapidmount.shared import wire
from rapidmount.emulator import Emulator, FaultSpecError, emulator_running
from tests.conftest import FLAT_BUCKET, HNS_BUCKET, ZONAL_BUCKET
from tests.mountutil import stop_process

S = wire.storage
C = wire.control
MiB = 1 << 20
Code = grpc.StatusCode


@pytest.fixture(autouse=True)
def no_server_errors_logged(caplog):
    """Whatever a client sends, the emulator must not log an ERROR (a traceback)."""
    caplog.set_level(logging.WARNING)
    yield
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith(("rapidmount", "grpc"))]
    assert not errors, [r.getMessage() for r in errors]


class Raw:
    """Raw gRPC calls against the emulator's real method paths."""

    def __init__(self, endpoint: str) -> None:
        self.channel = grpc.insecure_channel(endpoint, options=wire.GRPC_MESSAGE_OPTIONS)

    def _callable(self, name: str):
        method = wire.STORAGE_METHODS.get(name) or wire.CONTROL_METHODS[name]
        factory = getattr(self.channel, method.kind)
        return factory(method.path, request_serializer=method.request.SerializeToString,
                       response_deserializer=method.response.FromString)

    def unary(self, name: str, request, bucket: str | None = None, metadata=()):
        headers = list(metadata) + ([wire.routing_header(bucket)] if bucket else [])
        return self._callable(name)(request, metadata=headers, timeout=30)

    def read_object(self, request, bucket: str):
        return list(self._callable("ReadObject")(request, metadata=[wire.routing_header(bucket)], timeout=30))

    def write_object(self, requests, bucket: str):
        return self._callable("WriteObject")(iter(requests), metadata=[wire.routing_header(bucket)], timeout=30)

    def stream(self, name: str, bucket: str | None = None, metadata=()) -> "Stream":
        headers = list(metadata) + ([wire.routing_header(bucket)] if bucket else [])
        return Stream(self._callable(name), headers)

    def close(self) -> None:
        self.channel.close()


class Stream:
    """A bidi call fed from a queue, so a test can interleave sends and receives."""

    def __init__(self, callable_, metadata) -> None:
        self._requests: queue.Queue = queue.Queue()
        self.call = callable_(iter(self._requests.get, None), metadata=metadata, timeout=60)

    def send(self, request) -> "Stream":
        self._requests.put(request)
        return self

    def recv(self):
        return next(self.call)

    def half_close(self) -> None:
        self._requests.put(None)

    def rest(self) -> list:
        """Half-close, then every remaining response (raises on an error status)."""
        self.half_close()
        return list(self.call)


@pytest.fixture
def raw(emulator):
    client = Raw(emulator.endpoint)
    yield client
    client.close()


def expect_error(code: grpc.StatusCode, function, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = function(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    assert caught.value.code() == code, caught.value.details()
    return caught.value


def bucket_path(bucket: str) -> str:
    return wire.bucket_resource(bucket)


def read_spec(bucket: str, name: str, **fields) -> S.BidiReadObjectSpec:
    return S.BidiReadObjectSpec(bucket=bucket_path(bucket), object=name, **fields)


def open_read(raw: Raw, bucket: str, name: str, ranges=(), **fields) -> tuple[Stream, S.BidiReadObjectResponse]:
    stream = raw.stream("BidiReadObject", bucket)
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(bucket, name, **fields), read_ranges=list(ranges)))
    return stream, stream.recv()


def collect_ranges(responses) -> dict[int, list[S.ObjectRangeData]]:
    ranges: dict[int, list] = {}
    for response in responses:
        for data in response.object_data_ranges:
            ranges.setdefault(data.read_range.read_id, []).append(data)
    return ranges


def assemble(parts: list[S.ObjectRangeData], start: int) -> bytes:
    """The bytes of one range, checking offsets, chunk sizes, CRCs and range_end."""
    position = start
    for index, part in enumerate(parts):
        content = part.checksummed_data.content
        assert part.read_range.read_offset == position, "read_offset must be the chunk's absolute offset"
        assert part.read_range.read_length == len(content)
        assert len(content) <= wire.MAX_CHUNK_BYTES
        assert part.checksummed_data.crc32c == google_crc32c.value(content)
        assert part.range_end == (index == len(parts) - 1), "exactly one range_end, on the last chunk"
        position += len(content)
    return b"".join(part.checksummed_data.content for part in parts)


def append_spec(bucket: str, name: str, generation: int, handle: bytes | None = None) -> S.AppendObjectSpec:
    spec = S.AppendObjectSpec(bucket=bucket_path(bucket), object=name, generation=generation)
    if handle is not None:
        spec.write_handle.handle = handle
    return spec


def new_appendable(bucket: str, name: str, **spec_fields) -> S.BidiWriteObjectRequest:
    return S.BidiWriteObjectRequest(write_object_spec=S.WriteObjectSpec(
        resource=S.Object(name=name, bucket=bucket_path(bucket)), appendable=True, **spec_fields))


def data_message(offset: int, data: bytes, crc: int | None = None, **fields) -> S.BidiWriteObjectRequest:
    checksummed = S.ChecksummedData(content=data, crc32c=google_crc32c.value(data) if crc is None else crc)
    return S.BidiWriteObjectRequest(write_offset=offset, checksummed_data=checksummed, **fields)


# ---------------------------------------------------------------- buckets and routing

def test_unknown_bucket_is_not_found_everywhere(raw):
    expect_error(Code.NOT_FOUND, raw.unary, "GetObject",
                 S.GetObjectRequest(bucket=bucket_path("no-such-bucket"), object="o"), "no-such-bucket")
    expect_error(Code.NOT_FOUND, raw.unary, "ListObjects", S.ListObjectsRequest(parent=bucket_path("no-such-bucket")))
    expect_error(Code.NOT_FOUND, raw.unary, "GetStorageLayout",
                 C.GetStorageLayoutRequest(name="projects/_/buckets/no-such-bucket/storageLayout"))
    stream = raw.stream("BidiReadObject", "no-such-bucket")
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec("no-such-bucket", "o")))
    expect_error(Code.NOT_FOUND, stream.recv)
    stream = raw.stream("BidiWriteObject")
    stream.send(new_appendable("no-such-bucket", "o"))
    expect_error(Code.NOT_FOUND, stream.recv)


def test_routing_header_is_parsed_and_checked(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "o", b"x")
    request = S.GetObjectRequest(bucket=bucket_path(ZONAL_BUCKET), object="o")
    # URL-encoded the way some clients do it: %2F instead of '/'.
    encoded = ("x-goog-request-params", "bucket=projects%2F_%2Fbuckets%2F" + ZONAL_BUCKET)
    assert raw.unary("GetObject", request, metadata=[encoded]).name == "o"
    expect_error(Code.NOT_FOUND, raw.unary, "ListObjects", S.ListObjectsRequest(parent=bucket_path(ZONAL_BUCKET)),
                 metadata=[("x-goog-request-params", "bucket=projects/_/buckets/other-bucket")])
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "GetObject", request,
                 metadata=[("x-goog-request-params", "bucket=not-a-resource")])
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "GetObject", request, HNS_BUCKET)  # header disagrees
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "GetObject",
                 S.GetObjectRequest(bucket="buckets/" + ZONAL_BUCKET, object="o"))


def test_get_bucket_describes_each_kind(raw):
    zonal = raw.unary("GetBucket", S.GetBucketRequest(name=bucket_path(ZONAL_BUCKET)), ZONAL_BUCKET)
    assert (zonal.location_type, zonal.storage_class, zonal.hierarchical_namespace.enabled) == ("zone", "RAPID", True)
    assert list(zonal.custom_placement_config.data_locations) == ["us-central1-a"]
    flat = raw.unary("GetBucket", S.GetBucketRequest(name=bucket_path(FLAT_BUCKET)), FLAT_BUCKET)
    assert (flat.location_type, flat.storage_class, flat.hierarchical_namespace.enabled) == ("region", "STANDARD", False)
    expect_error(Code.FAILED_PRECONDITION, raw.unary, "GetBucket",
                 S.GetBucketRequest(name=bucket_path(FLAT_BUCKET), if_metageneration_match=2))


# ---------------------------------------------------------------- BidiReadObject

def test_read_answers_the_spec_at_once_with_metadata_and_handle(raw, emulator):
    generation = emulator.seed(ZONAL_BUCKET, "r", b"hello")
    stream, first = open_read(raw, ZONAL_BUCKET, "r")
    assert (first.metadata.name, first.metadata.generation, first.metadata.size) == ("r", generation, 5)
    assert first.metadata.checksums.crc32c == google_crc32c.value(b"hello")
    assert first.metadata.finalize_time.seconds > 0
    assert first.read_handle.handle
    assert not first.object_data_ranges
    assert stream.rest() == []  # half-close with nothing pending ends the stream OK


def test_read_serves_many_ranges_with_absolute_offsets(raw, emulator):
    data = os.urandom(5 * MiB + 3)
    emulator.seed(ZONAL_BUCKET, "big", data)
    ranges = [S.ReadRange(read_offset=0, read_length=100, read_id=1),
              S.ReadRange(read_offset=MiB + 1, read_length=3 * MiB, read_id=2),
              S.ReadRange(read_offset=0, read_length=0, read_id=3),                 # to the end
              S.ReadRange(read_offset=-10, read_length=0, read_id=4),               # the last 10 bytes
              S.ReadRange(read_offset=-(10 * MiB), read_length=7, read_id=5),       # clamped to 0
              S.ReadRange(read_offset=len(data), read_length=0, read_id=6),         # empty, at the end
              S.ReadRange(read_offset=len(data) - 5, read_length=100, read_id=7)]   # past the end: short
    stream, _ = open_read(raw, ZONAL_BUCKET, "big", ranges[:3])
    stream.send(S.BidiReadObjectRequest(read_ranges=ranges[3:]))  # ranges may come in later messages
    got = collect_ranges(stream.rest())
    assert assemble(got[1], 0) == data[:100]
    assert assemble(got[2], MiB + 1) == data[MiB + 1:4 * MiB + 1]
    assert assemble(got[3], 0) == data
    assert assemble(got[4], len(data) - 10) == data[-10:]
    assert assemble(got[5], 0) == data[:7]
    assert len(got[6]) == 1 and assemble(got[6], len(data)) == b""
    assert assemble(got[7], len(data) - 5) == data[-5:]


def test_read_range_errors(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "r", b"0123456789")
    stream, _ = open_read(raw, ZONAL_BUCKET, "r")
    stream.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_offset=11, read_id=77)]))
    error = expect_error(Code.OUT_OF_RANGE, stream.rest)
    details = wire.unpack_details(error.trailing_metadata(), S.BidiReadObjectError)
    (range_error,) = details[S.BidiReadObjectError].read_range_errors
    assert range_error.read_id == 77 and range_error.status.code == Code.OUT_OF_RANGE.value[0]

    stream, _ = open_read(raw, ZONAL_BUCKET, "r")
    stream.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_length=-1, read_id=1)]))
    expect_error(Code.OUT_OF_RANGE, stream.rest)


@pytest.mark.parametrize("case", ["no-spec", "late-spec", "duplicate-id", "too-many-ranges", "bad-handle", "no-object"])
def test_malformed_read_requests_are_invalid(raw, emulator, case):
    emulator.seed(ZONAL_BUCKET, "r", b"x" * 1000)
    stream = raw.stream("BidiReadObject", ZONAL_BUCKET)
    if case == "no-spec":
        stream.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_id=1)]))
    elif case == "bad-handle":
        stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(
            ZONAL_BUCKET, "r", read_handle=S.BidiReadHandle(handle=b"forged"))))
    elif case == "no-object":
        stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "")))
    else:
        stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "r")))
        stream.recv()
        if case == "late-spec":
            stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "r")))
        elif case == "duplicate-id":
            stream.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_id=5), S.ReadRange(read_id=5)]))
        else:
            stream.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_id=i) for i in range(101)]))
    error = expect_error(Code.INVALID_ARGUMENT, stream.rest)
    assert error.details()


def test_read_handle_reopens_the_pinned_generation(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "pinned", b"first generation")
    stream, first = open_read(raw, ZONAL_BUCKET, "pinned")
    stream.rest()
    reopened, again = open_read(raw, ZONAL_BUCKET, "pinned", [S.ReadRange(read_id=1)],
                                read_handle=first.read_handle)
    assert again.metadata.generation == first.metadata.generation
    assert assemble(collect_ranges(reopened.rest())[1], 0) == b"first generation"
    emulator.seed(ZONAL_BUCKET, "pinned", b"second")  # the pinned generation is gone
    stream = raw.stream("BidiReadObject", ZONAL_BUCKET)
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(
        ZONAL_BUCKET, "pinned", read_handle=first.read_handle)))
    expect_error(Code.NOT_FOUND, stream.recv)
    stream = raw.stream("BidiReadObject", ZONAL_BUCKET)
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "missing")))
    expect_error(Code.NOT_FOUND, stream.recv)


def test_an_open_read_stream_sees_later_appends(raw, emulator):
    writer = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    resource = writer.send(new_appendable(ZONAL_BUCKET, "live")).recv().resource
    writer.send(data_message(0, b"early", state_lookup=True))
    assert writer.recv().persisted_size == 5
    reader, first = open_read(raw, ZONAL_BUCKET, "live")
    assert first.metadata.size == 5 and not first.metadata.HasField("finalize_time")
    assert not first.metadata.checksums.HasField("crc32c")
    writer.send(data_message(5, b" and late", state_lookup=True))
    assert writer.recv().persisted_size == 14
    reader.send(S.BidiReadObjectRequest(read_ranges=[S.ReadRange(read_offset=5, read_id=9)]))
    assert assemble(collect_ranges(reader.rest())[9], 5) == b" and late"
    writer.send(S.BidiWriteObjectRequest(finish_write=True))
    assert writer.recv().resource.generation == resource.generation
    assert writer.rest() == []


# ---------------------------------------------------------------- BidiWriteObject

def test_write_lifecycle_and_exact_responses(raw, emulator):
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    opened = stream.send(new_appendable(ZONAL_BUCKET, "w")).recv()
    assert opened.resource.generation and opened.resource.size == 0 and opened.write_handle.handle
    chunk = os.urandom(2 * MiB)
    stream.send(data_message(0, chunk))                      # plain data: no response
    stream.send(data_message(2 * MiB, b"tail"))
    stream.send(data_message(2 * MiB, b"tail"))              # resent: skipped
    stream.send(S.BidiWriteObjectRequest(flush=True))        # flush alone: no response
    stream.send(S.BidiWriteObjectRequest(state_lookup=True))
    status = stream.recv()
    assert status.persisted_size == 2 * MiB + 4
    assert status.persisted_data_checksums.crc32c == google_crc32c.value(chunk + b"tail")
    # Half-close: exactly one more response (the persisted size), then OK.
    (last,) = stream.rest()
    assert last.persisted_size == 2 * MiB + 4
    assert emulator.object_info(ZONAL_BUCKET, "w")["finalized"] is False

    resumed = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    reply = resumed.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(
        ZONAL_BUCKET, "w", opened.resource.generation, opened.write_handle.handle))).recv()
    assert reply.resource.size == 2 * MiB + 4
    whole = chunk + b"tail" + b"!"
    resumed.send(data_message(2 * MiB + 4, b"!", finish_write=True,
                              object_checksums=S.ObjectChecksums(crc32c=google_crc32c.value(whole))))
    final = resumed.recv().resource
    assert final.size == len(whole) and final.finalize_time.seconds > 0
    assert final.checksums.crc32c == google_crc32c.value(whole)
    assert resumed.rest() == []  # nothing after finish_write
    assert emulator.read_object(ZONAL_BUCKET, "w") == whole


def test_write_offset_gap_and_bad_checksums(raw, emulator):
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(new_appendable(ZONAL_BUCKET, "gap")).recv()
    stream.send(data_message(0, b"abc"))
    stream.send(data_message(10, b"def"))
    expect_error(Code.OUT_OF_RANGE, stream.rest)

    # The failed stream persists nothing more, and says why when the client
    # next waits for a reply.
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(new_appendable(ZONAL_BUCKET, "crc")).recv()
    stream.send(data_message(0, b"abc", crc=12345))
    stream.send(data_message(0, b"abc"))
    stream.send(S.BidiWriteObjectRequest(state_lookup=True))
    error = expect_error(Code.INVALID_ARGUMENT, stream.recv)
    assert "crc32c" in error.details()
    assert emulator.object_info(ZONAL_BUCKET, "crc")["size"] == 0

    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(new_appendable(ZONAL_BUCKET, "crc2")).recv()
    stream.send(data_message(0, b"abc"))
    stream.send(S.BidiWriteObjectRequest(finish_write=True, object_checksums=S.ObjectChecksums(crc32c=1)))
    expect_error(Code.INVALID_ARGUMENT, stream.rest)


def test_single_writer_fencing(raw, emulator):
    first = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    opened = first.send(new_appendable(ZONAL_BUCKET, "one-writer")).recv()
    first.send(data_message(0, b"first ", state_lookup=True))
    assert first.recv().persisted_size == 6
    generation, old_handle = opened.resource.generation, opened.write_handle.handle

    second = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    taken = second.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(
        ZONAL_BUCKET, "one-writer", generation))).recv()
    assert taken.write_handle.handle != old_handle

    first.send(data_message(6, b"too late"))  # the old writer's next message fails
    error = expect_error(Code.FAILED_PRECONDITION, first.rest)
    assert "writer" in error.details()

    stale = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stale.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(ZONAL_BUCKET, "one-writer", generation,
                                                                       old_handle)))
    expect_error(Code.FAILED_PRECONDITION, stale.recv)

    second.send(data_message(6, b"second", state_lookup=True))
    assert second.recv().persisted_size == 12
    second.rest()
    assert emulator.read_object(ZONAL_BUCKET, "one-writer") == b"first second"


def test_write_preconditions_and_refusals(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "exists", b"x")
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(new_appendable(ZONAL_BUCKET, "exists", if_generation_match=0))
    expect_error(Code.FAILED_PRECONDITION, stream.recv)

    # No precondition: a new generation replaces the object.
    old = emulator.object_info(ZONAL_BUCKET, "exists")["generation"]
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    assert stream.send(new_appendable(ZONAL_BUCKET, "exists")).recv().resource.generation > old
    stream.rest()

    final_generation = emulator.seed(ZONAL_BUCKET, "final", b"done")
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(ZONAL_BUCKET, "final", final_generation)))
    expect_error(Code.FAILED_PRECONDITION, stream.recv)

    for bucket in (HNS_BUCKET, FLAT_BUCKET):
        stream = raw.stream("BidiWriteObject", bucket)
        stream.send(new_appendable(bucket, "not-here"))
        expect_error(Code.FAILED_PRECONDITION, stream.recv)

    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    stream.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(ZONAL_BUCKET, "missing", 123)))
    expect_error(Code.NOT_FOUND, stream.recv)


@pytest.mark.parametrize("case", ["no-first-message", "upload-id", "second-spec", "after-finish", "forged-handle"])
def test_malformed_write_requests(raw, emulator, case):
    stream = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    expected = Code.INVALID_ARGUMENT
    if case == "no-first-message":
        stream.send(data_message(0, b"x"))
    elif case == "upload-id":
        stream.send(S.BidiWriteObjectRequest(upload_id="abc"))
        expected = Code.NOT_FOUND
    elif case == "forged-handle":
        generation = emulator.seed(ZONAL_BUCKET, "u", b"", finalize=False)
        stream.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(ZONAL_BUCKET, "u", generation, b"junk")))
    else:
        stream.send(new_appendable(ZONAL_BUCKET, "m")).recv()
        if case == "second-spec":
            stream.send(new_appendable(ZONAL_BUCKET, "m"))
        else:
            stream.send(S.BidiWriteObjectRequest(finish_write=True)).recv()
            stream.send(data_message(0, b"x"))
    expect_error(expected, stream.rest)


_NAME_PLACEHOLDER = "name-\x01\x02"  # replaced on the wire by bytes that are not UTF-8
_NOT_UTF8 = b"name-\xff\xfe"


def _with_a_name_not_utf8(message) -> bytes:
    data = message.SerializeToString()
    assert data.count(_NAME_PLACEHOLDER.encode()) == 1
    return data.replace(_NAME_PLACEHOLDER.encode(), _NOT_UTF8)


@pytest.mark.parametrize("method", ["WriteObject", "BidiWriteObject", "GetObject", "BidiReadObject",
                                    "DeleteObject"])
def test_an_object_name_that_is_not_utf8_is_an_invalid_argument(emulator, method):
    """A str cannot hold such a name (the official client refuses to send it):
    these requests are built byte by byte. No request, parsed or not, is an
    emulator bug (see ``no_server_errors_logged``)."""
    bucket = ZONAL_BUCKET
    if method == "WriteObject":
        first = S.WriteObjectRequest(write_object_spec=S.WriteObjectSpec(
            resource=S.Object(name=_NAME_PLACEHOLDER, bucket=bucket_path(bucket))),
            checksummed_data=S.ChecksummedData(content=b"x"), finish_write=True)
    elif method == "BidiWriteObject":
        first = new_appendable(bucket, _NAME_PLACEHOLDER)
    elif method == "BidiReadObject":
        first = S.BidiReadObjectRequest(read_object_spec=read_spec(bucket, _NAME_PLACEHOLDER))
    else:
        first = getattr(S, f"{method}Request")(bucket=bucket_path(bucket), object=_NAME_PLACEHOLDER)
    wire_method = wire.STORAGE_METHODS[method]
    channel = grpc.insecure_channel(emulator.endpoint)
    try:
        call = getattr(channel, wire_method.kind)(wire_method.path, request_serializer=lambda data: data,
                                                   response_deserializer=wire_method.response.FromString)
        request = _with_a_name_not_utf8(first)
        headers = [wire.routing_header(bucket)]
        if wire_method.kind.startswith("unary_"):
            expect_error(Code.INVALID_ARGUMENT, call, request, metadata=headers, timeout=30)
        else:
            expect_error(Code.INVALID_ARGUMENT, call, iter([request]), metadata=headers, timeout=30)
    finally:
        channel.close()
    assert emulator.object_info(bucket, _NAME_PLACEHOLDER) is None


# ---------------------------------------------------------------- WriteObject / ReadObject

def test_write_object_and_read_object(raw, emulator):
    data = os.urandom(5 * MiB + 11)
    spec = S.WriteObjectSpec(resource=S.Object(name="whole", bucket=bucket_path(HNS_BUCKET), metadata={"a": "b"}),
                             if_generation_match=0)
    requests = [S.WriteObjectRequest(write_object_spec=spec)]
    for offset in range(0, len(data), 2 * MiB):
        piece = data[offset:offset + 2 * MiB]
        requests.append(S.WriteObjectRequest(write_offset=offset, checksummed_data=S.ChecksummedData(
            content=piece, crc32c=google_crc32c.value(piece))))
    requests[-1].finish_write = True
    requests[-1].object_checksums.crc32c = google_crc32c.value(data)
    resource = raw.write_object(requests, HNS_BUCKET).resource
    assert (resource.size, dict(resource.metadata)) == (len(data), {"a": "b"})
    assert resource.checksums.crc32c == google_crc32c.value(data)
    expect_error(Code.FAILED_PRECONDITION, raw.write_object, requests, HNS_BUCKET)  # if_generation_match=0

    responses = raw.read_object(S.ReadObjectRequest(bucket=bucket_path(HNS_BUCKET), object="whole",
                                                    read_offset=MiB, read_limit=3 * MiB), HNS_BUCKET)
    first = responses[0]
    assert (first.metadata.size, first.content_range.start, first.content_range.end) == (len(data), MiB, 4 * MiB)
    assert first.object_checksums.crc32c == google_crc32c.value(data)
    body = b"".join(r.checksummed_data.content for r in responses)
    assert body == data[MiB:4 * MiB]
    assert all(r.checksummed_data.crc32c == google_crc32c.value(r.checksummed_data.content) for r in responses)
    tail = raw.read_object(S.ReadObjectRequest(bucket=bucket_path(HNS_BUCKET), object="whole", read_offset=-3),
                           HNS_BUCKET)
    assert b"".join(r.checksummed_data.content for r in tail) == data[-3:]
    expect_error(Code.OUT_OF_RANGE, raw.read_object, S.ReadObjectRequest(
        bucket=bucket_path(HNS_BUCKET), object="whole", read_offset=len(data) + 1), HNS_BUCKET)


def test_write_object_needs_finish_write_and_good_checksums(raw, emulator):
    spec = S.WriteObjectSpec(resource=S.Object(name="partial", bucket=bucket_path(FLAT_BUCKET)))
    unfinished = [S.WriteObjectRequest(write_object_spec=spec, checksummed_data=S.ChecksummedData(content=b"abc"))]
    expect_error(Code.INVALID_ARGUMENT, raw.write_object, unfinished, FLAT_BUCKET)
    wrong = [S.WriteObjectRequest(write_object_spec=spec, checksummed_data=S.ChecksummedData(content=b"abc"),
                                  finish_write=True, object_checksums=S.ObjectChecksums(crc32c=7))]
    expect_error(Code.INVALID_ARGUMENT, raw.write_object, wrong, FLAT_BUCKET)
    assert emulator.object_info(FLAT_BUCKET, "partial") is None


# ---------------------------------------------------------------- unary object RPCs

def test_get_object_preconditions(raw, emulator):
    generation = emulator.seed(FLAT_BUCKET, "g", b"x")
    base = dict(bucket=bucket_path(FLAT_BUCKET), object="g")
    assert raw.unary("GetObject", S.GetObjectRequest(**base, if_generation_match=generation)).generation == generation
    for condition in (dict(if_generation_match=generation + 1), dict(if_generation_not_match=generation),
                      dict(if_metageneration_match=2), dict(if_metageneration_not_match=1)):
        expect_error(Code.FAILED_PRECONDITION, raw.unary, "GetObject", S.GetObjectRequest(**base, **condition))
    expect_error(Code.NOT_FOUND, raw.unary, "GetObject", S.GetObjectRequest(**base, generation=generation + 1))
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "GetObject", S.GetObjectRequest(bucket=base["bucket"]))


def test_delete_update_move_and_compose(raw, emulator):
    generation = emulator.seed(HNS_BUCKET, "d", b"x")
    expect_error(Code.FAILED_PRECONDITION, raw.unary, "DeleteObject", S.DeleteObjectRequest(
        bucket=bucket_path(HNS_BUCKET), object="d", if_generation_match=generation + 1))
    raw.unary("DeleteObject", S.DeleteObjectRequest(bucket=bucket_path(HNS_BUCKET), object="d"))
    assert emulator.object_info(HNS_BUCKET, "d") is None

    emulator.seed(HNS_BUCKET, "u", b"x", metadata={"keep": "1", "drop": "2"})
    update = S.UpdateObjectRequest(object=S.Object(bucket=bucket_path(HNS_BUCKET), name="u", metadata={"new": "3"}))
    update.update_mask.paths.extend(["metadata.new", "metadata.drop"])
    updated = raw.unary("UpdateObject", update)
    assert (dict(updated.metadata), updated.metageneration) == ({"keep": "1", "new": "3"}, 2)
    update.update_mask.paths[:] = ["acl"]
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "UpdateObject", update)

    emulator.seed(HNS_BUCKET, "taken", b"t")
    move = S.MoveObjectRequest(bucket=bucket_path(HNS_BUCKET), source_object="u", destination_object="dir/moved",
                               if_generation_match=0)
    moved = raw.unary("MoveObject", move)
    assert moved.name == "dir/moved" and emulator.read_object(HNS_BUCKET, "dir/moved") == b"x"
    expect_error(Code.NOT_FOUND, raw.unary, "MoveObject", move)
    expect_error(Code.FAILED_PRECONDITION, raw.unary, "MoveObject", S.MoveObjectRequest(
        bucket=bucket_path(HNS_BUCKET), source_object="dir/moved", destination_object="taken", if_generation_match=0))

    emulator.seed(HNS_BUCKET, "part-1", b"hello ")
    emulator.seed(HNS_BUCKET, "part-2", b"world")
    compose = S.ComposeObjectRequest(destination=S.Object(bucket=bucket_path(HNS_BUCKET), name="joined"),
                                     source_objects=[S.ComposeObjectRequest.SourceObject(name="part-1"),
                                                     S.ComposeObjectRequest.SourceObject(name="part-2")],
                                     delete_source_objects=True)
    compose.object_checksums.crc32c = google_crc32c.value(b"hello world")
    joined = raw.unary("ComposeObject", compose)
    assert joined.size == 11 and emulator.read_object(HNS_BUCKET, "joined") == b"hello world"
    assert emulator.object_info(HNS_BUCKET, "part-1") is None


def test_list_objects_over_grpc(raw, emulator):
    for name in ("a/1", "a/2", "a/", "b", "c/d/e"):
        emulator.seed(HNS_BUCKET, name, b"")
    raw.unary("CreateFolder", C.CreateFolderRequest(parent=bucket_path(HNS_BUCKET), folder_id="empty"))
    request = S.ListObjectsRequest(parent=bucket_path(HNS_BUCKET), delimiter="/", include_trailing_delimiter=True,
                                   include_folders_as_prefixes=True)
    listing = raw.unary("ListObjects", request, HNS_BUCKET)
    assert [o.name for o in listing.objects] == ["a/", "b"]
    assert list(listing.prefixes) == ["a/", "c/", "empty/"]
    expect_error(Code.UNIMPLEMENTED, raw.unary, "ListObjects",
                 S.ListObjectsRequest(parent=bucket_path(HNS_BUCKET), match_glob="**"))
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "ListObjects",
                 S.ListObjectsRequest(parent=bucket_path(HNS_BUCKET), page_token="garbage"))


def test_listing_100k_objects_pages_quickly(raw, emulator):
    emulator.seed_many(FLAT_BUCKET, {f"d{index % 100:02d}/obj-{index:06d}": b"" for index in range(100_000)})
    top = raw.unary("ListObjects", S.ListObjectsRequest(parent=bucket_path(FLAT_BUCKET), delimiter="/"))
    assert len(top.prefixes) == 100 and not top.objects and not top.next_page_token
    one_dir, token, pages = [], "", 0
    while True:
        page = raw.unary("ListObjects", S.ListObjectsRequest(parent=bucket_path(FLAT_BUCKET), prefix="d42/",
                                                             page_size=300, page_token=token))
        assert len(page.objects) <= 300
        one_dir += [o.name for o in page.objects]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert len(one_dir) == 1000 and pages == 4 and one_dir == sorted(one_dir)
    # The full listing, 1000 per page, in order.
    total, token, previous = 0, "", ""
    while True:
        page = raw.unary("ListObjects", S.ListObjectsRequest(parent=bucket_path(FLAT_BUCKET), page_token=token))
        assert 0 < len(page.objects) <= 1000 and page.objects[0].name > previous
        total += len(page.objects)
        previous = page.objects[-1].name
        token = page.next_page_token
        if not token:
            break
    assert total == 100_000


# ---------------------------------------------------------------- StorageControl

def test_folder_rpcs(raw, emulator):
    parent = bucket_path(ZONAL_BUCKET)
    expect_error(Code.FAILED_PRECONDITION, raw.unary, "CreateFolder",
                 C.CreateFolderRequest(parent=parent, folder_id="x/y/"))
    made = raw.unary("CreateFolder", C.CreateFolderRequest(parent=parent, folder_id="x/y", recursive=True))
    assert made.name == f"{parent}/folders/x/y/"
    expect_error(Code.ALREADY_EXISTS, raw.unary, "CreateFolder", C.CreateFolderRequest(parent=parent, folder_id="x/"))
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "CreateFolder",
                 C.CreateFolderRequest(parent=parent, folder_id="z" * 600 + "/"))
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "CreateFolder",
                 C.CreateFolderRequest(parent=parent, folder_id="a/" * 51, recursive=True))
    expect_error(Code.INVALID_ARGUMENT, raw.unary, "GetFolder", C.GetFolderRequest(name=parent + "/no-folders-here"))
    emulator.seed(ZONAL_BUCKET, "x/y/file", b"f")
    expect_error(Code.FAILED_PRECONDITION, raw.unary, "DeleteFolder", C.DeleteFolderRequest(name=f"{parent}/folders/x/y/"))
    operation = raw.unary("RenameFolder", C.RenameFolderRequest(name=f"{parent}/folders/x/", destination_folder_id="w/"))
    assert operation.done
    assert operation.response.type_url == "type.googleapis.com/google.storage.control.v2.Folder"
    assert operation.metadata.type_url == "type.googleapis.com/google.storage.control.v2.RenameFolderMetadata"
    folder = C.Folder.FromString(operation.response.value)
    assert folder.name == f"{parent}/folders/w/"
    assert emulator.read_object(ZONAL_BUCKET, "w/y/file") == b"f"
    listing = raw.unary("ListFolders", C.ListFoldersRequest(parent=parent, prefix="w/", delimiter="/"))
    assert [f.name.rsplit("/folders/", 1)[1] for f in listing.folders] == ["w/", "w/y/"]


def test_folder_rpcs_fail_on_a_flat_bucket(raw):
    parent = bucket_path(FLAT_BUCKET)
    for name, request in (("CreateFolder", C.CreateFolderRequest(parent=parent, folder_id="a/")),
                          ("GetFolder", C.GetFolderRequest(name=f"{parent}/folders/a/")),
                          ("DeleteFolder", C.DeleteFolderRequest(name=f"{parent}/folders/a/")),
                          ("ListFolders", C.ListFoldersRequest(parent=parent)),
                          ("RenameFolder", C.RenameFolderRequest(name=f"{parent}/folders/a/", destination_folder_id="b/"))):
        expect_error(Code.FAILED_PRECONDITION, raw.unary, name, request)
    layout = raw.unary("GetStorageLayout", C.GetStorageLayoutRequest(name=parent + "/storageLayout"))
    assert layout.location_type == "region" and not layout.hierarchical_namespace.enabled


# ---------------------------------------------------------------- latency and faults

def test_latency_delays_replies(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "slow", b"x" * 100)
    request = S.GetObjectRequest(bucket=bucket_path(ZONAL_BUCKET), object="slow")
    raw.unary("GetObject", request)  # connect first
    emulator.set_latency(150)
    started = time.monotonic()
    raw.unary("GetObject", request)
    assert time.monotonic() - started >= 0.15
    started = time.monotonic()
    # Ranges in the first message ride on the open's round trip, as on the real service.
    stream, _ = open_read(raw, ZONAL_BUCKET, "slow", [S.ReadRange(read_id=1)])
    stream.rest()
    assert time.monotonic() - started >= 0.15
    emulator.set_latency(0)
    started = time.monotonic()
    raw.unary("GetObject", request)
    assert time.monotonic() - started < 0.15


def _failure_pattern(seed: int, calls: int = 40) -> list[bool]:
    with Emulator(buckets={ZONAL_BUCKET: "zonal"}, seed=seed,
                  faults=["unavailable:rate=0.5,method=GetObject"]) as emu:
        emu.seed(ZONAL_BUCKET, "o", b"x")
        client = Raw(emu.endpoint)
        pattern = []
        for _ in range(calls):
            try:
                client.unary("GetObject", S.GetObjectRequest(bucket=bucket_path(ZONAL_BUCKET), object="o"))
                pattern.append(False)
            except grpc.RpcError as error:
                assert error.code() == Code.UNAVAILABLE
                pattern.append(True)
        client.unary("GetBucket", S.GetBucketRequest(name=bucket_path(ZONAL_BUCKET)))  # other methods pass
        client.close()
        return pattern


def test_faults_are_deterministic_with_a_seed():
    first, again, other = _failure_pattern(7), _failure_pattern(7), _failure_pattern(8)
    assert first == again
    assert first != other
    assert 5 < sum(first) < 35


def test_outage_and_corruption_faults(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "o", b"payload")
    emulator.add_fault("outage")
    expect_error(Code.UNAVAILABLE, raw.unary, "GetBucket", S.GetBucketRequest(name=bucket_path(ZONAL_BUCKET)))
    expect_error(Code.UNAVAILABLE, raw.unary, "ListObjects", S.ListObjectsRequest(parent=bucket_path(ZONAL_BUCKET)))
    emulator.clear_faults()
    raw.unary("GetBucket", S.GetBucketRequest(name=bucket_path(ZONAL_BUCKET)))

    emulator.add_fault("corrupt-read:object=o")
    stream, _ = open_read(raw, ZONAL_BUCKET, "o", [S.ReadRange(read_id=1), S.ReadRange(read_id=2)])
    chunks = [part for parts in collect_ranges(stream.rest()).values() for part in parts]
    corrupted = [part for part in chunks
                 if part.checksummed_data.crc32c != google_crc32c.value(part.checksummed_data.content)]
    assert len(corrupted) == 1  # count defaults to 1


def test_broken_read_fault_cuts_the_stream_exactly(raw, emulator):
    data = os.urandom(3 * MiB)
    emulator.seed(ZONAL_BUCKET, "o", data)
    emulator.add_fault("broken-read:after=1000000")
    stream, _ = open_read(raw, ZONAL_BUCKET, "o", [S.ReadRange(read_id=1)])
    stream.half_close()
    received = b""
    with pytest.raises(grpc.RpcError) as caught:
        for response in stream.call:
            received += b"".join(d.checksummed_data.content for d in response.object_data_ranges)
    assert caught.value.code() == Code.UNAVAILABLE
    assert received == data[:1_000_000]


def test_broken_read_fault_counts_bytes_across_concurrent_ranges(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "o", os.urandom(8 * MiB))
    emulator.add_fault("broken-read:after=3000000")
    ranges = [S.ReadRange(read_offset=index * MiB, read_length=MiB, read_id=index + 1) for index in range(8)]
    stream, _ = open_read(raw, ZONAL_BUCKET, "o", ranges)
    stream.half_close()
    received = 0
    with pytest.raises(grpc.RpcError) as caught:
        for response in stream.call:
            received += sum(len(d.checksummed_data.content) for d in response.object_data_ranges)
    assert caught.value.code() == Code.UNAVAILABLE
    assert received == 3_000_000


def test_redirect_requires_the_routing_token_on_retry(raw, emulator):
    emulator.seed(ZONAL_BUCKET, "o", b"x")
    emulator.add_fault("redirect-read:token=tok-1")
    stream, _ = None, None
    stream = raw.stream("BidiReadObject", ZONAL_BUCKET)
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "o")))
    error = expect_error(Code.ABORTED, stream.recv)
    redirect = wire.unpack_details(error.trailing_metadata(), S.BidiReadObjectRedirectedError)
    assert redirect[S.BidiReadObjectRedirectedError].routing_token == "tok-1"
    # A retry that ignores the token is redirected again.
    stream = raw.stream("BidiReadObject", ZONAL_BUCKET)
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "o")))
    expect_error(Code.ABORTED, stream.recv)
    stream = raw.stream("BidiReadObject", metadata=[wire.routing_header(ZONAL_BUCKET, "tok-1")])
    stream.send(S.BidiReadObjectRequest(read_object_spec=read_spec(ZONAL_BUCKET, "o")))
    assert stream.recv().metadata.name == "o"
    stream.rest()

    emulator.add_fault("redirect-write:token=wtok")
    writer = raw.stream("BidiWriteObject", ZONAL_BUCKET)
    writer.send(new_appendable(ZONAL_BUCKET, "redirected"))
    error = expect_error(Code.ABORTED, writer.recv)
    detail = wire.unpack_details(error.trailing_metadata(), S.BidiWriteObjectRedirectedError)[
        S.BidiWriteObjectRedirectedError]
    assert detail.routing_token == "wtok" and detail.generation and detail.write_handle.handle
    retry = raw.stream("BidiWriteObject", metadata=[wire.routing_header(ZONAL_BUCKET, "wtok")])
    reply = retry.send(S.BidiWriteObjectRequest(append_object_spec=append_spec(
        ZONAL_BUCKET, "redirected", detail.generation, detail.write_handle.handle))).recv()
    assert reply.resource.generation == detail.generation
    retry.rest()


@pytest.mark.parametrize("spec", ["nonsense", "broken-read", "broken-read:after=x", "unavailable:rate=2",
                                  "outage:bogus=1", "redirect-read:method=GetObject", "unavailable:count=0",
                                  "unavailable:method=GetObjekt",
                                  "corrupt-read:rate"])
def test_bad_fault_specs_are_rejected(emulator, spec):
    with pytest.raises(FaultSpecError):
        emulator.add_fault(spec)


# ---------------------------------------------------------------- the CLI

def _emulator_command() -> list[str]:
    script = Path(sys.executable).with_name("rapidmount-emulator")
    return [str(script)] if script.exists() else [sys.executable, "-m", "rapidmount.emulator"]


def _start_cli(*args: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(_emulator_command() + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    line = process.stdout.readline()
    match = re.fullmatch(r"listening on 127\.0\.0\.1:(\d+)\n", line)
    if not match:
        process.kill()
        raise AssertionError(f"unexpected first line {line!r}; stderr: {process.stderr.read()}")
    return process, f"127.0.0.1:{match.group(1)}"


def test_cli_serves_and_stops_cleanly_on_sigterm():
    process, endpoint = _start_cli("--port", "0", "--bucket", "cli-bucket:hns", "--latency", "1", "--seed", "3",
                                   "--fault", "unavailable:rate=0.01,method=ListObjects")
    try:
        client = Raw(endpoint)
        bucket = client.unary("GetBucket", S.GetBucketRequest(name=bucket_path("cli-bucket")))
        assert bucket.hierarchical_namespace.enabled and bucket.location_type == "region"
        client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        assert process.stdout.read() == ""  # exactly one line on stdout
        assert "Traceback" not in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()


def test_cli_stops_on_sigterm_with_streams_open_without_a_traceback():
    """Calls still open at a stop are cancelled after the grace period; grpc
    would log each as an unhandled CancelledError with a traceback."""
    process, endpoint = _start_cli("--port", "0", "--bucket", "open-bucket", "--stream-bandwidth", "100000")
    client = Raw(endpoint)
    try:
        writes = client.stream("BidiWriteObject", "open-bucket")
        writes.send(new_appendable("open-bucket", "log")).recv()
        writes.send(data_message(0, b"x" * MiB, flush=True, state_lookup=True))
        assert writes.recv().persisted_size == MiB  # then idle, waiting for more
        for _ in range(4):
            open_read(client, "open-bucket", "log", [S.ReadRange(read_id=1)])  # paced: seconds to go
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        stderr = process.stderr.read()
        assert "Traceback" not in stderr and "CancelledError" not in stderr, stderr
    finally:
        client.close()
        if process.poll() is None:
            process.kill()


def test_cli_data_dir_keeps_flushed_data_after_a_kill(tmp_path):
    process, endpoint = _start_cli("--data-dir", str(tmp_path), "--bucket", "kept-bucket")
    try:
        client = Raw(endpoint)
        stream = client.stream("BidiWriteObject", "kept-bucket")
        stream.send(new_appendable("kept-bucket", "durable")).recv()
        stream.send(data_message(0, b"acknowledged bytes", flush=True, state_lookup=True))
        assert stream.recv().persisted_size == 18
        process.send_signal(signal.SIGKILL)  # no clean shutdown
        process.wait(timeout=20)
        client.close()
    finally:
        if process.poll() is None:
            process.kill()
    process, endpoint = _start_cli("--data-dir", str(tmp_path), "--bucket", "kept-bucket")
    try:
        client = Raw(endpoint)
        stream, first = open_read(client, "kept-bucket", "durable", [S.ReadRange(read_id=1)])
        assert first.metadata.size == 18
        assert assemble(collect_ranges(stream.rest())[1], 0) == b"acknowledged bytes"
        client.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.parametrize("args", [["--port", "http"], ["--bucket", "x:weird"], ["--fault", "nope"],
                                  ["--latency", "-1"], ["--unknown"], ["--bucket", "BAD_NAME"]])
def test_cli_rejects_bad_flags_with_one_line(args):
    result = subprocess.run(_emulator_command() + args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rapidmount-emulator: error:"), result.stderr


# ---------------------------------------------------------------- async entry points

def _bucket_kind(endpoint: str, bucket: str) -> str:
    client = Raw(endpoint)
    try:
        return client.unary("GetStorageLayout", C.GetStorageLayoutRequest(
            name=f"{bucket_path(bucket)}/storageLayout")).location_type
    finally:
        client.close()


@pytest.mark.trio
async def test_emulator_running_under_trio():
    import trio

    async with emulator_running(buckets={"trio-bucket": "zonal"}) as emu:
        emu.seed("trio-bucket", "o", b"x")
        assert await trio.to_thread.run_sync(_bucket_kind, emu.endpoint, "trio-bucket") == "zone"
        assert emu.read_object("trio-bucket", "o") == b"x"
    assert emu.store is None  # stopped on exit


def test_emulator_running_under_asyncio():
    import asyncio

    async def scenario():
        async with emulator_running(buckets={"aio-bucket": "flat"}) as emu:
            return await asyncio.to_thread(_bucket_kind, emu.endpoint, "aio-bucket")

    assert asyncio.run(scenario()) == "region"


def test_cli_rejects_a_busy_port_and_an_unusable_data_dir(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        not_a_directory = tmp_path / "file"
        not_a_directory.write_bytes(b"")
        for args in (["--port", port], ["--data-dir", str(not_a_directory)]):
            result = subprocess.run(_emulator_command() + args, capture_output=True, text=True, timeout=60)
            assert result.returncode == 2 and result.stdout == ""
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("rapidmount-emulator: error:"), result.stderr


def test_cli_starts_again_on_a_port_its_last_connections_left_in_time_wait():
    """A restarted emulator reuses its port: the side that closes first (a
    stopping server) leaves its connections in TIME_WAIT on that port."""
    import socket

    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's end closes first: TIME_WAIT on the port
        client.close()
    process = subprocess.Popen(_emulator_command() + ["--port", str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.strip() == f"listening on 127.0.0.1:{port}", process.stderr.read() if not line else line
    finally:
        stop_process(process, timeout=10)
