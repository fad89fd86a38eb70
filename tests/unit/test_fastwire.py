"""The hand decoder of BidiReadObject responses and the hand encoder of
BidiWriteObject data requests agree with protobuf; the checksums agree with
whole-buffer CRC32C."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount import wire
import mmap

import pytest

from rapidmount.client.fastwire import (crc32c_of, crc32c_of_slice, decode_bidi_read_response, encode_write_data,
                                        passthrough_or_serialize)

s = wire.storage


def _chunk(read_id, offset, content, crc, end):
    data = s.ChecksummedData(content=content)
    if crc is not None:
        data.crc32c = crc
    return s.ObjectRangeData(checksummed_data=data, read_range=s.ReadRange(
        read_offset=offset, read_length=len(content), read_id=read_id), range_end=end)


chunks = st.lists(st.tuples(
    st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(min_value=-(2**40), max_value=2**50),
    st.binary(max_size=300), st.booleans(), st.booleans(), st.booleans()), max_size=5)


@settings(max_examples=200, deadline=None)
@given(chunks, st.one_of(st.none(), st.binary(min_size=1, max_size=20)))
def test_decoder_matches_protobuf(parts, handle):
    message = s.BidiReadObjectResponse()
    expected = []
    for read_id, offset, content, with_crc, corrupt, end in parts:
        crc = None
        if with_crc:
            crc = wire.crc32c(content) ^ (1 if corrupt else 0)
        message.object_data_ranges.append(_chunk(read_id, offset, content, crc, end))
        expected.append((read_id, offset, content, crc, crc is None or not corrupt, end))
    if handle:
        message.read_handle.handle = handle
    decoded = decode_bidi_read_response(message.SerializeToString())
    got = [(c.read_id, c.read_offset, bytes(c.content), c.crc32c, c.crc_ok, c.range_end) for c in decoded.chunks]
    assert got == expected
    assert decoded.read_handle == (handle or None)
    assert decoded.metadata is None


def test_metadata_falls_back_to_protobuf():
    message = s.BidiReadObjectResponse(metadata=s.Object(name="o", size=5, generation=7))
    message.object_data_ranges.append(_chunk(1, 0, b"hello", wire.crc32c(b"hello"), True))
    decoded = decode_bidi_read_response(message.SerializeToString())
    assert decoded.metadata.generation == 7
    assert bytes(decoded.chunks[0].content) == b"hello" and decoded.chunks[0].crc_ok


def test_unknown_fields_fall_back_to_protobuf():
    raw = s.BidiReadObjectResponse(object_data_ranges=[_chunk(3, 10, b"abc", None, False)]).SerializeToString()
    raw += bytes([0x98, 0x06, 0x01])  # field 99 as a varint tag, value 1: unknown to us
    decoded = decode_bidi_read_response(raw)
    assert [(c.read_id, bytes(c.content)) for c in decoded.chunks] == [(3, b"abc")]


def test_crc_of_slice():
    data = bytes(range(256)) * 100
    assert crc32c_of_slice(data, 7, 9000) == wire.crc32c(data[7:9000])


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**63 - 1), st.lists(st.binary(min_size=0, max_size=400), min_size=1,
                                                               max_size=4))
def test_write_encoder_matches_protobuf(offset, pieces):
    content = b"".join(pieces)
    if not content:
        pieces, content = [b"x"], b"x"
    crc = wire.crc32c(content)
    expected = s.BidiWriteObjectRequest(write_offset=offset, checksummed_data=s.ChecksummedData(
        content=content, crc32c=crc)).SerializeToString()
    views = [memoryview(piece) for piece in pieces]
    assert encode_write_data(offset, views, len(content), crc) == expected
    assert s.BidiWriteObjectRequest.FromString(expected).checksummed_data.content == content


def test_write_encoder_large_chunk_and_refusals():
    content = bytes(range(256)) * 8192  # 2 MiB: a three-byte length
    crc = wire.crc32c(content)
    expected = s.BidiWriteObjectRequest(write_offset=3 << 40, checksummed_data=s.ChecksummedData(
        content=content, crc32c=crc)).SerializeToString()
    assert encode_write_data(3 << 40, [content[:5], content[5:]], len(content), crc) == expected
    with pytest.raises(ValueError):
        encode_write_data(0, [], 0, 0)
    with pytest.raises(ValueError):
        encode_write_data(-1, [b"a"], 1, 0)


def test_serializer_passes_encoded_requests_through():
    message = s.BidiWriteObjectRequest(write_offset=7, flush=True, state_lookup=True)
    assert passthrough_or_serialize(message) == message.SerializeToString()
    assert passthrough_or_serialize(b"\x18\x07") == b"\x18\x07"


def test_crc_of_any_buffer_without_copy():
    shared = mmap.mmap(-1, 1 << 16)
    view = memoryview(shared)
    view[:1000] = bytes(range(250)) * 4
    for buffer in (b"abc" * 99, bytearray(b"xyz" * 50), view[3:999], view[3:999].toreadonly(), b""):
        assert crc32c_of(buffer) == wire.crc32c(bytes(buffer))
        assert crc32c_of(buffer, 0x1234) == wire.crc32c_extend(0x1234, bytes(buffer))
    del view
    shared.close()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_crc_combine_matches_whole_crc(first, second):
    assert wire.crc32c_combine(wire.crc32c(first), wire.crc32c(second), len(second)) == wire.crc32c(first + second)


def test_crc_combine_long_runs():
    chunk = bytes(range(256)) * 8192
    whole, combined = 0, 0
    for i in range(5):
        piece = chunk[i:] + chunk[:i]
        whole = wire.crc32c_extend(whole, piece)
        combined = wire.crc32c_combine(combined, wire.crc32c(piece), len(piece))
    assert combined == whole
    with pytest.raises(ValueError):
        wire.crc32c_combine(0, 0, -1)


def test_the_writers_object_crc_counts_bytes_not_sent_yet():
    """The object's CRC32C is combined from the chunks sent, and extended over
    any retained bytes not sent yet (a finish that failed after a reopen)."""
    from rapidmount.client.writer import AppendableWriter
    from rapidmount.storage.retry import RetryPolicy

    writer = AppendableWriter(None, "o", retry=RetryPolicy())  # type: ignore[arg-type]  # no call is made
    first, second = b"a" * 3000, memoryview(bytearray(b"b" * 5000))
    writer._retained.append(first)
    writer._retained.append(second)
    writer.written = len(first) + len(second)
    writer._sent, writer._crc_sent = len(first), wire.crc32c(first)
    assert writer._crc_of_written() == wire.crc32c(first + bytes(second))
    writer._sent, writer._crc_sent = writer.written, wire.crc32c(first + bytes(second))
    assert writer._crc_of_written() == wire.crc32c(first + bytes(second))
