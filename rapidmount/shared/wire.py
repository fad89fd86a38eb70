"""The Storage v2 wire: method paths, message classes, error details, headers.

rapidmount's protobuf messages live in a private package (see
``protos/rapidmount/storage_v2.proto``); this module binds them to the real
``google.storage.v2`` method paths and ``Any`` type URLs, so the emulator, the
mount and Google's official client all speak the same wire in one process.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any as _AnyType
from typing import TypeAlias

import google_crc32c
from google.protobuf import any_pb2, empty_pb2
from google.longrunning import operations_pb2
from google.rpc import status_pb2

from rapidmount._proto import storage_control_v2_pb2 as control
from rapidmount._proto import storage_v2_pb2 as storage

__all__ = [
    "storage", "control", "operations_pb2", "empty_pb2", "status_pb2",
    "STORAGE_SERVICE", "CONTROL_SERVICE", "Method", "STORAGE_METHODS", "CONTROL_METHODS",
    "MAX_CHUNK_BYTES", "type_url", "pack_detail", "unpack_details", "status_details_trailer",
    "parse_routing_params", "routing_header", "bucket_resource", "bucket_from_resource",
    "crc32c", "crc32c_extend", "crc32c_combine", "encode_varint", "GRPC_MESSAGE_OPTIONS", "Metadata",
]

STORAGE_SERVICE = "google.storage.v2.Storage"
CONTROL_SERVICE = "google.storage.control.v2.StorageControl"

# ServiceConstants.MAX_READ_CHUNK_BYTES / MAX_WRITE_CHUNK_BYTES.
MAX_CHUNK_BYTES = 2 * 1024 * 1024

# Chunks are at most 2 MiB, but a response may carry several; allow headroom.
GRPC_MESSAGE_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

#: A call's metadata as grpc gives it: (key, value) pairs; a ``-bin`` key's value is ``bytes``.
Metadata: TypeAlias = Iterable[tuple[str, str | bytes]]

_TYPE_URL_PREFIX = "type.googleapis.com/"
# Our private proto package maps to the public one for type URLs.
_PACKAGE_MAP = {
    "rapidmount.wire.storage.v2.": "google.storage.v2.",
    "rapidmount.wire.storage.control.v2.": "google.storage.control.v2.",
}


@dataclass(frozen=True)
class Method:
    """One RPC: its wire path, its kind and its message classes."""

    service: str
    name: str
    kind: str  # "unary_unary" | "unary_stream" | "stream_unary" | "stream_stream"
    request: type[_AnyType]  # a protobuf message class
    response: type[_AnyType]

    @property
    def path(self) -> str:
        return f"/{self.service}/{self.name}"


def _m(service: str, name: str, kind: str, request: type[_AnyType], response: type[_AnyType]) -> Method:
    return Method(service, name, kind, request, response)


STORAGE_METHODS: dict[str, Method] = {m.name: m for m in (
    _m(STORAGE_SERVICE, "GetBucket", "unary_unary", storage.GetBucketRequest, storage.Bucket),
    _m(STORAGE_SERVICE, "ComposeObject", "unary_unary", storage.ComposeObjectRequest, storage.Object),
    _m(STORAGE_SERVICE, "DeleteObject", "unary_unary", storage.DeleteObjectRequest, empty_pb2.Empty),
    _m(STORAGE_SERVICE, "GetObject", "unary_unary", storage.GetObjectRequest, storage.Object),
    _m(STORAGE_SERVICE, "UpdateObject", "unary_unary", storage.UpdateObjectRequest, storage.Object),
    _m(STORAGE_SERVICE, "ListObjects", "unary_unary", storage.ListObjectsRequest, storage.ListObjectsResponse),
    _m(STORAGE_SERVICE, "MoveObject", "unary_unary", storage.MoveObjectRequest, storage.Object),
    _m(STORAGE_SERVICE, "ReadObject", "unary_stream", storage.ReadObjectRequest, storage.ReadObjectResponse),
    _m(STORAGE_SERVICE, "WriteObject", "stream_unary", storage.WriteObjectRequest, storage.WriteObjectResponse),
    _m(STORAGE_SERVICE, "BidiReadObject", "stream_stream",
       storage.BidiReadObjectRequest, storage.BidiReadObjectResponse),
    _m(STORAGE_SERVICE, "BidiWriteObject", "stream_stream",
       storage.BidiWriteObjectRequest, storage.BidiWriteObjectResponse),
)}

CONTROL_METHODS: dict[str, Method] = {m.name: m for m in (
    _m(CONTROL_SERVICE, "CreateFolder", "unary_unary", control.CreateFolderRequest, control.Folder),
    _m(CONTROL_SERVICE, "DeleteFolder", "unary_unary", control.DeleteFolderRequest, empty_pb2.Empty),
    _m(CONTROL_SERVICE, "GetFolder", "unary_unary", control.GetFolderRequest, control.Folder),
    _m(CONTROL_SERVICE, "ListFolders", "unary_unary", control.ListFoldersRequest, control.ListFoldersResponse),
    _m(CONTROL_SERVICE, "RenameFolder", "unary_unary", control.RenameFolderRequest, operations_pb2.Operation),
    _m(CONTROL_SERVICE, "GetStorageLayout", "unary_unary",
       control.GetStorageLayoutRequest, control.StorageLayout),
)}


# ---------------------------------------------------------------- error details

def type_url(message_or_class: _AnyType) -> str:
    """The public type URL of one of our messages (or any other message)."""
    full_name: str = message_or_class.DESCRIPTOR.full_name
    for private, public in _PACKAGE_MAP.items():
        if full_name.startswith(private):
            full_name = public + full_name[len(private):]
            break
    return _TYPE_URL_PREFIX + full_name


def pack_detail(message: _AnyType) -> any_pb2.Any:
    return any_pb2.Any(type_url=type_url(message), value=message.SerializeToString())


def status_details_trailer(code: int, message: str, details: list[_AnyType]) -> tuple[tuple[str, bytes], ...]:
    """The ``grpc-status-details-bin`` trailer carrying a google.rpc.Status."""
    status = status_pb2.Status(code=code, message=message)
    for detail in details:
        status.details.append(pack_detail(detail))
    return (("grpc-status-details-bin", status.SerializeToString()),)


def unpack_details(trailing_metadata: Metadata | None, *classes: type[_AnyType]) -> dict[type, _AnyType]:
    """Find details of the given classes in a call's trailing metadata."""
    found: dict[type, _AnyType] = {}
    if not trailing_metadata:
        return found
    wanted = {type_url(cls): cls for cls in classes}
    for key, value in trailing_metadata:
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            cls = wanted.get(detail.type_url)
            if cls is not None:
                found[cls] = cls.FromString(detail.value)
    return found


# ---------------------------------------------------------------- routing headers

def bucket_resource(bucket: str) -> str:
    return f"projects/_/buckets/{bucket}"


def bucket_from_resource(resource: str) -> str | None:
    """``projects/_/buckets/NAME`` (any project) → ``NAME``; None if malformed."""
    parts = resource.split("/")
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "buckets" and parts[1] and parts[3]:
        return parts[3]
    return None


def parse_routing_params(metadata: Metadata | None) -> dict[str, str]:
    """Parse every ``x-goog-request-params`` value (URL-query encoded)."""
    params: dict[str, str] = {}
    for key, value in metadata or ():
        if key == "x-goog-request-params":
            if isinstance(value, bytes):
                value = value.decode()
            for name, values in urllib.parse.parse_qs(value, keep_blank_values=True).items():
                params[name] = values[-1]
    return params


def routing_header(bucket: str, routing_token: str | None = None) -> tuple[str, str]:
    params = [("bucket", bucket_resource(bucket))]
    if routing_token:
        params.append(("routing_token", routing_token))
    return ("x-goog-request-params", urllib.parse.urlencode(params, safe="/"))


# ---------------------------------------------------------------- protobuf varints

def encode_varint(value: int) -> bytes:
    """A protobuf varint; a negative int64 is its 10-byte two's complement."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# ---------------------------------------------------------------- checksums

# google-crc32c's C extension is untyped: its results are ints.

def crc32c(data: bytes | bytearray | memoryview) -> int:
    return int(google_crc32c.value(bytes(data) if not isinstance(data, bytes) else data))


def crc32c_extend(crc: int, data: bytes) -> int:
    return int(google_crc32c.extend(crc, data))


# CRC32C combine: the CRC of A+B from crc(A), crc(B) and len(B), so a writer
# checksums each byte once (for its chunk) and still knows the object's CRC.
# Appending n zero bytes to the CRC register is linear over GF(2); _ZEROS[k]
# is that operator for 2**k bytes, as 32 columns (column i: the image of bit i).

_CRC32C_POLY = 0x82F63B78  # reflected Castagnoli polynomial


def _gf2_apply(matrix: tuple[int, ...], vector: int) -> int:
    total = 0
    i = 0
    while vector:
        if vector & 1:
            total ^= matrix[i]
        vector >>= 1
        i += 1
    return total


def _gf2_square(matrix: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_gf2_apply(matrix, column) for column in matrix)


def _zero_operators(count: int) -> tuple[tuple[int, ...], ...]:
    one_bit = (_CRC32C_POLY, *(1 << i for i in range(31)))  # one zero bit through the register
    operator = one_bit
    for _ in range(3):  # 2, 4, then 8 bits: one byte
        operator = _gf2_square(operator)
    operators = [operator]
    for _ in range(count - 1):
        operators.append(_gf2_square(operators[-1]))
    return tuple(operators)


_ZEROS = _zero_operators(64)


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """CRC32C of ``A + B`` given ``crc32c(A)``, ``crc32c(B)`` and ``len(B)``."""
    if length_b < 0:
        raise ValueError("negative length")
    k = 0
    while length_b:
        if length_b & 1:
            crc_a = _gf2_apply(_ZEROS[k], crc_a)
        length_b >>= 1
        k += 1
    return crc_a ^ crc_b
