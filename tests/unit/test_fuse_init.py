"""The INIT negotiation against the offers real kernels make: what is granted,
the limits told, and the reply's exact bytes at each protocol minor."""

from __future__ import annotations

import errno
import functools
import operator
import struct

import pytest

from rapidmount.shared import fuse_abi as abi, fuse_codec as codec
from rapidmount.fuse.init import DEFAULT_OPTIONAL, Negotiated, ProtocolTooOld, Wants, negotiate

UNIQUE = 2
MiB = 1 << 20


def flags(*names: str) -> int:
    return functools.reduce(operator.or_, (getattr(abi, name) for name in names), 0)


#: What Linux 5.15 offers (7.34): no INIT_EXT, so no flags2.
OFFER_5_15 = flags(
    "ASYNC_READ", "POSIX_LOCKS", "ATOMIC_O_TRUNC", "EXPORT_SUPPORT", "BIG_WRITES", "DONT_MASK", "SPLICE_WRITE",
    "SPLICE_MOVE", "SPLICE_READ", "FLOCK_LOCKS", "HAS_IOCTL_DIR", "AUTO_INVAL_DATA", "DO_READDIRPLUS",
    "READDIRPLUS_AUTO", "ASYNC_DIO", "WRITEBACK_CACHE", "NO_OPEN_SUPPORT", "PARALLEL_DIROPS", "HANDLE_KILLPRIV",
    "POSIX_ACL", "ABORT_ERROR", "MAX_PAGES", "CACHE_SYMLINKS", "NO_OPENDIR_SUPPORT", "EXPLICIT_INVAL_DATA",
    "HANDLE_KILLPRIV_V2", "SETXATTR_EXT")
#: What this machine's kernel (6.18, protocol 7.45) offers: INIT_EXT, and flags2 0x5fd.
FLAGS2_6_18 = 0x5FD
OFFER_6_18 = OFFER_5_15 | abi.INIT_EXT | FLAGS2_6_18 << 32

WANTS = Wants(max_write=1 * MiB, max_readahead=1 * MiB, max_background=64, congestion_threshold=48)


def init_request(major: int, minor: int, max_readahead: int, offered: int) -> bytes:
    """An INIT as the kernel writes it: fuse_init_in at the size its minor defines."""
    if minor >= 36:
        body = abi.INIT_IN.pack(major, minor, max_readahead, offered & 0xFFFFFFFF, offered >> 32)
    else:
        body = abi.INIT_IN_COMPAT.pack(major, minor, max_readahead, offered)
    return abi.IN_HEADER.pack(40 + len(body), abi.Opcode.INIT, UNIQUE, 0, 0, 0, 0, 0) + body


def negotiate_request(major: int, minor: int, offered: int, wants: Wants = WANTS,
                      max_readahead: int = 128 * 1024) -> Negotiated:
    header, init = codec.decode(init_request(major, minor, max_readahead, offered))
    assert isinstance(init, codec.Init)
    return negotiate(init, header.unique, wants)


def init_out(minor: int, max_readahead: int, granted: int, max_write: int, max_pages: int,
             max_stack_depth: int = 0) -> bytes:
    """fuse_init_out packed by hand, after its fuse_out_header: major minor max_readahead flags
    max_background congestion_threshold max_write time_gran max_pages map_alignment flags2
    max_stack_depth request_timeout unused[11]."""
    body = struct.pack("<IIII", 7, minor, max_readahead, granted & 0xFFFFFFFF)
    body += struct.pack("<HHII", 64, 48, max_write, 1)
    body += struct.pack("<HHII", max_pages, 0, granted >> 32, max_stack_depth)
    body += struct.pack("<H", 0) + bytes(22)
    return struct.pack("<IiQ", 16 + len(body), 0, UNIQUE) + body


def test_offers_are_what_the_kernels_send():
    assert OFFER_5_15 == 0x33FFFFFB
    assert OFFER_6_18 >> 32 == flags("SECURITY_CTX", "CREATE_SUPP_GROUP", "HAS_EXPIRE_ONLY", "DIRECT_IO_ALLOW_MMAP",
                                     "PASSTHROUGH", "NO_EXPORT_SUPPORT", "HAS_RESEND", "ALLOW_IDMAP",
                                     "REQUEST_TIMEOUT") >> 32


def test_linux_6_18():
    agreed = negotiate_request(7, 45, OFFER_6_18)
    expected = flags("ASYNC_READ", "ATOMIC_O_TRUNC", "EXPORT_SUPPORT", "BIG_WRITES", "HAS_IOCTL_DIR", "AUTO_INVAL_DATA",
                     "DO_READDIRPLUS", "ASYNC_DIO", "PARALLEL_DIROPS", "MAX_PAGES", "CACHE_SYMLINKS", "INIT_EXT",
                     "DIRECT_IO_ALLOW_MMAP")
    assert (agreed.major, agreed.minor, agreed.offered, agreed.granted) == (7, 45, OFFER_6_18, expected)
    assert (agreed.max_write, agreed.max_pages, agreed.max_readahead) == (1 * MiB, 256, 128 * 1024)
    assert (agreed.max_background, agreed.congestion_threshold, agreed.max_stack_depth) == (64, 48, 0)
    assert not agreed.retry
    assert agreed.reply == init_out(45, 128 * 1024, expected, 1 * MiB, 256)
    assert len(agreed.reply) == 16 + 64
    assert agreed.read_buffer_size == 40 + 40 + 1 * MiB


def test_linux_6_18_with_passthrough():
    agreed = negotiate_request(7, 45, OFFER_6_18, Wants(max_write=1 * MiB, max_readahead=1 * MiB, max_background=64,
                                                        congestion_threshold=48, passthrough=True))
    assert agreed.granted & abi.PASSTHROUGH and agreed.max_stack_depth == 1
    assert agreed.reply == init_out(45, 128 * 1024, agreed.granted, 1 * MiB, 256, max_stack_depth=1)


def test_passthrough_not_offered():
    agreed = negotiate_request(7, 45, OFFER_6_18 & ~abi.PASSTHROUGH, Wants(max_write=4096, max_readahead=0,
                                                                          passthrough=True))
    assert not agreed.granted & abi.PASSTHROUGH and agreed.max_stack_depth == 0


def test_linux_5_15():
    agreed = negotiate_request(7, 34, OFFER_5_15)
    expected = OFFER_5_15 & DEFAULT_OPTIONAL
    assert (agreed.minor, agreed.granted) == (34, expected)
    assert not agreed.granted & abi.INIT_EXT and agreed.granted >> 32 == 0
    assert agreed.reply == init_out(34, 128 * 1024, expected, 1 * MiB, 256)
    assert agreed.reply[16 + 36:16 + 40] == bytes(4)  # flags2
    assert len(agreed.reply) == 16 + 64  # the whole fuse_init_out, as from 7.23


@pytest.mark.parametrize(("minor", "offered"), [
    (31, OFFER_5_15 & ~(abi.HANDLE_KILLPRIV_V2 | abi.SETXATTR_EXT)),
    (38, OFFER_5_15 | abi.INIT_EXT | flags("SECURITY_CTX", "CREATE_SUPP_GROUP", "HAS_EXPIRE_ONLY")),
    (45, OFFER_6_18),
])
def test_reply_layout_by_minor(minor, offered):
    agreed = negotiate_request(7, minor, offered, max_readahead=4 * MiB)
    assert agreed.reply == init_out(minor, 1 * MiB, offered & (DEFAULT_OPTIONAL | abi.INIT_EXT), 1 * MiB, 256)


def test_newer_minor_is_answered_with_ours():
    agreed = negotiate_request(7, 46, OFFER_6_18)
    assert agreed.minor == abi.MAX_MINOR == 45
    assert struct.unpack_from("<II", agreed.reply, 16) == (7, 45)


def test_major_above_7_is_told_7():
    agreed = negotiate_request(8, 0, 0)
    assert agreed.retry
    assert agreed.reply == struct.pack("<IiQII", 24, 0, UNIQUE, 7, 45)
    assert "above 7" in agreed.describe()


@pytest.mark.parametrize(("major", "minor"), [(7, 30), (7, 0), (6, 99)])
def test_too_old_is_refused(major, minor):
    with pytest.raises(ProtocolTooOld) as caught:
        negotiate_request(major, minor, OFFER_5_15)
    assert f"{major}.{minor}" in str(caught.value) and "7.31" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.reply == struct.pack("<IiQ", 16, -errno.EPROTO, UNIQUE)


def test_without_max_pages_writes_stay_at_32_pages():
    agreed = negotiate_request(7, 34, OFFER_5_15 & ~abi.MAX_PAGES)
    assert (agreed.max_write, agreed.max_pages) == (128 * 1024, 32)
    assert struct.unpack_from("<I", agreed.reply, 16 + 20)[0] == 128 * 1024  # max_write
    assert struct.unpack_from("<H", agreed.reply, 16 + 28)[0] == 0  # max_pages, unread without MAX_PAGES
    not_asked = negotiate_request(7, 34, OFFER_5_15, Wants(max_write=1 * MiB, max_readahead=0,
                                                           optional=DEFAULT_OPTIONAL & ~abi.MAX_PAGES))
    assert (not_asked.max_write, not_asked.max_pages, not_asked.max_readahead) == (128 * 1024, 32, 0)


def test_flags2_only_with_init_ext():
    # High bits offered without INIT_EXT (a kernel never does): no flags2 is written.
    init = codec.Init(7, 45, 0, abi.ASYNC_READ | abi.DIRECT_IO_ALLOW_MMAP)
    agreed = negotiate(init, UNIQUE, WANTS)
    assert agreed.granted == abi.ASYNC_READ
    assert struct.unpack_from("<I", agreed.reply, 16 + 36)[0] == 0


def test_describe():
    line = negotiate_request(7, 45, OFFER_6_18).describe()
    assert "\n" not in line
    assert line.startswith("FUSE 7.45: max_write 1048576 (256 pages), max_readahead 131072; granted ASYNC_READ|")
    granted, declined = line.split("; granted ")[1].split("; declined ")
    assert "MAX_PAGES" in granted and "WRITEBACK_CACHE" not in granted
    assert "WRITEBACK_CACHE" in declined and "PASSTHROUGH" in declined and "MAX_PAGES" not in declined


@pytest.mark.parametrize("arguments", [
    {"max_write": 0}, {"max_write": 4095}, {"max_write": 6000}, {"max_write": 65536 * 4096},
    {"max_readahead": -1}, {"max_readahead": 2**32}, {"max_background": 65536}, {"congestion_threshold": -1},
    {"time_gran": 0}, {"time_gran": 10**9 + 1},
    {"optional": DEFAULT_OPTIONAL | abi.WRITEBACK_CACHE}, {"optional": abi.POSIX_LOCKS},
    {"optional": abi.SPLICE_READ}, {"optional": abi.PASSTHROUGH}, {"optional": abi.SETXATTR_EXT},
])
def test_wants_refuses(arguments):
    with pytest.raises(ValueError):
        Wants(**{"max_write": 4096, "max_readahead": 0, **arguments})


def test_default_optional():
    assert abi.init_flag_names(DEFAULT_OPTIONAL) == [
        "ASYNC_READ", "ATOMIC_O_TRUNC", "EXPORT_SUPPORT", "BIG_WRITES", "HAS_IOCTL_DIR", "AUTO_INVAL_DATA",
        "DO_READDIRPLUS", "ASYNC_DIO", "PARALLEL_DIROPS", "MAX_PAGES", "CACHE_SYMLINKS", "DIRECT_IO_ALLOW_MMAP"]
