"""FUSE replies and notifications without I/O: each encoded as the bytes to
write to ``/dev/fuse`` (or the header to write before data not copied here).

The request loop and a data-plane worker (which answers READs and stores
pages itself) both write them.
"""

from __future__ import annotations

import struct
from typing import Protocol

from rapidmount.shared import fuse_abi as abi
from rapidmount.shared.fuse_abi import NS_PER_SECOND

#: What an infinite cache timeout becomes: the kernel caps any timeout it
#: cannot count in jiffies, and this one stays positive read as signed or not.
TIMEOUT_FOREVER = 2**63 - 1
_S_IFMT = 0o170000


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
    return whole, int((seconds - whole) * NS_PER_SECOND)


def _attr(attr: StatLike) -> tuple[int, ...]:
    """``fuse_attr``'s fields, in order."""
    atime, atimensec = divmod(attr.st_atime_ns, NS_PER_SECOND)
    mtime, mtimensec = divmod(attr.st_mtime_ns, NS_PER_SECOND)
    ctime, ctimensec = divmod(attr.st_ctime_ns, NS_PER_SECOND)
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


def reply_data(unique: int, data: abi.Buffer) -> list[abi.Buffer]:
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
