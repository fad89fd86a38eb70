"""FUSE requests decoded without I/O: :func:`decode` turns the bytes of one
request read from ``/dev/fuse`` into its header and body
(:mod:`~rapidmount.shared.fuse_requests`).

:func:`decode` trusts nothing: whatever the buffer holds, it returns a request
or raises :class:`DecodeError` with the errno to answer. The request structs
it reads have one size across protocol 7.31 to 7.45 (:data:`abi.MIN_MINOR` to
:data:`abi.MAX_MINOR`), and the extension area some 7.38 requests carry is
skipped.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from errno import EINVAL, ENAMETOOLONG, ENOSYS

from rapidmount.shared import fuse_abi as abi
from rapidmount.shared.fuse_abi import NS_PER_SECOND
from rapidmount.shared.fuse_requests import (
    Access, BatchForget, Body, CopyFileRange, Create, Destroy, Fallocate, Flush, Forget, Fsync, Getattr, Getxattr,
    Header, Init, Interrupt, Link, Listxattr, Lookup, Lseek, Mkdir, Mknod, Open, Opendir, Read, Readdir, Readlink,
    Release, Removexattr, Rename, Rmdir, Setattr, Setxattr, Statfs, Symlink, Unlink, Write)


class DecodeError(Exception):
    """A request that cannot be decoded: answer it with ``errno``, unless
    ``unique`` is None (the buffer was too short to tell which request it was)."""

    def __init__(self, unique: int | None, errno: int) -> None:
        super().__init__(unique, errno)
        self.unique = unique
        self.errno = errno

    def __str__(self) -> str:
        return f"undecodable FUSE request (unique {self.unique}): {os.strerror(self.errno)}"


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
    return Setattr(valid, fh, size, atime * NS_PER_SECOND + atimensec, mtime * NS_PER_SECOND + mtimensec,
                   ctime * NS_PER_SECOND + ctimensec, mode, uid, gid)


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


def decode(buffer: abi.Buffer) -> tuple[Header, Body]:
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
