"""The FUSE codec against the kernel ABI: every decoded request round-trips
from bytes built with the ABI's structs, replies and notifications match
layouts packed by hand from ``linux/fuse.h``, bad requests raise DecodeError
with the errno to answer, and no input makes decode raise anything else."""

from __future__ import annotations

import errno
import math
import os
import stat
import struct
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.shared import fuse_abi as abi, fuse_codec as codec

UNIQUE = 0x1234_5678_9ABC
NODEID = 77


def request(opcode: int, body: bytes = b"", *, unique: int = UNIQUE, extension: bytes = b"") -> bytes:
    """A request as the kernel writes it: header, body, then the extension area."""
    assert len(extension) % 8 == 0
    length = abi.IN_HEADER.size + len(body) + len(extension)
    return (abi.IN_HEADER.pack(length, opcode, unique, NODEID, 1000, 1001, 4242, len(extension) // 8)
            + body + extension)


def decode_ok(opcode: int, body: bytes = b"", extension: bytes = b"") -> codec.Body:
    """The body of a well-formed request, after checking its header decoded right."""
    header, decoded = codec.decode(request(opcode, body, extension=extension))
    assert header == codec.Header(abi.IN_HEADER.size + len(body) + len(extension), opcode, UNIQUE, NODEID, 1000,
                                  1001, 4242)
    return decoded


def decode_error(buffer: bytes) -> codec.DecodeError:
    with pytest.raises(codec.DecodeError) as caught:
        codec.decode(buffer)
    return caught.value


Op = abi.Opcode
NAME_255 = b"n" * 255
# time64 seconds, nanoseconds: one before 1970, one in 2026
SETATTR_BODY = abi.SETATTR_IN.pack(abi.FATTR_SIZE | abi.FATTR_ATIME | abi.FATTR_MTIME_NOW | abi.FATTR_FH, 9, 4096,
                                   0xABCD, -1, 1_780_000_000, 5, 500_000_000, 7, 9, 0o100640, 1000, 1001)

#: (opcode, body, what decode returns): every opcode the codec decodes, built with the ABI's structs.
ROUND_TRIPS: list[tuple[int, bytes, codec.Body]] = [
    (Op.LOOKUP, b"name\0", codec.Lookup(b"name")),
    (Op.LOOKUP, NAME_255 + b"\0", codec.Lookup(NAME_255)),
    (Op.FORGET, abi.FORGET_IN.pack(3), codec.Forget(3)),
    (Op.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(2) + abi.FORGET_ONE.pack(10, 1) + abi.FORGET_ONE.pack(11, 2**40),
     codec.BatchForget(((10, 1), (11, 2**40)))),
    (Op.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(0), codec.BatchForget(())),
    (Op.GETATTR, abi.GETATTR_IN.pack(abi.GETATTR_FH, 99), codec.Getattr(99)),
    (Op.GETATTR, abi.GETATTR_IN.pack(0, 99), codec.Getattr(None)),
    (Op.SETATTR, SETATTR_BODY,
     codec.Setattr(valid=abi.FATTR_SIZE | abi.FATTR_ATIME | abi.FATTR_MTIME_NOW | abi.FATTR_FH, fh=9, size=4096,
                   atime_ns=-500_000_000, mtime_ns=1_780_000_000_000_000_007, ctime_ns=5_000_000_009,
                   mode=0o100640, uid=1000, gid=1001)),
    (Op.READLINK, b"", codec.Readlink()),
    (Op.SYMLINK, b"link\0../some/target\0", codec.Symlink(b"link", b"../some/target")),
    (Op.MKNOD, abi.MKNOD_IN.pack(stat.S_IFIFO | 0o644, 0, 0o022) + b"fifo\0", codec.Mknod(b"fifo", 0o10644, 0, 0o22)),
    (Op.MKDIR, abi.MKDIR_IN.pack(0o755, 0o022) + b"dir\0", codec.Mkdir(b"dir", 0o755, 0o022)),
    (Op.UNLINK, b"file\0", codec.Unlink(b"file")),
    (Op.RMDIR, b"dir\0", codec.Rmdir(b"dir")),
    (Op.RENAME, abi.RENAME_IN.pack(9) + b"old\0new\0", codec.Rename(9, b"old", b"new", 0)),
    (Op.RENAME2, abi.RENAME2_IN.pack(9, 1) + b"old\0new\0", codec.Rename(9, b"old", b"new", 1)),
    (Op.LINK, abi.LINK_IN.pack(12) + b"hard\0", codec.Link(12, b"hard")),
    (Op.OPEN, abi.OPEN_IN.pack(os.O_RDWR | os.O_TRUNC, abi.OPEN_KILL_SUIDGID),
     codec.Open(os.O_RDWR | os.O_TRUNC, abi.OPEN_KILL_SUIDGID)),
    (Op.READ, abi.READ_IN.pack(5, 2**40, 131072, abi.READ_LOCKOWNER, 0xFEED, os.O_RDONLY),
     codec.Read(5, 2**40, 131072, abi.READ_LOCKOWNER, 0xFEED, os.O_RDONLY)),
    (Op.WRITE, abi.WRITE_IN.pack(5, 10, 5, abi.WRITE_CACHE, 0, os.O_WRONLY) + b"hello",
     codec.Write(5, 10, 5, abi.WRITE_CACHE, 0, os.O_WRONLY, memoryview(b"hello"))),
    (Op.WRITE, abi.WRITE_IN.pack(5, 10, 0, 0, 0, os.O_WRONLY),
     codec.Write(5, 10, 0, 0, 0, os.O_WRONLY, memoryview(b""))),
    (Op.STATFS, b"", codec.Statfs()),
    (Op.RELEASE, abi.RELEASE_IN.pack(5, os.O_RDONLY, abi.RELEASE_FLUSH, 0xFEED),
     codec.Release(5, os.O_RDONLY, abi.RELEASE_FLUSH, 0xFEED)),
    (Op.RELEASEDIR, abi.RELEASE_IN.pack(6, os.O_RDONLY, 0, 0), codec.Release(6, os.O_RDONLY, 0, 0)),
    (Op.FSYNC, abi.FSYNC_IN.pack(5, abi.FSYNC_FDATASYNC), codec.Fsync(5, abi.FSYNC_FDATASYNC)),
    (Op.FSYNCDIR, abi.FSYNC_IN.pack(6, 0), codec.Fsync(6, 0)),
    (Op.SETXATTR, abi.SETXATTR_IN_COMPAT.pack(4, 1) + b"user.k\0v\0\xff1", codec.Setxattr(b"user.k", b"v\0\xff1", 1)),
    (Op.SETXATTR, abi.SETXATTR_IN_COMPAT.pack(0, 0) + b"user.k\0", codec.Setxattr(b"user.k", b"", 0)),
    (Op.GETXATTR, abi.GETXATTR_IN.pack(0) + b"user.k\0", codec.Getxattr(b"user.k", 0)),
    (Op.LISTXATTR, abi.GETXATTR_IN.pack(4096), codec.Listxattr(4096)),
    (Op.REMOVEXATTR, b"user.k\0", codec.Removexattr(b"user.k")),
    (Op.FLUSH, abi.FLUSH_IN.pack(5, 0xFEED), codec.Flush(5, 0xFEED)),
    # 7.45 with INIT_EXT: flags2 in the high bits; 7.45 without it: flags2 ignored; 7.34: the 16-byte struct.
    (Op.INIT, abi.INIT_IN.pack(7, 45, 131072, abi.INIT_EXT | abi.ASYNC_READ, 0x5FD),
     codec.Init(7, 45, 131072, abi.INIT_EXT | abi.ASYNC_READ | 0x5FD << 32)),
    (Op.INIT, abi.INIT_IN.pack(7, 45, 131072, abi.ASYNC_READ, 0x5FD), codec.Init(7, 45, 131072, abi.ASYNC_READ)),
    (Op.INIT, abi.INIT_IN_COMPAT.pack(7, 34, 131072, abi.MAX_PAGES), codec.Init(7, 34, 131072, abi.MAX_PAGES)),
    (Op.INIT, abi.INIT_IN_COMPAT.pack(8, 0, 0, 0), codec.Init(8, 0, 0, 0)),
    (Op.OPENDIR, abi.OPEN_IN.pack(os.O_RDONLY | os.O_DIRECTORY, 0), codec.Opendir(os.O_RDONLY | os.O_DIRECTORY, 0)),
    (Op.READDIR, abi.READ_IN.pack(6, 3, 4096, 0, 0, os.O_RDONLY), codec.Readdir(6, 3, 4096)),
    (Op.READDIRPLUS, abi.READ_IN.pack(6, 0, 4096, 0, 0, os.O_RDONLY), codec.Readdir(6, 0, 4096)),
    (Op.ACCESS, abi.ACCESS_IN.pack(os.R_OK | os.X_OK), codec.Access(os.R_OK | os.X_OK)),
    (Op.CREATE, abi.CREATE_IN.pack(os.O_CREAT | os.O_WRONLY, 0o100644, 0o022, 0) + b"new\0",
     codec.Create(b"new", os.O_CREAT | os.O_WRONLY, 0o100644, 0o022, 0)),
    (Op.INTERRUPT, abi.INTERRUPT_IN.pack(UNIQUE - 2), codec.Interrupt(UNIQUE - 2)),
    (Op.DESTROY, b"", codec.Destroy()),
    (Op.FALLOCATE, abi.FALLOCATE_IN.pack(5, 0, 2**20, 1), codec.Fallocate(5, 0, 2**20, 1)),
    (Op.LSEEK, abi.LSEEK_IN.pack(5, 100, os.SEEK_DATA), codec.Lseek(5, 100, os.SEEK_DATA)),
    (Op.COPY_FILE_RANGE, abi.COPY_FILE_RANGE_IN.pack(5, 0, 78, 6, 4096, 2**30, 0),
     codec.CopyFileRange(5, 0, 78, 6, 4096, 2**30, 0)),
]


# -- the ABI -------------------------------------------------------------------------------------------

def test_struct_sizes_are_the_kernel_headers():
    sizes = {
        abi.IN_HEADER: 40, abi.OUT_HEADER: 16, abi.ATTR: 88, abi.ENTRY_OUT: 128, abi.ATTR_OUT: 104,
        abi.OPEN_OUT: 16, abi.WRITE_OUT: 8, abi.STATFS_OUT: 80, abi.GETXATTR_OUT: 8, abi.LSEEK_OUT: 8,
        abi.INIT_IN_COMPAT: 16, abi.INIT_IN: 64, abi.INIT_OUT: 64, abi.INIT_OUT_COMPAT: 8, abi.DIRENT: 24,
        abi.FORGET_IN: 8, abi.BATCH_FORGET_IN: 8, abi.FORGET_ONE: 16, abi.GETATTR_IN: 16, abi.SETATTR_IN: 88,
        abi.MKNOD_IN: 16, abi.MKDIR_IN: 8, abi.RENAME_IN: 8, abi.RENAME2_IN: 16, abi.LINK_IN: 8, abi.OPEN_IN: 8,
        abi.CREATE_IN: 16, abi.RELEASE_IN: 24, abi.FLUSH_IN: 24, abi.READ_IN: 40, abi.WRITE_IN: 40,
        abi.FSYNC_IN: 16, abi.SETXATTR_IN_COMPAT: 8, abi.GETXATTR_IN: 8, abi.ACCESS_IN: 8, abi.INTERRUPT_IN: 8,
        abi.FALLOCATE_IN: 32, abi.LSEEK_IN: 24, abi.COPY_FILE_RANGE_IN: 56, abi.NOTIFY_INVAL_INODE_OUT: 24,
        abi.NOTIFY_INVAL_ENTRY_OUT: 16, abi.NOTIFY_DELETE_OUT: 24, abi.NOTIFY_STORE_OUT: 24, abi.BACKING_MAP: 16,
    }
    assert {layout.format: layout.size for layout in sizes} == {layout.format: size for layout, size in sizes.items()}
    assert all(layout.format.startswith("<") for layout in sizes)


def test_opcodes_and_notify_codes():
    assert (Op.LOOKUP, Op.RENAME2, Op.STATX, Op.COPY_FILE_RANGE_64, Op.CUSE_INIT) == (1, 45, 52, 53, 4096)
    assert [code.value for code in abi.NotifyCode] == list(range(1, 10))
    assert abi.NO_REPLY_OPCODES == {Op.FORGET, Op.BATCH_FORGET, Op.NOTIFY_REPLY}


def test_init_flag_names_are_the_constants():
    assert len(abi.INIT_FLAG_NAMES) == 43
    for bit, name in abi.INIT_FLAG_NAMES.items():
        assert getattr(abi, name) == bit
    assert (abi.INIT_EXT, abi.MAX_PAGES) == (1 << 30, 1 << 22)
    assert (abi.DIRECT_IO_ALLOW_MMAP, abi.PASSTHROUGH) == (1 << 36, 1 << 37)
    assert abi.init_flag_names(abi.ASYNC_READ | abi.PASSTHROUGH | 1 << 50) == ["ASYNC_READ", "PASSTHROUGH", "bit50"]


def _ioc(direction: int, number: int, size: int) -> int:
    """Linux's _IOC on x86 and arm64: direction 1 write, 2 read."""
    return direction << 30 | size << 16 | 229 << 8 | number


def test_device_ioctls():
    assert abi.FUSE_DEV_IOC_CLONE == _ioc(2, 0, 4)
    assert abi.FUSE_DEV_IOC_BACKING_OPEN == _ioc(1, 1, abi.BACKING_MAP.size) == 0x4010E501
    assert abi.FUSE_DEV_IOC_BACKING_CLOSE == _ioc(1, 2, 4) == 0x4004E502


# -- decoding ------------------------------------------------------------------------------------------

def test_round_trips_cover_every_decoded_opcode():
    assert {opcode for opcode, _, _ in ROUND_TRIPS} == codec.DECODED_OPCODES


@pytest.mark.parametrize(("opcode", "body", "expected"), ROUND_TRIPS, ids=lambda value: getattr(value, "name", ""))
def test_round_trip(opcode, body, expected):
    assert decode_ok(opcode, body) == expected


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decodes_any_buffer(kind):
    header, body = codec.decode(kind(request(Op.LOOKUP, b"x\0")))
    assert (header.opcode, body) == (Op.LOOKUP, codec.Lookup(b"x"))


def test_write_data_is_a_view_of_the_buffer():
    buffer = bytearray(request(Op.WRITE, abi.WRITE_IN.pack(1, 0, 3, 0, 0, 0) + b"abc"))
    _, body = codec.decode(buffer)
    assert isinstance(body, codec.Write)
    buffer[-3:] = b"xyz"
    assert bytes(body.data) == b"xyz"


def test_extension_area_is_skipped():
    groups = struct.pack("<IIII", 16, 32, 1, 5000)  # fuse_ext_header(size 16, FUSE_EXT_GROUPS), one group
    body = abi.CREATE_IN.pack(os.O_CREAT, 0o100644, 0, 0) + b"f\0"
    assert decode_ok(Op.CREATE, body, extension=groups) == codec.Create(b"f", os.O_CREAT, 0o100644, 0, 0)
    assert decode_ok(Op.MKDIR, abi.MKDIR_IN.pack(0o755, 0) + b"d\0", extension=groups) == codec.Mkdir(b"d", 0o755, 0)
    # A name is before the extensions: a NUL only among them does not end it.
    assert decode_error(request(Op.LOOKUP, b"abc", extension=bytes(8))).errno == errno.EINVAL
    # WRITE's data ends where the extensions begin.
    write = abi.WRITE_IN.pack(1, 0, 2, 0, 0, 0) + b"ab"
    body = decode_ok(Op.WRITE, write, extension=bytes(8))
    assert isinstance(body, codec.Write) and bytes(body.data) == b"ab"


def test_extension_area_longer_than_the_request():
    buffer = bytearray(request(Op.STATFS))
    struct.pack_into("<H", buffer, 36, 1)  # total_extlen: 8 bytes, of a request with none after its header
    error = decode_error(bytes(buffer))
    assert (error.unique, error.errno) == (UNIQUE, errno.EINVAL)


@pytest.mark.parametrize("length", [0, 1, 39])
def test_shorter_than_the_header(length):
    error = decode_error(request(Op.STATFS)[:length])
    assert (error.unique, error.errno) == (None, errno.EINVAL)
    assert "None" in str(error)


@pytest.mark.parametrize("change", [-1, 1, 100])
def test_len_field_differs_from_the_buffer(change):
    buffer = request(Op.LOOKUP, b"name\0")
    buffer = buffer[:-1] if change < 0 else buffer + bytes(change)
    error = decode_error(buffer)
    assert (error.unique, error.errno) == (UNIQUE, errno.EINVAL)


@pytest.mark.parametrize(("opcode", "body"), [
    (Op.FORGET, bytes(7)),
    (Op.GETATTR, bytes(15)),
    (Op.SETATTR, SETATTR_BODY[:-1]),
    (Op.MKNOD, abi.MKNOD_IN.pack(0, 0, 0)[:8] + b"\0"),
    (Op.MKDIR, bytes(7)),
    (Op.RENAME, bytes(7)),
    (Op.RENAME2, abi.RENAME2_IN.pack(1, 0)[:12]),
    (Op.OPEN, bytes(4)),
    (Op.READ, bytes(39)),
    (Op.WRITE, bytes(24)),  # the pre-7.9 fuse_write_in
    (Op.RELEASE, bytes(16)),
    (Op.FSYNC, bytes(8)),
    (Op.FLUSH, bytes(16)),
    (Op.CREATE, bytes(8) + b"f\0"),
    (Op.INIT, bytes(12)),
    (Op.INIT, abi.INIT_IN_COMPAT.pack(7, 36, 0, abi.INIT_EXT)),  # from 7.36 fuse_init_in is 64 bytes
    (Op.ACCESS, bytes(4)),
    (Op.INTERRUPT, bytes(4)),
    (Op.FALLOCATE, bytes(31)),
    (Op.LSEEK, bytes(16)),
    (Op.COPY_FILE_RANGE, bytes(48)),
    (Op.BATCH_FORGET, bytes(4)),
    (Op.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(2) + abi.FORGET_ONE.pack(1, 1)),  # count says more than there is
    (Op.BATCH_FORGET, abi.BATCH_FORGET_IN.pack(0xFFFFFFFF)),
    (Op.LISTXATTR, b""),
])
def test_body_shorter_than_its_struct(opcode, body):
    error = decode_error(request(opcode, body))
    assert (error.unique, error.errno) == (UNIQUE, errno.EINVAL)


@pytest.mark.parametrize(("opcode", "body", "expected"), [
    (Op.LOOKUP, b"", errno.EINVAL),
    (Op.LOOKUP, b"name", errno.EINVAL),
    (Op.LOOKUP, b"\0", errno.EINVAL),
    (Op.LOOKUP, b"n" * 256 + b"\0", errno.ENAMETOOLONG),
    (Op.LOOKUP, b"n" * 300, errno.EINVAL),  # no NUL at all
    (Op.UNLINK, b"\0name\0", errno.EINVAL),
    (Op.RMDIR, b"n" * 256 + b"\0", errno.ENAMETOOLONG),
    (Op.SYMLINK, b"link\0target", errno.EINVAL),
    (Op.SYMLINK, b"link\0\0", errno.EINVAL),
    (Op.SYMLINK, b"\0target\0", errno.EINVAL),
    (Op.MKDIR, abi.MKDIR_IN.pack(0o755, 0) + b"n" * 256 + b"\0", errno.ENAMETOOLONG),
    (Op.RENAME, abi.RENAME_IN.pack(1) + b"old\0", errno.EINVAL),
    (Op.RENAME2, abi.RENAME2_IN.pack(1, 0) + b"old\0" + b"n" * 256 + b"\0", errno.ENAMETOOLONG),
    (Op.LINK, abi.LINK_IN.pack(1) + b"\0", errno.EINVAL),
    (Op.CREATE, abi.CREATE_IN.pack(0, 0, 0, 0) + b"new", errno.EINVAL),
    (Op.SETXATTR, abi.SETXATTR_IN_COMPAT.pack(5, 0) + b"user.k\0abcd", errno.EINVAL),  # value shorter than size
    (Op.SETXATTR, abi.SETXATTR_IN_COMPAT.pack(0, 0) + b"user.k", errno.EINVAL),
    (Op.GETXATTR, abi.GETXATTR_IN.pack(0) + b"x" * 256 + b"\0", errno.ENAMETOOLONG),
    (Op.REMOVEXATTR, b"", errno.EINVAL),
    (Op.WRITE, abi.WRITE_IN.pack(1, 0, 4, 0, 0, 0) + b"abc", errno.EINVAL),  # size differs from the data
    (Op.WRITE, abi.WRITE_IN.pack(1, 0, 2, 0, 0, 0) + b"abc", errno.EINVAL),
])
def test_bad_bodies(opcode, body, expected):
    error = decode_error(request(opcode, body))
    assert (error.unique, error.errno) == (UNIQUE, expected)


@pytest.mark.parametrize("opcode", sorted(set(range(0, 60)) - codec.DECODED_OPCODES | {4096, 2**32 - 1}))
def test_opcodes_not_decoded(opcode):
    error = decode_error(request(opcode, bytes(64), unique=3))
    assert (error.unique, error.errno) == (3, errno.ENOSYS)


# -- replies -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Attrs:
    st_ino: int = 77
    st_mode: int = stat.S_IFREG | 0o644
    st_nlink: int = 1
    st_size: int = 5_000_000_000
    st_uid: int = 1000
    st_gid: int = 1001
    st_blksize: int = 65536
    st_blocks: int = 9_765_625
    st_atime_ns: int = 1_780_000_000_123_456_789
    st_mtime_ns: int = -1  # 1969-12-31T23:59:59.999999999
    st_ctime_ns: int = 0


ATTRS = Attrs()
# fuse_attr of ATTRS, packed by hand: ino size blocks atime mtime ctime, atimensec mtimensec ctimensec,
# mode nlink uid gid rdev blksize flags.
ATTR_BYTES = (struct.pack("<QQQ", 77, 5_000_000_000, 9_765_625) + struct.pack("<qqq", 1_780_000_000, -1, 0)
              + struct.pack("<III", 123_456_789, 999_999_999, 0)
              + struct.pack("<IIIIIII", 0o100644, 1, 1000, 1001, 0, 65536, 0))


def out_header(length: int, error: int = 0, unique: int = UNIQUE) -> bytes:
    return struct.pack("<IiQ", length, error, unique)


def test_reply_error_and_empty():
    assert codec.reply_error(UNIQUE, errno.ENOENT) == out_header(16, -2)
    assert codec.reply_error(UNIQUE, 511) == out_header(16, -511)
    assert codec.reply_empty(UNIQUE) == out_header(16)
    for bad in (0, -2, 512):
        with pytest.raises(ValueError):
            codec.reply_error(UNIQUE, bad)


def test_reply_header_and_data():
    assert codec.reply_header(UNIQUE, 4096) == out_header(16 + 4096)
    data = memoryview(b"abc")
    header, same = codec.reply_data(UNIQUE, data)
    assert header == out_header(19) and same is data


def test_reply_entry():
    expected = out_header(144) + struct.pack("<QQQQII", 42, 3, 1, 2, 500_000_000, 250_000_000) + ATTR_BYTES
    reply = codec.reply_entry(UNIQUE, 42, ATTRS, 1.5, 2.25, generation=3)
    assert reply == expected
    assert len(reply) == 16 + 128
    assert struct.unpack_from("<I", reply, 16 + 40 + 60)[0] == 0o100644  # fuse_attr.mode at offset 60


def test_reply_negative_entry():
    expected = out_header(144) + struct.pack("<QQQQII", 0, 0, 10, 0, 0, 0) + bytes(88)
    assert codec.reply_negative_entry(UNIQUE, 10.0) == expected


@pytest.mark.parametrize(("timeout", "expected"), [
    (0.0, (0, 0)), (-1.0, (0, 0)), (float("-inf"), (0, 0)), (math.nan, (0, 0)), (1e-9, (0, 1)),
    (0.999999999, (0, 999_999_999)), (86400.0, (86400, 0)), (float("inf"), (codec.TIMEOUT_FOREVER, 0)),
    (1e300, (codec.TIMEOUT_FOREVER, 0)),
])
def test_timeouts(timeout, expected):
    reply = codec.reply_attr(UNIQUE, ATTRS, timeout)
    assert struct.unpack_from("<QI", reply, 16) == expected


def test_reply_attr():
    assert codec.reply_attr(UNIQUE, ATTRS, 1.0) == out_header(120) + struct.pack("<QII", 1, 0, 0) + ATTR_BYTES


def test_reply_attr_of_os_stat(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"12345")
    found = os.stat(path)
    reply = codec.reply_attr(UNIQUE, found, 0.0)
    ino, size = struct.unpack_from("<QQ", reply, 32)
    mode, nlink = struct.unpack_from("<II", reply, 32 + 60)
    assert (ino, size, mode, nlink) == (found.st_ino, 5, found.st_mode, 1)


def test_reply_open_and_create():
    assert codec.reply_open(UNIQUE, 2**63, abi.FOPEN_KEEP_CACHE) == out_header(32) + struct.pack("<QIi", 2**63, 2, 0)
    assert codec.reply_open(UNIQUE, 1, abi.FOPEN_PASSTHROUGH, backing_id=-1)[-4:] == struct.pack("<i", -1)
    create = codec.reply_create(UNIQUE, 42, ATTRS, 1.0, 1.0, 9, abi.FOPEN_DIRECT_IO)
    assert create == (out_header(160) + struct.pack("<QQQQII", 42, 0, 1, 1, 0, 0) + ATTR_BYTES
                      + struct.pack("<QIi", 9, 1, 0))


def test_small_replies():
    assert codec.reply_write(UNIQUE, 131072) == out_header(24) + struct.pack("<II", 131072, 0)
    assert codec.reply_xattr_size(UNIQUE, 17) == out_header(24) + struct.pack("<II", 17, 0)
    assert codec.reply_lseek(UNIQUE, 2**40) == out_header(24) + struct.pack("<Q", 2**40)
    assert codec.reply_readlink(UNIQUE, b"../t") == out_header(20) + b"../t"
    statfs = codec.reply_statfs(UNIQUE, blocks=1, bfree=2, bavail=3, files=4, ffree=5, bsize=4096, namelen=255,
                                frsize=512)
    assert statfs == out_header(96) + struct.pack("<QQQQQIIII", 1, 2, 3, 4, 5, 4096, 255, 512, 0) + bytes(24)


def test_reply_init_size_follows_the_minor():
    def reply(minor: int) -> bytes:
        return codec.reply_init(UNIQUE, minor, max_readahead=1, flags=abi.INIT_EXT | abi.PASSTHROUGH,
                                max_background=2, congestion_threshold=3, max_write=4096, time_gran=1,
                                max_pages=1, max_stack_depth=1)
    full = reply(23)
    assert full == out_header(80) + struct.pack("<IIIIHHIIHHIIH22x", 7, 23, 1, 1 << 30, 2, 3, 4096, 1, 1, 0, 1 << 5,
                                                1, 0)
    assert reply(22) == out_header(40) + struct.pack("<IIIIHHI", 7, 22, 1, 1 << 30, 2, 3, 4096)


# -- directory listings --------------------------------------------------------------------------------

def test_dirents():
    dirents = codec.Dirents(4096, plus=False)
    assert dirents.add(b"a", 5, stat.S_IFREG | 0o644, 1)
    assert dirents.add(b"12345678", 6, stat.S_IFDIR | 0o755, 2)
    assert dirents.add(b"link", 7, stat.S_IFLNK | 0o777, 3)
    assert dirents.reply(UNIQUE) == (out_header(16 + 32 + 32 + 32)
                                     + struct.pack("<QQII", 5, 1, 1, 8) + b"a" + bytes(7)
                                     + struct.pack("<QQII", 6, 2, 8, 4) + b"12345678"
                                     + struct.pack("<QQII", 7, 3, 4, 10) + b"link" + bytes(4))


def test_dirents_stop_at_the_size():
    dirents = codec.Dirents(64 + 31, plus=False)
    assert dirents.add(b"a", 1, stat.S_IFREG, 1)
    assert dirents.add(b"b", 2, stat.S_IFREG, 2)
    assert not dirents.add(b"c", 3, stat.S_IFREG, 3)
    assert len(dirents.reply(UNIQUE)) == 16 + 64
    assert codec.Dirents(4096, plus=True).reply(UNIQUE) == out_header(16)  # the end of the directory


def test_direntplus():
    dirents = codec.Dirents(4096, plus=True)
    assert dirents.add(b".", 1, stat.S_IFDIR, 1)  # nodeid 0: no lookup
    assert dirents.add(b"file", 42, ATTRS.st_mode, 2, attr=ATTRS, entry_timeout=1.0, attr_timeout=0.5, nodeid=42)
    assert not codec.Dirents(128 + 24 + 7, plus=True).add(b"a", 1, stat.S_IFREG, 1)
    assert dirents.reply(UNIQUE) == (out_header(16 + 160 + 160)
                                     + bytes(128) + struct.pack("<QQII", 1, 1, 1, 4) + b"." + bytes(7)
                                     + struct.pack("<QQQQII", 42, 0, 1, 0, 0, 500_000_000) + ATTR_BYTES
                                     + struct.pack("<QQII", 42, 2, 4, 8) + b"file" + bytes(4))


@pytest.mark.parametrize("name", [b"", b"a/b", b"a\0b", b"n" * 1025])
def test_dirent_names_the_kernel_refuses(name):
    with pytest.raises(ValueError):
        codec.Dirents(4096, plus=False).add(name, 1, stat.S_IFREG, 1)


def test_direntplus_with_a_node_needs_its_attributes():
    with pytest.raises(ValueError):
        codec.Dirents(4096, plus=True).add(b"f", 1, stat.S_IFREG, 1, nodeid=1)
    assert codec.Dirents(4096, plus=False).add(b"f", 1, stat.S_IFREG, 1, nodeid=1)  # READDIR has no attributes


# -- notifications -------------------------------------------------------------------------------------

def test_notifications():
    assert codec.notify_store_header(42, 4096, 100) == struct.pack("<IiQ", 140, 4, 0) + struct.pack("<QQII", 42, 4096,
                                                                                                    100, 0)
    assert codec.notify_inval_inode(42, -1, 0) == struct.pack("<IiQ", 40, 2, 0) + struct.pack("<Qqq", 42, -1, 0)
    assert codec.notify_inval_entry(1, b"name", abi.EXPIRE_ONLY) == (struct.pack("<IiQ", 37, 3, 0)
                                                                     + struct.pack("<QII", 1, 4, 1) + b"name\0")
    assert codec.notify_delete(1, 42, b"gone") == (struct.pack("<IiQ", 45, 6, 0) + struct.pack("<QQII", 1, 42, 4, 0)
                                                   + b"gone\0")


# -- nothing but DecodeError ---------------------------------------------------------------------------

def decodes_or_refuses(buffer: bytes) -> None:
    try:
        header, body = codec.decode(buffer)
    except codec.DecodeError as err:
        assert err.errno in (errno.EINVAL, errno.ENAMETOOLONG, errno.ENOSYS)
        assert (err.unique is None) == (len(buffer) < abi.IN_HEADER.size)
        return
    assert header.length == len(buffer)
    assert header.opcode in codec.DECODED_OPCODES
    if isinstance(body, codec.Write):
        assert body.size == len(body.data)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_arbitrary_bytes(buffer):
    decodes_or_refuses(buffer)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(sorted(codec.DECODED_OPCODES) + [0, 7, 31, 53, 4096]), st.binary(max_size=400),
       st.one_of(st.just(0), st.integers(min_value=0, max_value=70)), st.integers(min_value=0, max_value=2**64 - 1))
def test_fuzz_arbitrary_bodies(opcode, body, total_extlen, unique):
    length = abi.IN_HEADER.size + len(body)
    decodes_or_refuses(abi.IN_HEADER.pack(length, opcode, unique, 1, 0, 0, 0, total_extlen) + body)


@settings(max_examples=2000, deadline=None)
@given(st.sampled_from(ROUND_TRIPS), st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
       st.one_of(st.none(), st.integers(min_value=0)), st.one_of(st.just(b""), st.binary(max_size=64)),
       st.booleans())
def test_fuzz_mutated_requests(case, flips, cut, tail, fix_length):
    """A valid request with bytes changed, maybe cut short, maybe lengthened;
    its ``len`` made right again or not, so the mutations reach the bodies."""
    opcode, body, _ = case
    buffer = bytearray(request(opcode, body))
    for position, value in flips:
        buffer[position % len(buffer)] = value
    if cut is not None:
        del buffer[cut % (len(buffer) + 1):]
    buffer += tail
    if fix_length and len(buffer) >= 4:
        struct.pack_into("<I", buffer, 0, len(buffer))
    decodes_or_refuses(bytes(buffer))
