"""The hand decoder of BidiReadObject responses agrees with protobuf."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount import wire
from rapidmount.client.fastwire import crc32c_of_slice, decode_bidi_read_response

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
