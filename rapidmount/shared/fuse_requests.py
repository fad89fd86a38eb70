"""FUSE requests as :func:`~rapidmount.shared.fuse_decode.decode` returns
them: a request's :class:`Header` and a frozen dataclass of its body, one
class per kind of request (:data:`Body`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


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
