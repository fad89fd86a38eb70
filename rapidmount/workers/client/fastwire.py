"""Zero-copy decoding of BidiReadObject data responses, and encoding of
BidiWriteObject data requests.

A data response is little more than chunks of object bytes. Decoding it with
protobuf copies every chunk into a new ``bytes``; on this kind of machine
touching fresh memory is the most expensive part of a read, so the hot path
decodes the few fields by hand and hands out ``memoryview`` slices of the
message instead. Anything unusual (a response carrying object metadata, a
field this decoder does not know) falls back to protobuf, so behaviour never
depends on this module, only speed does.

A data request is built the same way in reverse: one ``bytes`` of the
request's final size, its few header bytes written by hand, then the chunk
copied in once, straight from the pieces the writer holds (views of the
shared arena, or bytes read from the FUSE process's memory), then its
CRC32C, instead of copying it into a protobuf message and serializing that.

Wire format reference: a field is ``tag = (number << 3) | wire_type`` as a
varint, then a varint (type 0), 8 bytes (1), a length-prefixed run (2) or
4 bytes (5).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

from rapidmount.shared import peer_memory, wire
from rapidmount.shared.checksums import crc32c_of_slice
from rapidmount.shared.peer_memory import PeerBytes

#: A piece of a write's bytes: bytes, a view of the arena, or bytes of the FUSE process.
Piece: TypeAlias = bytes | memoryview | PeerBytes

_CONTENT_TAG = b"\x0a"      # ChecksummedData.content: field 1, length-delimited
_CRC_TAG = b"\x15"          # ChecksummedData.crc32c: field 2, fixed32
_OFFSET_TAG = b"\x18"       # BidiWriteObjectRequest.write_offset: field 3, varint
_DATA_TAG = b"\x22"         # BidiWriteObjectRequest.checksummed_data: field 4, length-delimited


def encode_write_data(write_offset: int, pieces: Sequence[Piece], length: int) -> tuple[bytes, int]:
    """The serialized ``BidiWriteObjectRequest(write_offset, checksummed_data(content, crc32c))``
    for ``length`` bytes given as ``pieces`` (buffers, or :class:`PeerBytes`
    read from the FUSE process), and the content's CRC32C: byte for byte what
    protobuf writes.

    The request is one ``bytes`` of its final size, filled in place: the
    header, each piece copied (or read from the other process) once, then one
    CRC32C pass over the content just written, then the checksum."""
    if write_offset < 0 or length <= 0:
        raise ValueError("a data request needs an offset and some bytes")
    inner = len(_CONTENT_TAG) + len(wire.encode_varint(length)) + length + len(_CRC_TAG) + 4
    head = b"".join((_OFFSET_TAG + wire.encode_varint(write_offset) if write_offset else b"",
                     _DATA_TAG, wire.encode_varint(inner), _CONTENT_TAG, wire.encode_varint(length)))
    size = len(head) + length + len(_CRC_TAG) + 4
    request = _new_bytes(size)
    base = peer_memory.address_of(request)
    ctypes.memmove(base, head, len(head))
    filled = 0
    for piece in pieces:
        n = len(piece) if isinstance(piece, (bytes, PeerBytes)) else memoryview(piece).nbytes
        if not n:
            continue
        if filled + n > length:
            raise ValueError(f"pieces of more than {length} bytes")
        _copy_to(base + len(head) + filled, piece)
        filled += n
    if filled != length:
        raise ValueError(f"pieces of {filled} bytes, not {length}")
    crc = crc32c_of_slice(request, len(head), len(head) + length)
    ctypes.memmove(base + len(head) + length, _CRC_TAG + crc.to_bytes(4, "little"), len(_CRC_TAG) + 4)
    return request, crc


_bytes_of_size = ctypes.pythonapi.PyBytes_FromStringAndSize
_bytes_of_size.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_of_size.restype = ctypes.py_object


def _new_bytes(size: int) -> bytes:
    """A new, uninitialised ``bytes`` of ``size``, to be filled before anyone
    else sees it (CPython's own way of building one)."""
    if size < 2:
        raise ValueError("bytes of 0 or 1 byte are shared; never filled")
    return cast(bytes, _bytes_of_size(None, size))  # a py_object result is untyped


def _copy_to(address: int, piece: Piece) -> None:
    """Copy a piece (a buffer, or bytes of the FUSE process) to ``address``."""
    if isinstance(piece, PeerBytes):
        piece.read_into(address)
        return
    if not isinstance(piece, bytes):
        view = memoryview(piece)
        if view.readonly or not view.c_contiguous:
            piece = bytes(view)  # no address to take: not a piece the writer keeps
        else:
            ctypes.memmove(address, ctypes.addressof(ctypes.c_char.from_buffer(view)), view.nbytes)
            return
    ctypes.memmove(address, piece, len(piece))


def passthrough_or_serialize(message: bytes | wire.storage.BidiWriteObjectRequest) -> bytes:
    """A request serializer for calls that send both protobuf messages and
    requests already encoded here."""
    if isinstance(message, bytes):
        return message
    serialized: bytes = message.SerializeToString()  # protobuf's Message is untyped
    return serialized


@dataclass(slots=True)
class RangeChunk:
    read_id: int
    read_offset: int
    content: memoryview | bytes
    crc32c: int | None
    crc_ok: bool
    range_end: bool


@dataclass(slots=True)
class ReadResponse:
    """A decoded BidiReadObjectResponse: data chunks, maybe handle and metadata."""

    chunks: list[RangeChunk]
    read_handle: bytes | None = None
    metadata: wire.storage.Object | None = None  # only on the first response


class _Unusual(Exception):
    """Leave this message to protobuf."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _Unusual("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Unusual("varint too long")


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """Yield (field_number, wire_type, value, value_start, value_end) over
    buf[start:end]; a length-delimited field's value is 0, its bytes are
    buf[value_start:value_end]."""
    pos = start
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            value, pos = _varint(buf, pos)
            yield number, kind, value, 0, 0
        elif kind == 2:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise _Unusual("length past the end")
            yield number, kind, 0, pos, pos + length
            pos += length
        elif kind == 5:
            if pos + 4 > end:
                raise _Unusual("truncated fixed32")
            yield number, kind, int.from_bytes(buf[pos:pos + 4], "little"), 0, 0
            pos += 4
        elif kind == 1:
            if pos + 8 > end:
                raise _Unusual("truncated fixed64")
            yield number, kind, int.from_bytes(buf[pos:pos + 8], "little"), 0, 0
            pos += 8
        else:
            raise _Unusual(f"wire type {kind}")


def _range_data(buf: bytes, start: int, end: int, view: memoryview) -> RangeChunk:
    read_id = read_offset = 0
    content: memoryview | bytes = b""
    crc: int | None = None
    crc_ok = True
    range_end = False
    content_span = (0, 0)
    for number, kind, value, lo, hi in _fields(buf, start, end):
        if number == 1 and kind == 2:  # checksummed_data
            for sub, sub_kind, sub_value, c_lo, c_hi in _fields(buf, lo, hi):
                if sub == 1 and sub_kind == 2:
                    content_span = (c_lo, c_hi)
                elif sub == 2 and sub_kind == 5:
                    crc = sub_value
                else:
                    raise _Unusual("unknown ChecksummedData field")
        elif number == 2 and kind == 2:  # read_range
            for sub, sub_kind, sub_value, _, _ in _fields(buf, lo, hi):
                if sub_kind != 0:
                    raise _Unusual("unknown ReadRange field")
                if sub == 1:
                    read_offset = _int64(sub_value)
                elif sub == 3:
                    read_id = _int64(sub_value)
        elif number == 3 and kind == 0:
            range_end = bool(value)
        else:
            raise _Unusual("unknown ObjectRangeData field")
    c_lo, c_hi = content_span
    if c_hi > c_lo:
        content = view[c_lo:c_hi]
    if crc is not None:
        crc_ok = (crc32c_of_slice(buf, c_lo, c_hi) if c_hi > c_lo else 0) == crc
    return RangeChunk(read_id, read_offset, content, crc, crc_ok, range_end)


def _from_protobuf(buf: bytes) -> ReadResponse:
    message = wire.storage.BidiReadObjectResponse.FromString(buf)
    chunks = []
    for data in message.object_data_ranges:
        content = data.checksummed_data.content
        crc = data.checksummed_data.crc32c if data.checksummed_data.HasField("crc32c") else None
        chunks.append(RangeChunk(data.read_range.read_id, data.read_range.read_offset, content, crc,
                                 crc is None or wire.crc32c(content) == crc, data.range_end))
    handle = message.read_handle.handle if message.HasField("read_handle") and message.read_handle.handle else None
    metadata = message.metadata if message.HasField("metadata") else None
    return ReadResponse(chunks, handle, metadata)


def decode_bidi_read_response(buf: bytes) -> ReadResponse:
    """The response_deserializer for BidiReadObject."""
    try:
        view = memoryview(buf)
        chunks = []
        handle = None
        for number, kind, _, lo, hi in _fields(buf, 0, len(buf)):
            if number == 6 and kind == 2:
                chunks.append(_range_data(buf, lo, hi, view))
            elif number == 7 and kind == 2:
                for sub, sub_kind, _, h_lo, h_hi in _fields(buf, lo, hi):
                    if sub == 1 and sub_kind == 2:
                        handle = bytes(buf[h_lo:h_hi])
            else:
                raise _Unusual("metadata or unknown field")
        return ReadResponse(chunks, handle or None)
    except _Unusual:
        return _from_protobuf(buf)
