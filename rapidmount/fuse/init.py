"""The INIT negotiation, as a pure function of the kernel's INIT and what the
mount wants: :func:`negotiate` returns what was agreed and the reply to write.

The kernel offers flags; the mount grants those of them it wants and can
honour, and states its limits. Flags that would change what the kernel sends
beyond what :mod:`~rapidmount.shared.fuse_codec` decodes, or semantics the mount does
not implement (locks, ACLs, the writeback cache, splice), are never asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from errno import EPROTO

from rapidmount.shared import fuse_abi as abi, fuse_codec as codec

#: What the mount asks for, wherever the kernel offers it.
DEFAULT_OPTIONAL = (
    abi.ASYNC_READ | abi.ATOMIC_O_TRUNC | abi.EXPORT_SUPPORT | abi.BIG_WRITES | abi.AUTO_INVAL_DATA
    | abi.DO_READDIRPLUS | abi.ASYNC_DIO | abi.PARALLEL_DIROPS | abi.HAS_IOCTL_DIR | abi.MAX_PAGES
    | abi.DIRECT_IO_ALLOW_MMAP | abi.CACHE_SYMLINKS
)

#: Flags :attr:`Wants.optional` may not hold. Semantics the mount does not
#: implement: WRITEBACK_CACHE, POSIX_LOCKS, FLOCK_LOCKS, POSIX_ACL,
#: READDIRPLUS_AUTO; a transport it does not use: SPLICE_*, OVER_IO_URING;
#: fields or requests the codec does not speak: SETXATTR_EXT (a longer
#: fuse_setxattr_in), MAP_ALIGNMENT and REQUEST_TIMEOUT (init_out fields left
#: 0), INIT_RESERVED. INIT_EXT is granted whenever offered and PASSTHROUGH
#: through :attr:`Wants.passthrough`, so neither is asked for here.
NOT_NEGOTIABLE = (
    abi.WRITEBACK_CACHE | abi.POSIX_LOCKS | abi.FLOCK_LOCKS | abi.POSIX_ACL | abi.READDIRPLUS_AUTO
    | abi.SPLICE_WRITE | abi.SPLICE_MOVE | abi.SPLICE_READ | abi.OVER_IO_URING | abi.SETXATTR_EXT
    | abi.MAP_ALIGNMENT | abi.REQUEST_TIMEOUT | abi.INIT_RESERVED | abi.INIT_EXT | abi.PASSTHROUGH
)

_U16 = 0xFFFF  # fuse_init_out's max_pages, max_background and congestion_threshold
_NS_PER_SECOND = 1_000_000_000


class ProtocolTooOld(Exception):
    """The kernel speaks a protocol older than :data:`abi.MIN_MINOR`: write
    ``reply`` (INIT failed with EPROTO, so the mount fails rather than hangs)
    and exit."""

    def __init__(self, message: str, reply: bytes) -> None:
        super().__init__(message)
        self.reply = reply


@dataclass(frozen=True)
class Wants:
    """The mount's side of INIT. ``max_write`` is the largest WRITE (and READ)
    in bytes; ``max_background`` and ``congestion_threshold`` 0 leave the
    kernel's defaults; ``time_gran`` is the timestamp granularity in ns."""

    max_write: int
    max_readahead: int
    max_background: int = 0
    congestion_threshold: int = 0
    passthrough: bool = False
    time_gran: int = 1
    optional: int = DEFAULT_OPTIONAL

    def __post_init__(self) -> None:
        if self.max_write < abi.PAGE_SIZE or self.max_write % abi.PAGE_SIZE:
            raise ValueError(f"max_write {self.max_write} is not a positive multiple of {abi.PAGE_SIZE}")
        if self.max_write // abi.PAGE_SIZE > _U16:
            raise ValueError(f"max_write {self.max_write} is more than {_U16} pages")
        if not 0 <= self.max_readahead <= 0xFFFFFFFF:
            raise ValueError(f"max_readahead {self.max_readahead} does not fit 32 bits")
        if not (0 <= self.max_background <= _U16 and 0 <= self.congestion_threshold <= _U16):
            raise ValueError("max_background and congestion_threshold are 16-bit counts")
        if not 1 <= self.time_gran <= _NS_PER_SECOND:
            raise ValueError(f"time_gran {self.time_gran} is not 1 ns to 1 s")
        if self.optional & NOT_NEGOTIABLE:
            names = "|".join(abi.init_flag_names(self.optional & NOT_NEGOTIABLE))
            raise ValueError(f"the mount cannot ask for {names}")


@dataclass(frozen=True)
class Negotiated:
    """What INIT agreed, and ``reply``, the answer to write for it.

    ``retry``: the kernel offered a major above 7; ``reply`` tells it 7 and
    the kernel sends INIT again (negotiate that one); the other fields are 0.
    ``max_pages`` and ``max_write`` are what the mount told the kernel; the
    kernel lowers max_pages to its ``fs.fuse.max_pages_limit`` (256 by default).
    """

    major: int
    minor: int
    offered: int
    granted: int
    max_write: int
    max_pages: int
    max_readahead: int
    max_background: int
    congestion_threshold: int
    time_gran: int
    max_stack_depth: int
    reply: bytes
    retry: bool = False

    @property
    def read_buffer_size(self) -> int:
        """The smallest buffer the kernel lets ``/dev/fuse`` be read into: a
        header, ``fuse_write_in`` and max_write bytes."""
        return max(abi.MIN_READ_BUFFER, abi.IN_HEADER.size + abi.WRITE_IN.size + self.max_write)

    def describe(self) -> str:
        """One line for the log: the protocol, the limits, the flags granted
        and those offered but not taken."""
        if self.retry:
            return f"FUSE: the kernel offered a major above {abi.KERNEL_MAJOR}; answered {self.major}.{self.minor}"
        granted = "|".join(abi.init_flag_names(self.granted)) or "none"
        declined = "|".join(abi.init_flag_names(self.offered & ~self.granted)) or "none"
        return (f"FUSE {self.major}.{self.minor}: max_write {self.max_write} ({self.max_pages} pages), "
                f"max_readahead {self.max_readahead}; granted {granted}; declined {declined}")


def negotiate(init: codec.Init, unique: int, wants: Wants) -> Negotiated:
    """Answer the kernel's INIT (request ``unique``) with what ``wants`` asks
    for and the kernel offers. Raises :class:`ProtocolTooOld` below 7.MIN_MINOR."""
    if init.major > abi.KERNEL_MAJOR:
        # The reply carries our version only (FUSE_COMPAT_INIT_OUT_SIZE).
        reply = (codec.reply_header(unique, abi.INIT_OUT_COMPAT.size)
                 + abi.INIT_OUT_COMPAT.pack(abi.KERNEL_MAJOR, abi.MAX_MINOR))
        return Negotiated(major=abi.KERNEL_MAJOR, minor=abi.MAX_MINOR, offered=0, granted=0, max_write=0,
                          max_pages=0, max_readahead=0, max_background=0, congestion_threshold=0, time_gran=0,
                          max_stack_depth=0, reply=reply, retry=True)
    if init.major < abi.KERNEL_MAJOR or init.minor < abi.MIN_MINOR:
        raise ProtocolTooOld(
            f"the kernel speaks FUSE {init.major}.{init.minor}; this mount needs"
            f" {abi.KERNEL_MAJOR}.{abi.MIN_MINOR} or newer", codec.reply_error(unique, EPROTO))
    minor = min(init.minor, abi.MAX_MINOR)
    offered = init.flags
    usable = offered if offered & abi.INIT_EXT else offered & 0xFFFFFFFF  # flags2 exists only with INIT_EXT
    granted = usable & (wants.optional | abi.INIT_EXT)
    max_stack_depth = 0
    if wants.passthrough and usable & abi.PASSTHROUGH:
        granted |= abi.PASSTHROUGH
        max_stack_depth = 1  # backing files on a plain file system, never on a stacked one
    if granted & abi.MAX_PAGES:
        max_write = wants.max_write
        max_pages = max_write // abi.PAGE_SIZE
    else:  # the kernel splits requests at its default page count whatever max_write says
        max_write = min(wants.max_write, abi.DEFAULT_MAX_PAGES * abi.PAGE_SIZE)
        max_pages = abi.DEFAULT_MAX_PAGES
    max_readahead = min(init.max_readahead, wants.max_readahead)
    reply = codec.reply_init(
        unique, minor, max_readahead=max_readahead, flags=granted, max_background=wants.max_background,
        congestion_threshold=wants.congestion_threshold, max_write=max_write, time_gran=wants.time_gran,
        max_pages=max_pages if granted & abi.MAX_PAGES else 0, max_stack_depth=max_stack_depth)
    return Negotiated(abi.KERNEL_MAJOR, minor, offered, granted, max_write, max_pages, max_readahead,
                      wants.max_background, wants.congestion_threshold, wants.time_gran, max_stack_depth, reply)
