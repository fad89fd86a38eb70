"""The FUSE kernel protocol without I/O: requests decoded from the bytes read
from ``/dev/fuse``, replies and notifications encoded as the bytes to write.

No I/O happens here, so the request loop and a data-plane worker share it and
tests drive it with plain bytes. :func:`decode` trusts nothing: whatever the
buffer holds, it returns a request or raises :class:`DecodeError` with the
errno to answer. The codec speaks protocol 7.31 to 7.45 (:data:`abi.MIN_MINOR`
to :data:`abi.MAX_MINOR`): the request structs it reads have one size across
those minors, and the extension area some 7.38 requests carry is skipped.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from errno import EINVAL, ENAMETOOLONG, ENOSYS
from typing import Protocol, TypeAlias

from rapidmount.shared import fuse_abi as abi

Buffer: TypeAlias = bytes | bytearray | memoryview

_NS_PER_SECOND = 1_000_000_000
#: What an infinite cache timeout becomes: the kernel caps any timeout it
#: cannot count in jiffies, and this one stays positive read as signed or not.
TIMEOUT_FOREVER = 2**63 - 1
_S_IFMT = 0o170000


class DecodeError(Exception):
    """A request that cannot be decoded: answer it with ``errno``, unless
    ``unique`` is None (the buffer was too short to tell which request it was)."""

    def __init__(self, unique: int | None, errno: int) -> None:
        super().__init__(unique, errno)
        self.unique = unique
        self.errno = errno

    def __str__(self) -> str:
        return f"undecodable FUSE request (unique {self.unique}): {os.strerror(self.errno)}"


# -- requests ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Header:
    """A request's ``fuse_in_header``: ``length`` is the whole request's."""

    length: int
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int


@dataclass(frozen=True, slots=True)
class Lookup:
    name: bytes


@dataclass(frozen=True, slots=True)
class Forget:
    nlookup: int


@dataclass(frozen=True, slots=True)
class BatchForget:
    items: tuple[tuple[int, int], ...]  # (nodeid, nlookup)


@dataclass(frozen=True, slots=True)
class Getattr:
    fh: int | None  # the open file's handle, for fstat()


@dataclass(frozen=True, slots=True)
class Setattr:
    """Only the fields ``valid`` names (``abi.FATTR_*``) mean anything;
    FATTR_ATIME_NOW and FATTR_MTIME_NOW stay in ``valid``, for the server's clock."""

    valid: int
    fh: int
    size: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    mode: int
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class Readlink:
    pass


@dataclass(frozen=True, slots=True)
class Symlink:
    name: bytes
    target: bytes


@dataclass(frozen=True, slots=True)
class Mknod:
    name: bytes
    mode: int
    rdev: int
    umask: int


@dataclass(frozen=True, slots=True)
class Mkdir:
    name: bytes
    mode: int
    umask: int


@dataclass(frozen=True, slots=True)
class Unlink:
    name: bytes


@dataclass(frozen=True, slots=True)
class Rmdir:
    name: bytes


@dataclass(frozen=True, slots=True)
class Rename:
    """RENAME (``flags`` 0) and RENAME2 (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``, ...)."""

    newdir: int
    old: bytes
    new: bytes
    flags: int


@dataclass(frozen=True, slots=True)
class Link:
    oldnodeid: int
    name: bytes


@dataclass(frozen=True, slots=True)
class Open:
    flags: int  # open(2)'s
    open_flags: int  # abi.OPEN_KILL_SUIDGID


@dataclass(frozen=True, slots=True)
class Read:
    fh: int
    offset: int
    size: int
    read_flags: int
    lock_owner: int
    flags: int


@dataclass(frozen=True, slots=True)
class Write:
    """``data`` is a view of the decoded buffer: it is valid while that buffer
    is, so a loop that reuses its read buffer copies or consumes it first."""

    fh: int
    offset: int
    size: int
    write_flags: int
    lock_owner: int
    flags: int
    data: memoryview


@dataclass(frozen=True, slots=True)
class Statfs:
    pass


@dataclass(frozen=True, slots=True)
class Release:
    """RELEASE and RELEASEDIR."""

    fh: int
    flags: int
    release_flags: int
    lock_owner: int


@dataclass(frozen=True, slots=True)
class Fsync:
    """FSYNC and FSYNCDIR."""

    fh: int
    fsync_flags: int


@dataclass(frozen=True, slots=True)
class Setxattr:
    name: bytes
    value: bytes
    flags: int


@dataclass(frozen=True, slots=True)
class Getxattr:
    name: bytes
    size: int  # 0: the caller asks for the value's size only


@dataclass(frozen=True, slots=True)
class Listxattr:
    size: int  # 0: the caller asks for the list's size only


@dataclass(frozen=True, slots=True)
class Removexattr:
    name: bytes


@dataclass(frozen=True, slots=True)
class Flush:
    fh: int
    lock_owner: int


@dataclass(frozen=True, slots=True)
class Init:
    """``flags`` holds flags2 in its high 32 bits when the kernel set INIT_EXT."""

    major: int
    minor: int
    max_readahead: int
    flags: int


@dataclass(frozen=True, slots=True)
class Opendir:
    flags: int
    open_flags: int


@dataclass(frozen=True, slots=True)
class Readdir:
    """READDIR and READDIRPLUS (the header's opcode tells which)."""

    fh: int
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Access:
    mask: int


@dataclass(frozen=True, slots=True)
class Create:
    name: bytes
    flags: int
    mode: int
    umask: int
    open_flags: int


@dataclass(frozen=True, slots=True)
class Interrupt:
    unique: int  # the request to interrupt


@dataclass(frozen=True, slots=True)
class Destroy:
    pass


@dataclass(frozen=True, slots=True)
class Fallocate:
    fh: int
    offset: int
    length: int
    mode: int


@dataclass(frozen=True, slots=True)
class Lseek:
    fh: int
    offset: int
    whence: int


@dataclass(frozen=True, slots=True)
class CopyFileRange:
    fh_in: int
    off_in: int
    nodeid_out: int
    fh_out: int
    off_out: int
    length: int
    flags: int


Body: TypeAlias = (
    Lookup | Forget | BatchForget | Getattr | Setattr | Readlink | Symlink | Mknod | Mkdir | Unlink | Rmdir
    | Rename | Link | Open | Read | Write | Statfs | Release | Fsync | Setxattr | Getxattr | Listxattr
    | Removexattr | Flush | Init | Opendir | Readdir | Access | Create | Interrupt | Destroy | Fallocate
    | Lseek | CopyFileRange
)

# Requests with no body are all alike: one of each serves every request.
_READLINK, _STATFS, _DESTROY = Readlink(), Statfs(), Destroy()


def _name(raw: bytes, start: int) -> tuple[bytes, int]:
    """The NUL-terminated name at ``start`` of ``raw``, and where what follows
    its NUL begins."""
    end = raw.find(b"\0", start)
    if end <= start:  # no NUL, or an empty name
        raise DecodeError(None, EINVAL)
    if end - start > abi.NAME_MAX:
        raise DecodeError(None, ENAMETOOLONG)
    return raw[start:end], end + 1


def _lookup(body: memoryview) -> Lookup:
    return Lookup(_name(bytes(body), 0)[0])


def _forget(body: memoryview) -> Forget:
    return Forget(abi.FORGET_IN.unpack_from(body)[0])


def _batch_forget(body: memoryview) -> BatchForget:
    (count,) = abi.BATCH_FORGET_IN.unpack_from(body)
    end = abi.BATCH_FORGET_IN.size + count * abi.FORGET_ONE.size
    if end > len(body):
        raise DecodeError(None, EINVAL)
    return BatchForget(tuple(abi.FORGET_ONE.iter_unpack(body[abi.BATCH_FORGET_IN.size:end])))


def _getattr(body: memoryview) -> Getattr:
    getattr_flags, fh = abi.GETATTR_IN.unpack_from(body)
    return Getattr(fh if getattr_flags & abi.GETATTR_FH else None)


def _setattr(body: memoryview) -> Setattr:
    (valid, fh, size, _lock_owner, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
     mode, uid, gid) = abi.SETATTR_IN.unpack_from(body)
    return Setattr(valid, fh, size, atime * _NS_PER_SECOND + atimensec, mtime * _NS_PER_SECOND + mtimensec,
                   ctime * _NS_PER_SECOND + ctimensec, mode, uid, gid)


def _readlink(body: memoryview) -> Readlink:
    return _READLINK


def _symlink(body: memoryview) -> Symlink:
    raw = bytes(body)
    name, start = _name(raw, 0)
    end = raw.find(b"\0", start)
    if end <= start:  # the target is not a name: no length limit, but never empty
        raise DecodeError(None, EINVAL)
    return Symlink(name, raw[start:end])


def _mknod(body: memoryview) -> Mknod:
    mode, rdev, umask = abi.MKNOD_IN.unpack_from(body)
    return Mknod(_name(bytes(body), abi.MKNOD_IN.size)[0], mode, rdev, umask)


def _mkdir(body: memoryview) -> Mkdir:
    mode, umask = abi.MKDIR_IN.unpack_from(body)
    return Mkdir(_name(bytes(body), abi.MKDIR_IN.size)[0], mode, umask)


def _unlink(body: memoryview) -> Unlink:
    return Unlink(_name(bytes(body), 0)[0])


def _rmdir(body: memoryview) -> Rmdir:
    return Rmdir(_name(bytes(body), 0)[0])


def _names_after(body: memoryview, start: int) -> tuple[bytes, bytes]:
    """The two names RENAME and RENAME2 send after their struct: old, new."""
    raw = bytes(body)
    old, start = _name(raw, start)
    return old, _name(raw, start)[0]


def _rename(body: memoryview) -> Rename:
    (newdir,) = abi.RENAME_IN.unpack_from(body)
    return Rename(newdir, *_names_after(body, abi.RENAME_IN.size), 0)


def _rename2(body: memoryview) -> Rename:
    newdir, flags = abi.RENAME2_IN.unpack_from(body)
    return Rename(newdir, *_names_after(body, abi.RENAME2_IN.size), flags)


def _link(body: memoryview) -> Link:
    (oldnodeid,) = abi.LINK_IN.unpack_from(body)
    return Link(oldnodeid, _name(bytes(body), abi.LINK_IN.size)[0])


def _open(body: memoryview) -> Open:
    return Open(*abi.OPEN_IN.unpack_from(body))


def _read(body: memoryview) -> Read:
    return Read(*abi.READ_IN.unpack_from(body))


def _write(body: memoryview) -> Write:
    fh, offset, size, write_flags, lock_owner, flags = abi.WRITE_IN.unpack_from(body)
    data = body[abi.WRITE_IN.size:]
    if size != len(data):
        raise DecodeError(None, EINVAL)
    return Write(fh, offset, size, write_flags, lock_owner, flags, data)


def _statfs(body: memoryview) -> Statfs:
    return _STATFS


def _release(body: memoryview) -> Release:
    return Release(*abi.RELEASE_IN.unpack_from(body))


def _fsync(body: memoryview) -> Fsync:
    return Fsync(*abi.FSYNC_IN.unpack_from(body))


def _setxattr(body: memoryview) -> Setxattr:
    size, flags = abi.SETXATTR_IN_COMPAT.unpack_from(body)
    raw = bytes(body)
    name, start = _name(raw, abi.SETXATTR_IN_COMPAT.size)
    if start + size > len(raw):
        raise DecodeError(None, EINVAL)
    return Setxattr(name, raw[start:start + size], flags)


def _getxattr(body: memoryview) -> Getxattr:
    (size,) = abi.GETXATTR_IN.unpack_from(body)
    return Getxattr(_name(bytes(body), abi.GETXATTR_IN.size)[0], size)


def _listxattr(body: memoryview) -> Listxattr:
    return Listxattr(abi.GETXATTR_IN.unpack_from(body)[0])


def _removexattr(body: memoryview) -> Removexattr:
    return Removexattr(_name(bytes(body), 0)[0])


def _flush(body: memoryview) -> Flush:
    return Flush(*abi.FLUSH_IN.unpack_from(body))


def _init(body: memoryview) -> Init:
    major, minor, max_readahead, flags = abi.INIT_IN_COMPAT.unpack_from(body)
    # From 7.36 the kernel sends the whole fuse_init_in; flags2 counts only with INIT_EXT.
    if major == abi.KERNEL_MAJOR and minor >= abi.INIT_IN_FULL_MINOR:
        flags2 = abi.INIT_IN.unpack_from(body)[4]
        if flags & abi.INIT_EXT:
            flags |= flags2 << 32
    return Init(major, minor, max_readahead, flags)


def _opendir(body: memoryview) -> Opendir:
    return Opendir(*abi.OPEN_IN.unpack_from(body))


def _readdir(body: memoryview) -> Readdir:
    fh, offset, size, _read_flags, _lock_owner, _flags = abi.READ_IN.unpack_from(body)
    return Readdir(fh, offset, size)


def _access(body: memoryview) -> Access:
    return Access(abi.ACCESS_IN.unpack_from(body)[0])


def _create(body: memoryview) -> Create:
    flags, mode, umask, open_flags = abi.CREATE_IN.unpack_from(body)
    return Create(_name(bytes(body), abi.CREATE_IN.size)[0], flags, mode, umask, open_flags)


def _interrupt(body: memoryview) -> Interrupt:
    return Interrupt(abi.INTERRUPT_IN.unpack_from(body)[0])


def _destroy(body: memoryview) -> Destroy:
    return _DESTROY


def _fallocate(body: memoryview) -> Fallocate:
    return Fallocate(*abi.FALLOCATE_IN.unpack_from(body))


def _lseek(body: memoryview) -> Lseek:
    return Lseek(*abi.LSEEK_IN.unpack_from(body))


def _copy_file_range(body: memoryview) -> CopyFileRange:
    return CopyFileRange(*abi.COPY_FILE_RANGE_IN.unpack_from(body))


# Every opcode decoded; the rest (locks, ioctl, poll, bmap, tmpfile, statx, ...) is answered ENOSYS,
# which makes the kernel fall back (STATX to GETATTR, COPY_FILE_RANGE_64 to COPY_FILE_RANGE) or fail.
_DECODERS: dict[int, Callable[[memoryview], Body]] = {
    abi.Opcode.LOOKUP: _lookup,
    abi.Opcode.FORGET: _forget,
    abi.Opcode.GETATTR: _getattr,
    abi.Opcode.SETATTR: _setattr,
    abi.Opcode.READLINK: _readlink,
    abi.Opcode.SYMLINK: _symlink,
    abi.Opcode.MKNOD: _mknod,
    abi.Opcode.MKDIR: _mkdir,
    abi.Opcode.UNLINK: _unlink,
    abi.Opcode.RMDIR: _rmdir,
    abi.Opcode.RENAME: _rename,
    abi.Opcode.LINK: _link,
    abi.Opcode.OPEN: _open,
    abi.Opcode.READ: _read,
    abi.Opcode.WRITE: _write,
    abi.Opcode.STATFS: _statfs,
    abi.Opcode.RELEASE: _release,
    abi.Opcode.FSYNC: _fsync,
    abi.Opcode.SETXATTR: _setxattr,
    abi.Opcode.GETXATTR: _getxattr,
    abi.Opcode.LISTXATTR: _listxattr,
    abi.Opcode.REMOVEXATTR: _removexattr,
    abi.Opcode.FLUSH: _flush,
    abi.Opcode.INIT: _init,
    abi.Opcode.OPENDIR: _opendir,
    abi.Opcode.READDIR: _readdir,
    abi.Opcode.RELEASEDIR: _release,
    abi.Opcode.FSYNCDIR: _fsync,
    abi.Opcode.ACCESS: _access,
    abi.Opcode.CREATE: _create,
    abi.Opcode.INTERRUPT: _interrupt,
    abi.Opcode.DESTROY: _destroy,
    abi.Opcode.BATCH_FORGET: _batch_forget,
    abi.Opcode.FALLOCATE: _fallocate,
    abi.Opcode.READDIRPLUS: _readdir,
    abi.Opcode.RENAME2: _rename2,
    abi.Opcode.LSEEK: _lseek,
    abi.Opcode.COPY_FILE_RANGE: _copy_file_range,
}

#: The opcodes :func:`decode` decodes; any other raises DecodeError(ENOSYS).
DECODED_OPCODES = frozenset(abi.Opcode(opcode) for opcode in _DECODERS)

_HEADER_SIZE = abi.IN_HEADER.size
_unpack_header = abi.IN_HEADER.unpack_from


def decode(buffer: Buffer) -> tuple[Header, Body]:
    """The request in ``buffer``, exactly one request as read from ``/dev/fuse``.

    Raises DecodeError: a buffer shorter than the header (``unique`` None) or
    whose ``len`` is not its length, a body shorter than its struct, a name
    with no NUL or empty (EINVAL), a name longer than NAME_MAX (ENAMETOOLONG),
    an opcode this codec does not decode (ENOSYS). The extension area at the
    end of a request (``total_extlen`` 8-byte units, 7.38) is not read.
    """
    view = memoryview(buffer)
    if len(view) < _HEADER_SIZE:
        raise DecodeError(None, EINVAL)
    length, opcode, unique, nodeid, uid, gid, pid, total_extlen = _unpack_header(view)
    if length != len(view):
        raise DecodeError(unique, EINVAL)
    decoder = _DECODERS.get(opcode)
    if decoder is None:
        raise DecodeError(unique, ENOSYS)
    end = length - total_extlen * 8
    if end < _HEADER_SIZE:
        raise DecodeError(unique, EINVAL)
    try:
        body = decoder(view[_HEADER_SIZE:end])
    except struct.error:  # a body shorter than its struct
        raise DecodeError(unique, EINVAL) from None
    except DecodeError as err:
        raise DecodeError(unique, err.errno) from None
    return Header(length, opcode, unique, nodeid, uid, gid, pid), body


# -- replies -------------------------------------------------------------------------------------------


class StatLike(Protocol):
    """The attributes a reply carries: :class:`os.stat_result` has them, and
    so may any object (rdev is always 0, flags too)."""

    @property
    def st_ino(self) -> int: ...
    @property
    def st_mode(self) -> int: ...
    @property
    def st_nlink(self) -> int: ...
    @property
    def st_size(self) -> int: ...
    @property
    def st_uid(self) -> int: ...
    @property
    def st_gid(self) -> int: ...
    @property
    def st_blksize(self) -> int: ...
    @property
    def st_blocks(self) -> int: ...
    @property
    def st_atime_ns(self) -> int: ...
    @property
    def st_mtime_ns(self) -> int: ...
    @property
    def st_ctime_ns(self) -> int: ...


def _struct_after_header(body: struct.Struct) -> struct.Struct:
    """One struct for a whole message: ``fuse_out_header`` then ``body``."""
    return struct.Struct(abi.OUT_HEADER.format + body.format[1:])


_pack_header = abi.OUT_HEADER.pack
_ENTRY_REPLY = _struct_after_header(abi.ENTRY_OUT)
_ATTR_REPLY = _struct_after_header(abi.ATTR_OUT)
_OPEN_REPLY = _struct_after_header(abi.OPEN_OUT)
_CREATE_REPLY = struct.Struct(_ENTRY_REPLY.format + abi.OPEN_OUT.format[1:])
_WRITE_REPLY = _struct_after_header(abi.WRITE_OUT)
_STATFS_REPLY = _struct_after_header(abi.STATFS_OUT)
_XATTR_SIZE_REPLY = _struct_after_header(abi.GETXATTR_OUT)
_LSEEK_REPLY = _struct_after_header(abi.LSEEK_OUT)
_INIT_REPLY = _struct_after_header(abi.INIT_OUT)
_NO_ATTR = (0,) * 16


def _timeout(seconds: float) -> tuple[int, int]:
    """A cache timeout as the kernel takes it, (seconds, nanoseconds): none
    for a negative (or NaN) one, :data:`TIMEOUT_FOREVER` for an endless one."""
    if not seconds > 0.0:
        return 0, 0
    if seconds >= TIMEOUT_FOREVER:
        return TIMEOUT_FOREVER, 0
    whole = int(seconds)
    return whole, int((seconds - whole) * _NS_PER_SECOND)


def _attr(attr: StatLike) -> tuple[int, ...]:
    """``fuse_attr``'s fields, in order."""
    atime, atimensec = divmod(attr.st_atime_ns, _NS_PER_SECOND)
    mtime, mtimensec = divmod(attr.st_mtime_ns, _NS_PER_SECOND)
    ctime, ctimensec = divmod(attr.st_ctime_ns, _NS_PER_SECOND)
    return (attr.st_ino, attr.st_size, attr.st_blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
            attr.st_mode, attr.st_nlink, attr.st_uid, attr.st_gid, 0, attr.st_blksize, 0)


def _entry_fields(nodeid: int, attr: StatLike | None, entry_timeout: float, attr_timeout: float,
                  generation: int) -> tuple[int, ...]:
    """``fuse_entry_out``'s fields, in order."""
    entry_valid, entry_valid_nsec = _timeout(entry_timeout)
    attr_valid, attr_valid_nsec = _timeout(attr_timeout)
    return (nodeid, generation, entry_valid, attr_valid, entry_valid_nsec, attr_valid_nsec,
            *(_NO_ATTR if attr is None else _attr(attr)))


def reply_error(unique: int, errno: int) -> bytes:
    """The failure of request ``unique``. The kernel refuses errnos outside
    1..511, and the request would then wait forever: ValueError here instead."""
    if not 0 < errno < 512:
        raise ValueError(f"no FUSE reply can carry errno {errno}")
    return _pack_header(abi.OUT_HEADER.size, -errno, unique)


def reply_empty(unique: int) -> bytes:
    """Success with no data."""
    return _pack_header(abi.OUT_HEADER.size, 0, unique)


def reply_header(unique: int, length: int) -> bytes:
    """The header of a success reply whose ``length`` data bytes are written
    after it (writev), without being copied here."""
    return _pack_header(abi.OUT_HEADER.size + length, 0, unique)


def reply_data(unique: int, data: Buffer) -> list[Buffer]:
    """A success reply carrying ``data``, as the buffers of one writev."""
    return [reply_header(unique, len(data)), data]


def reply_entry(unique: int, nodeid: int, attr: StatLike, entry_timeout: float, attr_timeout: float,
                generation: int = 0) -> bytes:
    """A LOOKUP, MKNOD, MKDIR, SYMLINK or LINK answered with an inode: each
    such reply counts as one lookup of ``nodeid`` until FORGET."""
    return _ENTRY_REPLY.pack(_ENTRY_REPLY.size, 0, unique,
                             *_entry_fields(nodeid, attr, entry_timeout, attr_timeout, generation))


def reply_negative_entry(unique: int, entry_timeout: float) -> bytes:
    """A LOOKUP of a name that does not exist, cached as such for ``entry_timeout``."""
    return _ENTRY_REPLY.pack(_ENTRY_REPLY.size, 0, unique, *_entry_fields(0, None, entry_timeout, 0.0, 0))


def reply_attr(unique: int, attr: StatLike, attr_timeout: float) -> bytes:
    """A GETATTR or SETATTR answered."""
    attr_valid, attr_valid_nsec = _timeout(attr_timeout)
    return _ATTR_REPLY.pack(_ATTR_REPLY.size, 0, unique, attr_valid, attr_valid_nsec, *_attr(attr))


def reply_open(unique: int, fh: int, open_flags: int, backing_id: int = 0) -> bytes:
    """An OPEN or OPENDIR answered: ``open_flags`` are ``abi.FOPEN_*``;
    ``backing_id`` names a passthrough backing file (with FOPEN_PASSTHROUGH)."""
    return _OPEN_REPLY.pack(_OPEN_REPLY.size, 0, unique, fh, open_flags, backing_id)


def reply_create(unique: int, nodeid: int, attr: StatLike, entry_timeout: float, attr_timeout: float,
                 fh: int, open_flags: int, backing_id: int = 0) -> bytes:
    """A CREATE answered: the new entry (one lookup, as :func:`reply_entry`) and its open file."""
    return _CREATE_REPLY.pack(_CREATE_REPLY.size, 0, unique,
                              *_entry_fields(nodeid, attr, entry_timeout, attr_timeout, 0),
                              fh, open_flags, backing_id)


def reply_write(unique: int, size: int) -> bytes:
    """A WRITE answered with the bytes written."""
    return _WRITE_REPLY.pack(_WRITE_REPLY.size, 0, unique, size)


def reply_statfs(unique: int, blocks: int, bfree: int, bavail: int, files: int, ffree: int, bsize: int,
                 namelen: int, frsize: int) -> bytes:
    """A STATFS answered, fields as statvfs(3) names them."""
    return _STATFS_REPLY.pack(_STATFS_REPLY.size, 0, unique, blocks, bfree, bavail, files, ffree, bsize,
                              namelen, frsize)


def reply_readlink(unique: int, target: bytes) -> bytes:
    """A READLINK answered: the target, with no NUL."""
    return reply_header(unique, len(target)) + target


def reply_xattr_size(unique: int, size: int) -> bytes:
    """A GETXATTR or LISTXATTR of size 0 answered with the size the value or list needs."""
    return _XATTR_SIZE_REPLY.pack(_XATTR_SIZE_REPLY.size, 0, unique, size)


def reply_lseek(unique: int, offset: int) -> bytes:
    """An LSEEK (SEEK_DATA, SEEK_HOLE) answered."""
    return _LSEEK_REPLY.pack(_LSEEK_REPLY.size, 0, unique, offset)


def reply_init(unique: int, minor: int, *, max_readahead: int, flags: int, max_background: int,
               congestion_threshold: int, max_write: int, time_gran: int, max_pages: int,
               max_stack_depth: int) -> bytes:
    """An INIT answered at protocol 7.``minor``: ``fuse_init_out`` as long as
    that minor defines it, ``flags`` split into flags and flags2."""
    message = _INIT_REPLY.pack(_INIT_REPLY.size, 0, unique, abi.KERNEL_MAJOR, minor, max_readahead,
                               flags & 0xFFFFFFFF, max_background, congestion_threshold, max_write, time_gran,
                               max_pages, 0, flags >> 32, max_stack_depth, 0)
    if minor >= abi.INIT_OUT_FULL_MINOR:
        return message
    length = abi.OUT_HEADER.size + abi.INIT_OUT_COMPAT_22_SIZE
    return _pack_header(length, 0, unique) + message[abi.OUT_HEADER.size:length]


class Dirents:
    """A READDIR (``plus`` False) or READDIRPLUS reply, filled entry by entry
    up to the ``size`` the request allows."""

    __slots__ = ("size", "plus", "_records")

    def __init__(self, size: int, plus: bool) -> None:
        self.size = size
        self.plus = plus
        self._records = bytearray()

    def add(self, name: bytes, ino: int, kind_mode: int, next_offset: int, attr: StatLike | None = None,
            entry_timeout: float = 0.0, attr_timeout: float = 0.0, nodeid: int = 0) -> bool:
        """Add one entry; False when it does not fit (then nothing was added).

        ``next_offset`` is the offset a READDIR resumes from after this entry;
        the type comes from ``kind_mode``'s S_IFMT bits. For READDIRPLUS an
        entry with ``nodeid`` carries ``attr`` and counts as one lookup of
        ``nodeid``, except "." and "..", which the kernel skips; nodeid 0 makes
        a plain entry. A name the kernel would fail the whole listing for
        (empty, with "/" or NUL, longer than FUSE_NAME_MAX) raises ValueError.
        """
        namelen = len(name)
        if not 0 < namelen <= abi.FUSE_NAME_MAX or b"/" in name or b"\0" in name:
            raise ValueError(f"not a directory entry's name: {name!r}")
        padding = -namelen % 8
        record = abi.DIRENT.size + namelen + padding
        if self.plus:
            if nodeid and attr is None:
                raise ValueError("a READDIRPLUS entry with a node ID needs its attributes")
            record += abi.ENTRY_OUT.size
        if len(self._records) + record > self.size:
            return False
        if self.plus:
            self._records += abi.ENTRY_OUT.pack(*_entry_fields(nodeid, attr, entry_timeout, attr_timeout, 0))
        self._records += abi.DIRENT.pack(ino, next_offset, namelen, (kind_mode & _S_IFMT) >> 12)
        self._records += name
        self._records += bytes(padding)
        return True

    def reply(self, unique: int) -> bytes:
        """The reply with the entries added; none tells the end of the directory."""
        return reply_header(unique, len(self._records)) + self._records


# -- notifications -------------------------------------------------------------------------------------

_STORE_NOTIFY = _struct_after_header(abi.NOTIFY_STORE_OUT)
_INVAL_INODE_NOTIFY = _struct_after_header(abi.NOTIFY_INVAL_INODE_OUT)
_INVAL_ENTRY_NOTIFY = _struct_after_header(abi.NOTIFY_INVAL_ENTRY_OUT)
_DELETE_NOTIFY = _struct_after_header(abi.NOTIFY_DELETE_OUT)


def notify_store_header(nodeid: int, offset: int, size: int) -> bytes:
    """The header of a STORE notification: the kernel puts the ``size`` bytes
    written after it into ``nodeid``'s page cache at ``offset``."""
    return _STORE_NOTIFY.pack(_STORE_NOTIFY.size + size, abi.NotifyCode.STORE, 0, nodeid, offset, size)


def notify_inval_inode(nodeid: int, offset: int, length: int) -> bytes:
    """Drop ``nodeid``'s cached pages from ``offset`` for ``length`` bytes (0:
    to the end; a negative offset drops its attributes only)."""
    return _INVAL_INODE_NOTIFY.pack(_INVAL_INODE_NOTIFY.size, abi.NotifyCode.INVAL_INODE, 0, nodeid, offset,
                                    length)


def notify_inval_entry(parent: int, name: bytes, flags: int = 0) -> bytes:
    """Drop the cached entry ``name`` of directory ``parent`` (``flags``:
    abi.EXPIRE_ONLY to expire it instead)."""
    return (_INVAL_ENTRY_NOTIFY.pack(_INVAL_ENTRY_NOTIFY.size + len(name) + 1, abi.NotifyCode.INVAL_ENTRY, 0,
                                     parent, len(name), flags)
            + name + b"\0")


def notify_delete(parent: int, child: int, name: bytes) -> bytes:
    """Entry ``name`` of ``parent``, inode ``child``, is gone: the kernel drops
    it and tells inotify watchers."""
    return (_DELETE_NOTIFY.pack(_DELETE_NOTIFY.size + len(name) + 1, abi.NotifyCode.DELETE, 0, parent, child,
                                len(name))
            + name + b"\0")
