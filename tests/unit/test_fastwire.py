"""The hand decoder of BidiReadObject responses and the hand encoder of
BidiWriteObject data requests agree with protobuf; the checksums agree with
whole-buffer CRC32C."""

from __future__ import annotations

import errno
import mmap
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.shared import wire
from rapidmount.shared.peer_memory import PeerBytes, address_of
from rapidmount.storage.errors import StorageError
from rapidmount.shared.checksums import crc32c_of, crc32c_of_slice
from rapidmount.workers.client.fastwire import (decode_bidi_read_response, encode_write_data,
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


def _expected_request(offset: int, content: bytes) -> bytes:
    return s.BidiWriteObjectRequest(write_offset=offset, checksummed_data=s.ChecksummedData(
        content=content, crc32c=wire.crc32c(content))).SerializeToString()


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**63 - 1), st.lists(st.binary(min_size=0, max_size=400), min_size=1,
                                                               max_size=4))
def test_write_encoder_matches_protobuf(offset, pieces):
    content = b"".join(pieces)
    if not content:
        pieces, content = [b"x"], b"x"
    expected = _expected_request(offset, content)
    shared = mmap.mmap(-1, max(1, len(content)))
    view = memoryview(shared)
    view[:len(content)] = content
    arena_views, at = [], 0
    for piece in pieces:  # as a worker holds them: views of the arena
        arena_views.append(view[at:at + len(piece)])
        at += len(piece)
    for given_pieces in (pieces, arena_views):
        request, crc = encode_write_data(offset, given_pieces, len(content))
        assert request == expected and crc == wire.crc32c(content)
    assert s.BidiWriteObjectRequest.FromString(expected).checksummed_data.content == content


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**40), st.lists(st.binary(min_size=1, max_size=3000), min_size=1,
                                                           max_size=6), st.data())
def test_write_encoder_reads_peer_bytes_as_protobuf_would_send_them(offset, writes, data):
    """Pieces that are runs of another process's bytes (here, this process's
    own, through the same system call), sliced as the writer slices them, mixed with local ones."""
    runs = PeerBytes(os.getpid(), [(address_of(write), len(write)) for write in writes])
    content = b"".join(writes)
    start = data.draw(st.integers(min_value=0, max_value=len(content) - 1))
    stop = data.draw(st.integers(min_value=start + 1, max_value=len(content)))
    local = b"local" * 7
    request, crc = encode_write_data(offset, [runs[start:stop], local], stop - start + len(local))
    assert request == _expected_request(offset, content[start:stop] + local)
    assert crc == wire.crc32c(content[start:stop] + local)


def test_write_encoder_large_chunk_and_refusals():
    content = bytes(range(256)) * 8192  # 2 MiB: a three-byte length
    expected = _expected_request(3 << 40, content)
    assert encode_write_data(3 << 40, [content[:5], content[5:]], len(content)) == (expected, wire.crc32c(content))
    with pytest.raises(ValueError):
        encode_write_data(0, [], 0)
    with pytest.raises(ValueError):
        encode_write_data(-1, [b"a"], 1)
    with pytest.raises(ValueError):  # pieces shorter, or longer, than the length said
        encode_write_data(0, [b"ab"], 3)
    with pytest.raises(ValueError):
        encode_write_data(0, [b"ab", b"cd"], 3)


def test_a_peer_piece_that_cannot_be_read_whole_fails_the_request_with_eio():
    kept = b"k" * 5000
    gone = PeerBytes(os.getpid(), [(address_of(kept), len(kept)), (4096, 100)])  # page 1: never mapped
    with pytest.raises(StorageError) as caught:
        encode_write_data(0, [gone], len(gone))
    assert caught.value.errno == errno.EIO


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
    from rapidmount.workers.client.writer import AppendableWriter
    from rapidmount.workers.retry import RetryPolicy

    writer = AppendableWriter(None, "o", retry=RetryPolicy())  # type: ignore[arg-type]  # no call is made
    first, second = b"a" * 3000, memoryview(bytearray(b"b" * 5000))
    writer._retained.append(first)
    writer._retained.append(second)
    writer.written = len(first) + len(second)
    writer._sent, writer._crc_sent = len(first), wire.crc32c(first)
    assert writer._crc_of_written() == wire.crc32c(first + bytes(second))
    writer._sent, writer._crc_sent = writer.written, wire.crc32c(first + bytes(second))
    assert writer._crc_of_written() == wire.crc32c(first + bytes(second))
    # Bytes of the FUSE process, retained as runs of it, count the same way.
    peer = b"p" * 7000
    writer._retained.append(PeerBytes(os.getpid(), [(address_of(peer), len(peer))]))
    writer.written += len(peer)
    assert writer._crc_of_written() == wire.crc32c(first + bytes(second) + peer)
