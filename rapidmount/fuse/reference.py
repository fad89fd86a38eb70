"""The reference request loop: pyfuse3's, through its public API only.

``--pyfuse3-requests`` serves every request with ``pyfuse3.init``,
``pyfuse3.main`` and this :class:`pyfuse3.Operations`, and none of the
mount's own FUSE layer (:mod:`rapidmount.fuse`): the mount suite runs under
both, so each checks the other. It has none of the own loop's fast paths
(no page-cache stores, no replies written by workers, no WRITE bytes left
where the kernel put them). Only translation lives here: inodes to
``EntryAttributes``, ``FSError`` to ``FUSEError``, handles to ``FileInfo``.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import pyfuse3
from pyfuse3 import EntryAttributes, FileInfo, ReaddirToken, RequestContext, SetattrFields, StatvfsData

from rapidmount.core import Filesystem, FSError
from rapidmount.core.errors import NoSuchName
from rapidmount.core.attributes import Attributes
from rapidmount.core.reads import Data
from rapidmount.fuse.invalidate import KernelNotifier
from rapidmount.fuse.stats import OperationStats
from rapidmount.superblock.inodes import Inode

log = logging.getLogger("rapidmount.fuse")


_ATTRIBUTE_NAMES = tuple(field.name for field in dataclasses.fields(Attributes))


_Arguments = ParamSpec("_Arguments")
_Result = TypeVar("_Result")


def _operation(
    method: Callable[Concatenate[FuseOperations, _Arguments], Awaitable[_Result]],
) -> Callable[Concatenate[FuseOperations, _Arguments], Coroutine[Any, Any, _Result]]:
    """Every FUSE operation passes here once: timed and counted for metrics;
    FSError → FUSEError; anything unexpected → EIO, logged once, never a crash."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: FuseOperations, /, *args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Result:
        started = time.perf_counter_ns()
        failed = True
        try:
            result = await method(self, *args, **kwargs)
            failed = False
            return result
        except FSError as err:
            raise pyfuse3.FUSEError(err.errno) from None
        except pyfuse3.FUSEError:
            raise
        except Exception as err:
            log.error("internal error in %s: %r", name, err, exc_info=True)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            self.operation_stats.record(name, time.perf_counter_ns() - started, failed)

    return wrapper


class FuseOperations(pyfuse3.Operations):
    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(self, fs: Filesystem, stats: OperationStats) -> None:
        super().__init__()
        self.fs = fs
        self.operation_stats = stats
        self.kernel = KernelNotifier(pyfuse3.invalidate_entry, pyfuse3.invalidate_inode)
        fs.kernel = self.kernel

    def _attributes(self, inode: Inode) -> EntryAttributes:
        attr = EntryAttributes()
        values = self.fs.attributes_of(inode)
        for name in _ATTRIBUTE_NAMES:
            setattr(attr, name, getattr(values, name))
        attr.generation = 0
        return attr

    # -- namespace -------------------------------------------------------------------------------

    @_operation
    async def lookup(self, parent_inode: int, name: bytes, ctx: RequestContext | None = None) -> EntryAttributes:
        try:
            inode = await self.fs.lookup(parent_inode, name)
        except FSError as err:
            if err.errno == errno.ENOENT:
                # A zero-inode entry lets the kernel cache the negative answer.
                attr = EntryAttributes()
                attr.st_ino = 0
                attr.entry_timeout = err.cache_for if isinstance(err, NoSuchName) else self.fs.meta.negative_timeout()
                return attr
            raise
        return self._attributes(inode)

    @_operation
    async def getattr(self, inode: int, ctx: RequestContext | None = None) -> EntryAttributes:
        return self._attributes(await self.fs.getattr(inode))

    @_operation
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        self.fs.forget(list(inode_list))

    @_operation
    async def readlink(self, inode: int, ctx: RequestContext) -> bytes:
        return (await self.fs.readlink(inode)).encode()

    @_operation
    async def statfs(self, ctx: RequestContext) -> StatvfsData:
        data = StatvfsData()
        for key, value in self.fs.statfs().items():
            setattr(data, key, value)
        return data

    @_operation
    async def access(self, inode: int, mode: int, ctx: RequestContext) -> bool:
        self.fs.access(inode, mode)
        return True

    # -- directories -----------------------------------------------------------------------------

    @_operation
    async def opendir(self, inode: int, ctx: RequestContext) -> int:
        return await self.fs.opendir(inode)

    @_operation
    async def readdir(self, fh: int, start_id: int, token: ReaddirToken) -> None:
        async for name, inode, next_id in self.fs.readdir(fh, start_id):
            if not pyfuse3.readdir_reply(token, name.encode(), self._attributes(inode), next_id):
                return
            if name not in (".", ".."):  # the kernel takes no reference on these
                self.fs.entry_returned(inode.ino)

    @_operation
    async def releasedir(self, fh: int) -> None:
        self.fs.releasedir(fh)

    # -- files -----------------------------------------------------------------------------------

    @_operation
    async def open(self, inode: int, flags: int, ctx: RequestContext) -> FileInfo:
        fh, direct_io, keep_cache = await self.fs.open(inode, flags)
        return FileInfo(fh=fh, direct_io=direct_io, keep_cache=keep_cache)

    @_operation
    async def read(self, fh: int, off: int, size: int) -> Data:  # type: ignore[override]
        # pyfuse3 replies from any contiguous buffer (PyObject_GetBuffer), though its stub says bytes.
        return cast(Data, await self.fs.read(fh, off, size))  # a Gathered only with gather=True

    @_operation
    async def flush(self, fh: int) -> None:
        await self.fs.flush(fh)

    @_operation
    async def fsync(self, fh: int, datasync: bool) -> None:
        await self.fs.fsync(fh)

    @_operation
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: RequestContext) -> tuple[FileInfo, EntryAttributes]:
        fh, inode = await self.fs.create(parent_inode, name, flags)
        return FileInfo(fh=fh, direct_io=self.fs.handles.file(fh).direct_io, keep_cache=False), \
            self._attributes(inode)

    @_operation
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        return await self.fs.write(fh, off, buf)

    @_operation
    async def setattr(self, inode: int, attr: EntryAttributes, fields: SetattrFields, fh: int | None,
                      ctx: RequestContext) -> EntryAttributes:
        node = self.fs.inode(inode)
        if fields.update_size:
            node = await self.fs.truncate(inode, attr.st_size, fh)
        if fields.update_mtime:
            node = await self.fs.set_mtime(inode, attr.st_mtime_ns)
        if fields.update_mode:
            node = await self.fs.chmod(inode, attr.st_mode)
        if fields.update_uid or fields.update_gid:
            self.fs.chown(inode)
        return self._attributes(await self.fs.getattr(node.ino))

    @_operation
    async def unlink(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        await self.fs.unlink(parent_inode, name)

    @_operation
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: RequestContext) -> EntryAttributes:
        return self._attributes(await self.fs.mkdir(parent_inode, name))

    @_operation
    async def rmdir(self, parent_inode: int, name: bytes, ctx: RequestContext) -> None:
        await self.fs.rmdir(parent_inode, name)

    @_operation
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes,
                     flags: int, ctx: RequestContext) -> None:
        await self.fs.rename(parent_inode_old, name_old, parent_inode_new, name_new, flags)

    @_operation
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: RequestContext) -> EntryAttributes:
        return self._attributes(await self.fs.symlink(parent_inode, name, target))

    @_operation
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: RequestContext) -> EntryAttributes:
        self.fs.link()  # refuses every hard link: raises FSError(EPERM)
        raise pyfuse3.FUSEError(errno.EPERM)  # not reached

    @_operation
    async def release(self, fh: int) -> None:
        await self.fs.release(fh)
