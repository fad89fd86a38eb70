"""The Linux FUSE kernel ABI (``include/uapi/linux/fuse.h``, protocol 7.45):
opcodes, flag bits and the layouts of the structs the codec reads and writes.

Layouts are :class:`struct.Struct` objects in little-endian byte order with no
implicit padding ("<"), field for field as the header declares them; the
header's padding and unused fields are pad bytes ("x"), so packing writes them
as zeros and unpacking skips them. Time seconds are signed (the kernel stores
them as ``time64_t``), so times before 1970 round-trip.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

#: The protocol major version; a kernel with another major is not spoken to.
KERNEL_MAJOR: Final = 7
#: The oldest protocol minor the mount accepts (Linux 5.15, which GKE nodes
#: run, speaks 7.34).
MIN_MINOR: Final = 31
#: The newest protocol minor this codec implements.
MAX_MINOR: Final = 45

#: The node ID of the root directory.
ROOT_ID: Final = 1
#: The kernel refuses to read requests into a smaller buffer.
MIN_READ_BUFFER: Final = 8192
#: The longest name the kernel sends or accepts in a dirent or notification.
FUSE_NAME_MAX: Final = 1024
#: The longest name this mount accepts in a request (POSIX NAME_MAX).
NAME_MAX: Final = 255
#: The size of the pages ``max_pages`` counts.
PAGE_SIZE: Final = 4096
#: ``max_pages`` when the kernel was not told one (FUSE_DEFAULT_MAX_PAGES_PER_REQ).
DEFAULT_MAX_PAGES: Final = 32
#: Where fusectl shows the kernel's FUSE connections (one directory each).
FUSECTL_ROOT = "/sys/fs/fuse/connections"
#: Set in a request's ``unique`` when the kernel resends it (HAS_RESEND).
UNIQUE_RESEND: Final = 1 << 63
#: Times come as seconds and nanoseconds (``fuse_attr``, ``fuse_setattr_in``).
NS_PER_SECOND: Final = 1_000_000_000

#: The bytes a request is decoded from, or a reply's data written from.
Buffer: TypeAlias = bytes | bytearray | memoryview


class Opcode(enum.IntEnum):
    """Request opcodes (``enum fuse_opcode``)."""

    LOOKUP = 1
    FORGET = 2
    GETATTR = 3
    SETATTR = 4
    READLINK = 5
    SYMLINK = 6
    MKNOD = 8
    MKDIR = 9
    UNLINK = 10
    RMDIR = 11
    RENAME = 12
    LINK = 13
    OPEN = 14
    READ = 15
    WRITE = 16
    STATFS = 17
    RELEASE = 18
    FSYNC = 20
    SETXATTR = 21
    GETXATTR = 22
    LISTXATTR = 23
    REMOVEXATTR = 24
    FLUSH = 25
    INIT = 26
    OPENDIR = 27
    READDIR = 28
    RELEASEDIR = 29
    FSYNCDIR = 30
    GETLK = 31
    SETLK = 32
    SETLKW = 33
    ACCESS = 34
    CREATE = 35
    INTERRUPT = 36
    BMAP = 37
    DESTROY = 38
    IOCTL = 39
    POLL = 40
    NOTIFY_REPLY = 41
    BATCH_FORGET = 42
    FALLOCATE = 43
    READDIRPLUS = 44
    RENAME2 = 45
    LSEEK = 46
    COPY_FILE_RANGE = 47
    SETUPMAPPING = 48
    REMOVEMAPPING = 49
    SYNCFS = 50
    TMPFILE = 51
    STATX = 52
    COPY_FILE_RANGE_64 = 53
    CUSE_INIT = 4096


#: Requests the kernel expects no reply to: writing one fails with ENOENT.
NO_REPLY_OPCODES: Final = frozenset({Opcode.FORGET, Opcode.BATCH_FORGET, Opcode.NOTIFY_REPLY})


class NotifyCode(enum.IntEnum):
    """Notification codes, sent in the ``error`` field with ``unique`` 0
    (``enum fuse_notify_code``)."""

    POLL = 1
    INVAL_INODE = 2
    INVAL_ENTRY = 3
    STORE = 4
    RETRIEVE = 5
    DELETE = 6
    RESEND = 7
    INC_EPOCH = 8
    PRUNE = 9


# -- INIT flags: one 64-bit space, ``flags | flags2 << 32`` ------------------------------------------

ASYNC_READ: Final = 1 << 0
POSIX_LOCKS: Final = 1 << 1
FILE_OPS: Final = 1 << 2
ATOMIC_O_TRUNC: Final = 1 << 3
EXPORT_SUPPORT: Final = 1 << 4
BIG_WRITES: Final = 1 << 5
DONT_MASK: Final = 1 << 6
SPLICE_WRITE: Final = 1 << 7
SPLICE_MOVE: Final = 1 << 8
SPLICE_READ: Final = 1 << 9
FLOCK_LOCKS: Final = 1 << 10
HAS_IOCTL_DIR: Final = 1 << 11
AUTO_INVAL_DATA: Final = 1 << 12
DO_READDIRPLUS: Final = 1 << 13
READDIRPLUS_AUTO: Final = 1 << 14
ASYNC_DIO: Final = 1 << 15
WRITEBACK_CACHE: Final = 1 << 16
NO_OPEN_SUPPORT: Final = 1 << 17
PARALLEL_DIROPS: Final = 1 << 18
HANDLE_KILLPRIV: Final = 1 << 19
POSIX_ACL: Final = 1 << 20
ABORT_ERROR: Final = 1 << 21
MAX_PAGES: Final = 1 << 22
CACHE_SYMLINKS: Final = 1 << 23
NO_OPENDIR_SUPPORT: Final = 1 << 24
EXPLICIT_INVAL_DATA: Final = 1 << 25
MAP_ALIGNMENT: Final = 1 << 26
SUBMOUNTS: Final = 1 << 27
HANDLE_KILLPRIV_V2: Final = 1 << 28
SETXATTR_EXT: Final = 1 << 29
INIT_EXT: Final = 1 << 30
INIT_RESERVED: Final = 1 << 31
SECURITY_CTX: Final = 1 << 32
HAS_INODE_DAX: Final = 1 << 33
CREATE_SUPP_GROUP: Final = 1 << 34
HAS_EXPIRE_ONLY: Final = 1 << 35
DIRECT_IO_ALLOW_MMAP: Final = 1 << 36
PASSTHROUGH: Final = 1 << 37
NO_EXPORT_SUPPORT: Final = 1 << 38
HAS_RESEND: Final = 1 << 39
ALLOW_IDMAP: Final = 1 << 40
OVER_IO_URING: Final = 1 << 41
REQUEST_TIMEOUT: Final = 1 << 42

#: Each INIT flag's name, for logs of what was offered and granted.
INIT_FLAG_NAMES: Final[Mapping[int, str]] = MappingProxyType({
    ASYNC_READ: "ASYNC_READ", POSIX_LOCKS: "POSIX_LOCKS", FILE_OPS: "FILE_OPS",
    ATOMIC_O_TRUNC: "ATOMIC_O_TRUNC", EXPORT_SUPPORT: "EXPORT_SUPPORT", BIG_WRITES: "BIG_WRITES",
    DONT_MASK: "DONT_MASK", SPLICE_WRITE: "SPLICE_WRITE", SPLICE_MOVE: "SPLICE_MOVE", SPLICE_READ: "SPLICE_READ",
    FLOCK_LOCKS: "FLOCK_LOCKS", HAS_IOCTL_DIR: "HAS_IOCTL_DIR", AUTO_INVAL_DATA: "AUTO_INVAL_DATA",
    DO_READDIRPLUS: "DO_READDIRPLUS", READDIRPLUS_AUTO: "READDIRPLUS_AUTO", ASYNC_DIO: "ASYNC_DIO",
    WRITEBACK_CACHE: "WRITEBACK_CACHE", NO_OPEN_SUPPORT: "NO_OPEN_SUPPORT", PARALLEL_DIROPS: "PARALLEL_DIROPS",
    HANDLE_KILLPRIV: "HANDLE_KILLPRIV", POSIX_ACL: "POSIX_ACL", ABORT_ERROR: "ABORT_ERROR",
    MAX_PAGES: "MAX_PAGES", CACHE_SYMLINKS: "CACHE_SYMLINKS", NO_OPENDIR_SUPPORT: "NO_OPENDIR_SUPPORT",
    EXPLICIT_INVAL_DATA: "EXPLICIT_INVAL_DATA", MAP_ALIGNMENT: "MAP_ALIGNMENT", SUBMOUNTS: "SUBMOUNTS",
    HANDLE_KILLPRIV_V2: "HANDLE_KILLPRIV_V2", SETXATTR_EXT: "SETXATTR_EXT", INIT_EXT: "INIT_EXT",
    INIT_RESERVED: "INIT_RESERVED", SECURITY_CTX: "SECURITY_CTX", HAS_INODE_DAX: "HAS_INODE_DAX",
    CREATE_SUPP_GROUP: "CREATE_SUPP_GROUP", HAS_EXPIRE_ONLY: "HAS_EXPIRE_ONLY",
    DIRECT_IO_ALLOW_MMAP: "DIRECT_IO_ALLOW_MMAP", PASSTHROUGH: "PASSTHROUGH", NO_EXPORT_SUPPORT: "NO_EXPORT_SUPPORT",
    HAS_RESEND: "HAS_RESEND", ALLOW_IDMAP: "ALLOW_IDMAP", OVER_IO_URING: "OVER_IO_URING",
    REQUEST_TIMEOUT: "REQUEST_TIMEOUT",
})


def init_flag_names(flags: int) -> list[str]:
    """The names of the INIT flags set in ``flags``, lowest bit first; a bit
    this ABI does not know is shown as ``bit<N>``."""
    return [INIT_FLAG_NAMES.get(1 << bit, f"bit{bit}") for bit in range(flags.bit_length()) if flags >> bit & 1]


# -- other flag bits ---------------------------------------------------------------------------------

# fuse_setattr_in.valid: which fields a SETATTR sets.
FATTR_MODE: Final = 1 << 0
FATTR_UID: Final = 1 << 1
FATTR_GID: Final = 1 << 2
FATTR_SIZE: Final = 1 << 3
FATTR_ATIME: Final = 1 << 4
FATTR_MTIME: Final = 1 << 5
FATTR_FH: Final = 1 << 6
FATTR_ATIME_NOW: Final = 1 << 7
FATTR_MTIME_NOW: Final = 1 << 8
FATTR_LOCKOWNER: Final = 1 << 9
FATTR_CTIME: Final = 1 << 10
FATTR_KILL_SUIDGID: Final = 1 << 11

# fuse_open_out.open_flags: how the kernel treats an open file.
FOPEN_DIRECT_IO: Final = 1 << 0
FOPEN_KEEP_CACHE: Final = 1 << 1
FOPEN_NONSEEKABLE: Final = 1 << 2
FOPEN_CACHE_DIR: Final = 1 << 3
FOPEN_STREAM: Final = 1 << 4
FOPEN_NOFLUSH: Final = 1 << 5
FOPEN_PARALLEL_DIRECT_WRITES: Final = 1 << 6
FOPEN_PASSTHROUGH: Final = 1 << 7

# fuse_open_in.open_flags / fuse_create_in.open_flags.
OPEN_KILL_SUIDGID: Final = 1 << 0

# fuse_release_in.release_flags.
RELEASE_FLUSH: Final = 1 << 0
RELEASE_FLOCK_UNLOCK: Final = 1 << 1

# fuse_getattr_in.getattr_flags.
GETATTR_FH: Final = 1 << 0

# fuse_lk_in.lk_flags.
LK_FLOCK: Final = 1 << 0

# fuse_write_in.write_flags.
WRITE_CACHE: Final = 1 << 0
WRITE_LOCKOWNER: Final = 1 << 1
WRITE_KILL_SUIDGID: Final = 1 << 2

# fuse_read_in.read_flags.
READ_LOCKOWNER: Final = 1 << 1

# fuse_fsync_in.fsync_flags.
FSYNC_FDATASYNC: Final = 1 << 0

# fuse_attr.flags.
ATTR_SUBMOUNT: Final = 1 << 0
ATTR_DAX: Final = 1 << 1

# fuse_setxattr_in.setxattr_flags (SETXATTR_EXT only).
SETXATTR_ACL_KILL_SGID: Final = 1 << 0

# fuse_notify_inval_entry_out.flags: expire the entry, keep it for what uses it (HAS_EXPIRE_ONLY).
EXPIRE_ONLY: Final = 1 << 0

# ioctls on /dev/fuse (magic 229): _IOR(0, u32), _IOW(1, struct fuse_backing_map), _IOW(2, u32).
FUSE_DEV_IOC_CLONE: Final = 0x8004E500
FUSE_DEV_IOC_BACKING_OPEN: Final = 0x4010E501
FUSE_DEV_IOC_BACKING_CLOSE: Final = 0x4004E502


# -- struct layouts ----------------------------------------------------------------------------------

# fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, total_extlen (8-byte units, 7.38), padding.
IN_HEADER: Final = struct.Struct("<IIQQIIIH2x")
# fuse_out_header: len, error (-errno, or a notify code when unique is 0), unique.
OUT_HEADER: Final = struct.Struct("<IiQ")

_ATTR_FIELDS = "QQQqqqIIIIIIIIII"
# fuse_attr: ino, size, blocks, atime, mtime, ctime, atimensec, mtimensec, ctimensec,
# mode, nlink, uid, gid, rdev, blksize, flags (7.32).
ATTR: Final = struct.Struct("<" + _ATTR_FIELDS)
# fuse_entry_out: nodeid, generation, entry_valid, attr_valid, entry_valid_nsec, attr_valid_nsec, attr.
ENTRY_OUT: Final = struct.Struct("<QQQQII" + _ATTR_FIELDS)
# fuse_attr_out: attr_valid, attr_valid_nsec, dummy, attr.
ATTR_OUT: Final = struct.Struct("<QI4x" + _ATTR_FIELDS)
# fuse_open_out: fh, open_flags, backing_id (7.40).
OPEN_OUT: Final = struct.Struct("<QIi")
# fuse_write_out: size, padding.
WRITE_OUT: Final = struct.Struct("<I4x")
# fuse_statfs_out (fuse_kstatfs): blocks, bfree, bavail, files, ffree, bsize, namelen, frsize, padding, spare[6].
STATFS_OUT: Final = struct.Struct("<QQQQQIII28x")
# fuse_getxattr_out: size, padding.
GETXATTR_OUT: Final = struct.Struct("<I4x")
# fuse_lseek_out: offset.
LSEEK_OUT: Final = struct.Struct("<Q")

# fuse_init_in up to 7.35: major, minor, max_readahead, flags.
INIT_IN_COMPAT: Final = struct.Struct("<IIII")
# fuse_init_in from 7.36: ..., flags2, unused[11].
INIT_IN: Final = struct.Struct("<IIIII44x")
#: The minor from which the kernel sends the whole fuse_init_in.
INIT_IN_FULL_MINOR: Final = 36
# fuse_init_out: major, minor, max_readahead, flags, max_background, congestion_threshold, max_write,
# time_gran, max_pages, map_alignment, flags2, max_stack_depth, request_timeout, unused[11].
INIT_OUT: Final = struct.Struct("<IIIIHHIIHHIIH22x")
# fuse_init_out as 7.5 to 7.22 define it: up to max_write (FUSE_COMPAT_22_INIT_OUT_SIZE).
INIT_OUT_COMPAT_22_SIZE: Final = 24
#: The minor from which fuse_init_out is the whole struct.
INIT_OUT_FULL_MINOR: Final = 23
# fuse_init_out as 7.0 to 7.4 define it (FUSE_COMPAT_INIT_OUT_SIZE): major, minor.
INIT_OUT_COMPAT: Final = struct.Struct("<II")

# fuse_dirent header: ino, off, namelen, type; the name follows, the record padded to 8 bytes.
DIRENT: Final = struct.Struct("<QQII")

# Request bodies.
FORGET_IN: Final = struct.Struct("<Q")  # nlookup
BATCH_FORGET_IN: Final = struct.Struct("<I4x")  # count; count fuse_forget_one follow
FORGET_ONE: Final = struct.Struct("<QQ")  # nodeid, nlookup
GETATTR_IN: Final = struct.Struct("<I4xQ")  # getattr_flags, dummy, fh
# fuse_setattr_in: valid, padding, fh, size, lock_owner, atime, mtime, ctime, atimensec, mtimensec,
# ctimensec, mode, unused4, uid, gid, unused5.
SETATTR_IN: Final = struct.Struct("<I4xQQQqqqIIII4xII4x")
MKNOD_IN: Final = struct.Struct("<III4x")  # mode, rdev, umask, padding
MKDIR_IN: Final = struct.Struct("<II")  # mode, umask
RENAME_IN: Final = struct.Struct("<Q")  # newdir
RENAME2_IN: Final = struct.Struct("<QI4x")  # newdir, flags, padding
LINK_IN: Final = struct.Struct("<Q")  # oldnodeid
OPEN_IN: Final = struct.Struct("<II")  # flags, open_flags
CREATE_IN: Final = struct.Struct("<IIII")  # flags, mode, umask, open_flags
RELEASE_IN: Final = struct.Struct("<QIIQ")  # fh, flags, release_flags, lock_owner
FLUSH_IN: Final = struct.Struct("<Q8xQ")  # fh, unused, padding, lock_owner
READ_IN: Final = struct.Struct("<QQIIQI4x")  # fh, offset, size, read_flags, lock_owner, flags, padding
WRITE_IN: Final = struct.Struct("<QQIIQI4x")  # fh, offset, size, write_flags, lock_owner, flags, padding
FSYNC_IN: Final = struct.Struct("<QI4x")  # fh, fsync_flags, padding
# fuse_setxattr_in without SETXATTR_EXT (the mount never grants it): size, flags.
SETXATTR_IN_COMPAT: Final = struct.Struct("<II")
GETXATTR_IN: Final = struct.Struct("<I4x")  # size, padding
ACCESS_IN: Final = struct.Struct("<I4x")  # mask, padding
INTERRUPT_IN: Final = struct.Struct("<Q")  # unique
FALLOCATE_IN: Final = struct.Struct("<QQQI4x")  # fh, offset, length, mode, padding
LSEEK_IN: Final = struct.Struct("<QQI4x")  # fh, offset, whence, padding
COPY_FILE_RANGE_IN: Final = struct.Struct("<QQQQQQQ")  # fh_in, off_in, nodeid_out, fh_out, off_out, len, flags

# Notification bodies.
NOTIFY_INVAL_INODE_OUT: Final = struct.Struct("<Qqq")  # ino, off, len
NOTIFY_INVAL_ENTRY_OUT: Final = struct.Struct("<QII")  # parent, namelen, flags; name and NUL follow
NOTIFY_DELETE_OUT: Final = struct.Struct("<QQI4x")  # parent, child, namelen, padding; name and NUL follow
NOTIFY_STORE_OUT: Final = struct.Struct("<QQI4x")  # nodeid, offset, size, padding; data follows

# fuse_backing_map, the argument of FUSE_DEV_IOC_BACKING_OPEN: fd, flags, padding.
BACKING_MAP: Final = struct.Struct("<iI8x")
