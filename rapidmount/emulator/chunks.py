"""Hand-encoded responses of the hot paths, returned to grpc as bytes.

``encode_range_chunk``: a ``BidiReadObjectResponse`` carrying one data
chunk. Building the message with protobuf copies the 2 MiB payload into the
message and again into the serialized bytes; here header, payload and
trailer are joined once.

``encode_list_objects`` and ``encode_read_open``: a ``ListObjectsResponse``
page and the first ``BidiReadObjectResponse`` of a stream, assembled from
the serialized ``Object`` resources the store keeps (``resources``): on the
wire an embedded message is ``tag, length, bytes``, and a repeated field is
its elements one after the other, so no message is built per object.

The bytes are exactly what upb's ``SerializeToString`` gives for the same
message (fields in number order, defaults omitted); tests compare the two.

    BidiReadObjectResponse { object_data_ranges (6): ObjectRangeData {
        checksummed_data (1): { content (1): bytes, crc32c (2): fixed32 }
        read_range (2): { read_offset (1), read_length (2), read_id (3): int64 }
        range_end (3): bool } }
"""

from __future__ import annotations

import struct

from rapidmount.shared.wire import encode_varint

_FIXED32 = struct.Struct("<I")
_TAG_RESPONSE_RANGES = b"\x32"   # field 6, length-delimited
_TAG_CHECKSUMMED_DATA = b"\x0a"  # field 1, length-delimited
_TAG_CONTENT = b"\x0a"           # field 1, length-delimited
_TAG_CRC32C = b"\x15"            # field 2, fixed32
_TAG_READ_RANGE = b"\x12"        # field 2, length-delimited
_RANGE_END = b"\x18\x01"         # field 3, varint 1


_SMALL_VARINTS = [encode_varint(value) for value in range(1 << 14)]  # every 1- and 2-byte varint


def _varint(value: int) -> bytes:
    return _SMALL_VARINTS[value] if 0 <= value < 16384 else encode_varint(value)


def _int_field(tag: int, value: int) -> bytes:
    return bytes((tag,)) + _varint(value) if value else b""


def encode_range_chunk(data: bytes, crc32c: int, read_offset: int, read_id: int, range_end: bool) -> bytes:
    """One serialized BidiReadObjectResponse with a single ObjectRangeData."""
    read_range = _int_field(0x08, read_offset) + _int_field(0x10, len(data)) + _int_field(0x18, read_id)
    content_header = _TAG_CONTENT + _varint(len(data)) if data else b""  # proto3 omits empty bytes
    checksummed_length = len(content_header) + len(data) + 5
    trailer = (_TAG_CRC32C + _FIXED32.pack(crc32c)
               + _TAG_READ_RANGE + _varint(len(read_range)) + read_range
               + (_RANGE_END if range_end else b""))
    range_data_length = 1 + len(_varint(checksummed_length)) + checksummed_length + len(trailer) - 5
    header = (_TAG_RESPONSE_RANGES + _varint(range_data_length)
              + _TAG_CHECKSUMMED_DATA + _varint(checksummed_length) + content_header)
    return b"".join((header, data, trailer))


_TAG_OBJECTS = b"\x0a"          # ListObjectsResponse.objects (1)
_TAG_PREFIXES = b"\x12"         # ListObjectsResponse.prefixes (2)
_TAG_NEXT_PAGE_TOKEN = b"\x1a"  # ListObjectsResponse.next_page_token (3)
_TAG_METADATA = b"\x22"         # BidiReadObjectResponse.metadata (4)
_TAG_READ_HANDLE = b"\x3a"      # BidiReadObjectResponse.read_handle (7)
_TAG_HANDLE = b"\x0a"           # BidiReadHandle.handle (1)


def encode_list_objects(resources: list[bytes], prefixes: list[str], next_page_token: str) -> bytes:
    """A serialized ListObjectsResponse from serialized ``Object``s."""
    varint = _varint
    parts: list[bytes] = []
    append = parts.append
    for resource in resources:
        append(_TAG_OBJECTS)
        append(varint(len(resource)))
        append(resource)
    for prefix in prefixes:
        encoded = prefix.encode()
        append(_TAG_PREFIXES)
        append(varint(len(encoded)))
        append(encoded)
    if next_page_token:
        encoded = next_page_token.encode()
        append(_TAG_NEXT_PAGE_TOKEN)
        append(varint(len(encoded)))
        append(encoded)
    return b"".join(parts)


def encode_read_open(resource: bytes | None, handle: bytes) -> bytes:
    """The first BidiReadObjectResponse of a stream: ``metadata`` (a
    serialized ``Object``; None for none) and ``read_handle``."""
    handle_message = (_TAG_HANDLE + _varint(len(handle)) + handle) if handle else b""
    metadata = b"" if resource is None else _TAG_METADATA + _varint(len(resource)) + resource
    return metadata + _TAG_READ_HANDLE + _varint(len(handle_message)) + handle_message
