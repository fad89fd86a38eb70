"""What ``stat`` shows of an inode: modes, sizes, times, owners, cache lifetimes.

Plain values; the FUSE layer encodes them into the kernel's structures. The
read-only rule lives here too: a read-only mount shows no write bits.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

from rapidmount.core.settings import CoreSettings
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.metadata_cache import MetadataCache
from rapidmount.superblock.names import EntryKind

BLOCK_SIZE = 1 << 20  # st_blksize: the unit reads are best made in


@dataclass(slots=True)
class Attributes:
    st_ino: int
    st_mode: int
    st_nlink: int
    st_size: int
    st_uid: int
    st_gid: int
    st_blksize: int
    st_blocks: int
    st_atime_ns: int
    st_mtime_ns: int
    st_ctime_ns: int
    entry_timeout: float
    attr_timeout: float


class AttributeBuilder:
    def __init__(self, settings: CoreSettings, meta: MetadataCache, *, uid: int, gid: int,
                 mount_time_ns: int) -> None:
        self.file_mode = settings.file_mode
        self.dir_mode = settings.dir_mode
        self.read_only = settings.read_only
        self.meta = meta
        self.uid, self.gid = uid, gid
        self.mount_time_ns = mount_time_ns

    def of(self, inode: Inode) -> Attributes:
        if inode.kind is EntryKind.DIR:
            mode = stat.S_IFDIR | self.dir_mode
            nlink, size = 2, 4096
            mtime = inode.mtime_ns or self.mount_time_ns
        elif inode.kind is EntryKind.SYMLINK:
            mode = stat.S_IFLNK | 0o777
            nlink, size = 1, len((inode.symlink_target or "").encode())
            mtime = inode.mtime_ns
        else:
            mode = stat.S_IFREG | (self.file_mode if inode.permissions is None else inode.permissions)
            nlink, size = 1, inode.size
            mtime = inode.mtime_ns
        if self.read_only:
            mode &= ~0o222
        return Attributes(
            st_ino=inode.ino, st_mode=mode, st_nlink=nlink, st_size=size, st_uid=self.uid, st_gid=self.gid,
            st_blksize=BLOCK_SIZE, st_blocks=(size + 511) // 512, st_atime_ns=mtime, st_mtime_ns=mtime,
            st_ctime_ns=inode.ctime_ns or mtime, entry_timeout=self.meta.entry_timeout(),
            attr_timeout=self.meta.attr_timeout())
