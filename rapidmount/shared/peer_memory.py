"""Bytes that live in another process's memory, read with ``process_vm_readv(2)``.

A data-plane worker sends appended bytes that the FUSE process (its parent)
keeps in its own memory: the FUSE process passes the addresses of the
``bytes`` objects it holds (:func:`address_of`), and the worker reads them
straight into the request it sends, so the FUSE process copies nothing.

The kernel allows such reads under the same rules as ``ptrace`` attaching:
the same user and a dumpable target, Yama's ``ptrace_scope`` (relational at
1: only an ancestor, unless the target names an exception), and no seccomp
profile refusing the call. :func:`probe` tells whether it works before
anything depends on it; :func:`let_descendants_read` is the exception a FUSE
process makes for its workers under Yama.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence

from rapidmount.storage.errors import StorageError

#: ``(address, length)`` of bytes in the other process.
Segment = tuple[int, int]

#: Set (to anything) in a worker's environment: appends go through the arena, as where reads are refused.
DISABLE_ENV = "RAPIDMOUNT_NO_PEER_READS"

_PR_SET_PTRACER = 0x59616D61  # "Yama"
_YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
_IOV_MAX = 1024  # the kernel's limit of segments per call


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def _load_libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.argtypes = (ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                                      ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.c_ulong)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    libc.prctl.restype = ctypes.c_int
    return libc


_libc = _load_libc()


def address_of(data: bytes) -> int:
    """The address of a ``bytes`` object's buffer (fixed for the object's life)."""
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    assert address is not None  # a bytes object's buffer is never NULL
    return address


class PeerReadError(OSError):
    """``process_vm_readv`` failed, or read fewer bytes than asked."""


def read_into(pid: int, segments: Sequence[Segment], address: int) -> int:
    """Copy ``segments`` of process ``pid``, one after another, to ``address``
    here; returns the bytes copied. Anything short of all of them raises
    :class:`PeerReadError`: a segment the other process no longer maps is an
    error, never bytes left unwritten."""
    total = 0
    for first in range(0, len(segments), _IOV_MAX):
        batch = segments[first:first + _IOV_MAX]
        remote = (_IOVec * len(batch))(*(_IOVec(at, n) for at, n in batch))
        length = sum(n for _, n in batch)
        local = _IOVec(address + total, length)
        got = _libc.process_vm_readv(pid, ctypes.byref(local), 1, remote, len(batch), 0)
        if got < 0:
            code = ctypes.get_errno()
            raise PeerReadError(code, f"process_vm_readv of process {pid}: {os.strerror(code)}")
        if got != length:
            raise PeerReadError(errno.EFAULT, f"process_vm_readv of process {pid}: {got} of {length} bytes")
        total += length
    return total


class PeerBytes:
    """A run of bytes held by process ``pid``, as its segments; sliced without
    reading, read only into the place it is needed."""

    __slots__ = ("pid", "segments", "length")

    def __init__(self, pid: int, segments: Sequence[Segment]) -> None:
        self.pid = pid
        self.segments = tuple(segments)
        self.length = sum(n for _, n in self.segments)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> PeerBytes:
        start, stop, step = index.indices(self.length)
        if step != 1:
            raise ValueError("a run of peer bytes slices contiguously")
        kept: list[Segment] = []
        offset = 0
        for address, n in self.segments:
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                kept.append((address + lo - offset, hi - lo))
            offset += n
        return type(self)(self.pid, kept)

    def read_into(self, address: int) -> None:
        """Copy the run to ``address`` here; EIO if the process has not got all of it."""
        try:
            read_into(self.pid, self.segments, address)
        except PeerReadError as err:
            raise StorageError(f"cannot read appended bytes from the mount's process: {err.strerror}",
                               errno_=errno.EIO) from None

    def read(self) -> bytes:
        """The run as local bytes (for a checksum of bytes already sent)."""
        copy = ctypes.create_string_buffer(self.length)
        self.read_into(ctypes.addressof(copy))
        return copy.raw


def probe(pid: int, address: int, expected: bytes) -> str | None:
    """None if this process reads ``expected`` at ``address`` of process
    ``pid``; else why not (turned off, refused, or other bytes)."""
    if os.environ.get(DISABLE_ENV):
        return f"turned off by {DISABLE_ENV}"
    copy = ctypes.create_string_buffer(len(expected))
    try:
        read_into(pid, [(address, len(expected))], ctypes.addressof(copy))
    except PeerReadError as err:
        name = errno.errorcode.get(err.errno or 0, str(err.errno))
        return f"process_vm_readv: {name} ({err.strerror})"
    if copy.raw != expected:
        return "process_vm_readv read other bytes than the mount's"
    return None


def yama_scope() -> int | None:
    """Yama's ``ptrace_scope``, or None without Yama."""
    try:
        with open(_YAMA_SCOPE) as scope:
            return int(scope.read())
    except (OSError, ValueError):
        return None


def let_descendants_read() -> str | None:
    """Under Yama's relational scope, let this process's descendants (its
    workers, now and later) read its memory; None, or why it could not.

    Yama keeps one exception per process, naming a tracer and its
    descendants: naming each worker in turn would take the right away from
    the one before, so the exception names this process itself."""
    if yama_scope() != 1:
        return None
    if _libc.prctl(_PR_SET_PTRACER, os.getpid(), 0, 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return None
