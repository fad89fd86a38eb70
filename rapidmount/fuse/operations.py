"""Every FUSE opcode the mount serves, in one table: decoded request in,
core call, encoded reply out.

Only translation lives here: the core (:class:`~rapidmount.core.Filesystem`)
owns behaviour and raises :class:`~rapidmount.core.errors.FSError` with the
errno FUSE returns. Each request passes :meth:`Operations.serve` once: timed
and counted for metrics, an FSError becomes its errno reply, anything
unexpected EIO, logged once, never a crash. An opcode with no entry in the
table is answered ENOSYS, as libfuse answers one a file system leaves out.

READ and WRITE have ways of their own, driven by the request loop:
``read_now`` answers a READ within a cached block with no task, and a READ's
reply may be written by the data-plane worker that holds its bytes
(``worker_reply_soon``/``worker_reply_now``) or where a stream's bytes land.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rapidmount.core import Filesystem
from rapidmount.core.errors import FSError, NoSuchName
from rapidmount.shared import fuse_abi as abi, fuse_codec as codec
from rapidmount.fuse.channel import Channel
from rapidmount.fuse.stats import OperationStats
from rapidmount.fuse.destinations import ReadAnswer
from rapidmount.superblock.inodes import Inode
from rapidmount.shared.views import Arriving, pieces

log = logging.getLogger("rapidmount.fuse")

#: Smaller READ replies are written by the FUSE process: a hop to a worker
#: would cost a random read more latency than the copy it saves.
WORKER_REPLY_MIN = 128 * 1024

#: Has a worker answer a READ: ``(unique, data, on_answer)`` -> True once sent
#: (``on_answer(taken)`` runs later, in the FUSE process), False when no worker can.
WorkerReplySoon = Callable[[int, Any, Callable[[bool], None]], Awaitable[bool]]
#: As WorkerReplySoon, sent at once or not at all.
WorkerReplyNow = Callable[[int, Any, Callable[[bool], None]], bool]
#: A request's handler: the reply to write, or None for requests that get none.
Handler = Callable[[codec.Header, Any], Awaitable[bytes | None]]


def failure(unique: int, code: int) -> bytes:
    """The reply failing request ``unique`` with ``code``; an errno the kernel
    would refuse (0, negative, past 511) is EIO, so the request is answered."""
    return codec.reply_error(unique, code if 0 < code < 512 else errno.EIO)


class Operations:
    """The core behind FUSE: one handler per opcode (:attr:`table`)."""

    def __init__(self, fs: Filesystem, stats: OperationStats | None = None, *,
                 worker_reply_soon: WorkerReplySoon | None = None,
                 worker_reply_now: WorkerReplyNow | None = None) -> None:
        self.fs = fs
        self.stats = stats if stats is not None else OperationStats()
        self._worker_reply_soon = worker_reply_soon
        self._worker_reply_now = worker_reply_now
        #: What the mount tells the kernel of read-only opens: no FLUSH at
        #: their close (a read-only handle has nothing to flush).
        self.noflush_read_only = True
        self.table: dict[int, tuple[str, Handler]] = {
            abi.Opcode.LOOKUP: ("lookup", self._lookup),
            abi.Opcode.GETATTR: ("getattr", self._getattr),
            abi.Opcode.SETATTR: ("setattr", self._setattr),
            abi.Opcode.READLINK: ("readlink", self._readlink),
            abi.Opcode.SYMLINK: ("symlink", self._symlink),
            abi.Opcode.MKDIR: ("mkdir", self._mkdir),
            abi.Opcode.UNLINK: ("unlink", self._unlink),
            abi.Opcode.RMDIR: ("rmdir", self._rmdir),
            abi.Opcode.RENAME: ("rename", self._rename),
            abi.Opcode.RENAME2: ("rename", self._rename),
            abi.Opcode.LINK: ("link", self._link),
            abi.Opcode.OPEN: ("open", self._open),
            abi.Opcode.STATFS: ("statfs", self._statfs),
            abi.Opcode.RELEASE: ("release", self._release),
            abi.Opcode.FSYNC: ("fsync", self._fsync),
            abi.Opcode.FLUSH: ("flush", self._flush),
            abi.Opcode.OPENDIR: ("opendir", self._opendir),
            abi.Opcode.READDIR: ("readdir", self._readdir),
            abi.Opcode.READDIRPLUS: ("readdir", self._readdir),
            abi.Opcode.RELEASEDIR: ("releasedir", self._releasedir),
            abi.Opcode.ACCESS: ("access", self._access),
            abi.Opcode.CREATE: ("create", self._create),
            abi.Opcode.FORGET: ("forget", self._forget),
            abi.Opcode.BATCH_FORGET: ("forget", self._forget),
        }

    # -- one request ------------------------------------------------------------------------------

    async def serve(self, channel: Channel, header: codec.Header, body: Any) -> None:
        """Answer one decoded request on ``channel`` (the descriptor it came from)."""
        entry = self.table.get(header.opcode)
        if entry is None:
            channel.reply(codec.reply_error(header.unique, errno.ENOSYS))
            return
        name, handler = entry
        started = time.perf_counter_ns()
        failed = True
        reply: bytes | None
        try:
            reply = await handler(header, body)
            failed = False
        except FSError as err:
            reply = failure(header.unique, err.errno)
        except Exception as err:
            log.error("internal error in %s: %r", name, err, exc_info=True)
            reply = codec.reply_error(header.unique, errno.EIO)
        except BaseException:
            channel.reply(codec.reply_error(header.unique, errno.EIO))  # cancelled: the kernel still waits
            raise
        finally:
            self.stats.record(name, time.perf_counter_ns() - started, failed)
        if reply is not None:
            channel.reply(reply)

    def _entry(self, unique: int, inode: Inode) -> bytes:
        attrs = self.fs.attributes_of(inode)
        return codec.reply_entry(unique, inode.ino, attrs, attrs.entry_timeout, attrs.attr_timeout)

    def _attr(self, unique: int, inode: Inode) -> bytes:
        attrs = self.fs.attributes_of(inode)
        return codec.reply_attr(unique, attrs, attrs.attr_timeout)

    # -- namespace --------------------------------------------------------------------------------

    async def _lookup(self, header: codec.Header, body: codec.Lookup) -> bytes:
        try:
            inode = await self.fs.lookup(header.nodeid, body.name)
        except NoSuchName as err:
            # A negative entry lets the kernel cache the answer.
            return codec.reply_negative_entry(header.unique, err.cache_for)
        except FSError as err:
            if err.errno != errno.ENOENT:
                raise
            return codec.reply_negative_entry(header.unique, self.fs.meta.negative_timeout())
        return self._entry(header.unique, inode)

    async def _getattr(self, header: codec.Header, body: codec.Getattr) -> bytes:
        return self._attr(header.unique, await self.fs.getattr(header.nodeid))

    async def _setattr(self, header: codec.Header, body: codec.Setattr) -> bytes:
        ino, valid = header.nodeid, body.valid
        node = self.fs.inode(ino)
        if valid & abi.FATTR_SIZE:
            node = await self.fs.truncate(ino, body.size, body.fh if valid & abi.FATTR_FH else None)
        if valid & abi.FATTR_MTIME:
            node = await self.fs.set_mtime(ino, time.time_ns() if valid & abi.FATTR_MTIME_NOW else body.mtime_ns)
        if valid & abi.FATTR_MODE:
            node = await self.fs.chmod(ino, body.mode)
        if valid & (abi.FATTR_UID | abi.FATTR_GID):
            self.fs.chown(ino)
        return self._attr(header.unique, await self.fs.getattr(node.ino))

    async def _forget(self, header: codec.Header, body: codec.Forget | codec.BatchForget) -> None:
        if isinstance(body, codec.Forget):
            self.fs.forget([(header.nodeid, body.nlookup)])
        else:
            self.fs.forget(list(body.items))
        return None

    async def _readlink(self, header: codec.Header, body: codec.Readlink) -> bytes:
        target = await self.fs.readlink(header.nodeid)
        return codec.reply_readlink(header.unique, target.encode("utf-8", "surrogateescape"))

    async def _statfs(self, header: codec.Header, body: codec.Statfs) -> bytes:
        s = self.fs.statfs()
        return codec.reply_statfs(header.unique, blocks=s["f_blocks"], bfree=s["f_bfree"], bavail=s["f_bavail"],
                                  files=s["f_files"], ffree=s["f_ffree"], bsize=s["f_bsize"],
                                  namelen=s["f_namemax"], frsize=s["f_frsize"])

    async def _access(self, header: codec.Header, body: codec.Access) -> bytes:
        self.fs.access(header.nodeid, body.mask)
        return codec.reply_empty(header.unique)

    async def _symlink(self, header: codec.Header, body: codec.Symlink) -> bytes:
        return self._entry(header.unique, await self.fs.symlink(header.nodeid, body.name, body.target))

    async def _mkdir(self, header: codec.Header, body: codec.Mkdir) -> bytes:
        return self._entry(header.unique, await self.fs.mkdir(header.nodeid, body.name))

    async def _unlink(self, header: codec.Header, body: codec.Unlink) -> bytes:
        await self.fs.unlink(header.nodeid, body.name)
        return codec.reply_empty(header.unique)

    async def _rmdir(self, header: codec.Header, body: codec.Rmdir) -> bytes:
        await self.fs.rmdir(header.nodeid, body.name)
        return codec.reply_empty(header.unique)

    async def _rename(self, header: codec.Header, body: codec.Rename) -> bytes:
        await self.fs.rename(header.nodeid, body.old, body.newdir, body.new, body.flags)
        return codec.reply_empty(header.unique)

    async def _link(self, header: codec.Header, body: codec.Link) -> bytes:
        self.fs.link()
        return codec.reply_empty(header.unique)  # not reached: the core refuses hard links

    # -- directories ------------------------------------------------------------------------------

    async def _opendir(self, header: codec.Header, body: codec.Opendir) -> bytes:
        return codec.reply_open(header.unique, await self.fs.opendir(header.nodeid), 0)

    async def _readdir(self, header: codec.Header, body: codec.Readdir) -> bytes:
        dirents = codec.Dirents(body.size, plus=header.opcode == abi.Opcode.READDIRPLUS)
        async for name, inode, next_offset in self.fs.readdir(body.fh, body.offset):
            attrs = self.fs.attributes_of(inode)
            if not dirents.add(name.encode("utf-8", "surrogateescape"), inode.ino, attrs.st_mode, next_offset,
                               attr=attrs, entry_timeout=attrs.entry_timeout, attr_timeout=attrs.attr_timeout,
                               nodeid=inode.ino):
                break
            if dirents.plus and name not in (".", ".."):  # the kernel takes no reference on these
                self.fs.entry_returned(inode.ino)
        return dirents.reply(header.unique)

    async def _releasedir(self, header: codec.Header, body: codec.Release) -> bytes:
        self.fs.releasedir(body.fh)
        return codec.reply_empty(header.unique)

    # -- files ------------------------------------------------------------------------------------

    def _open_flags(self, flags: int, direct_io: bool, keep_cache: bool) -> int:
        open_flags = (abi.FOPEN_DIRECT_IO if direct_io else 0) | (abi.FOPEN_KEEP_CACHE if keep_cache else 0)
        if self.noflush_read_only and flags & os.O_ACCMODE == os.O_RDONLY and not flags & os.O_TRUNC:
            open_flags |= abi.FOPEN_NOFLUSH
        return open_flags

    async def _open(self, header: codec.Header, body: codec.Open) -> bytes:
        fh, direct_io, keep_cache = await self.fs.open(header.nodeid, body.flags)
        backing_id = self.fs.backing_of(fh)
        if backing_id is not None:
            open_flags = abi.FOPEN_PASSTHROUGH | self._open_flags(body.flags, False, False)
            return codec.reply_open(header.unique, fh, open_flags, backing_id)
        return codec.reply_open(header.unique, fh, self._open_flags(body.flags, direct_io, keep_cache))

    async def _create(self, header: codec.Header, body: codec.Create) -> bytes:
        fh, inode = await self.fs.create(header.nodeid, body.name, body.flags)
        attrs = self.fs.attributes_of(inode)
        open_flags = abi.FOPEN_DIRECT_IO if self.fs.handles.file(fh).direct_io else 0
        return codec.reply_create(header.unique, inode.ino, attrs, attrs.entry_timeout, attrs.attr_timeout,
                                  fh, open_flags)

    async def _flush(self, header: codec.Header, body: codec.Flush) -> bytes:
        await self.fs.flush(body.fh)
        return codec.reply_empty(header.unique)

    async def _fsync(self, header: codec.Header, body: codec.Fsync) -> bytes:
        await self.fs.fsync(body.fh)
        return codec.reply_empty(header.unique)

    async def _release(self, header: codec.Header, body: codec.Release) -> bytes:
        await self.fs.release(body.fh)
        return codec.reply_empty(header.unique)

    # -- READ -------------------------------------------------------------------------------------

    async def read(self, channel: Channel, unique: int, fh: int, offset: int, size: int) -> None:
        """Answer READ ``unique``: the bytes land where a worker may write the
        reply (``reply.sent``), a worker writes it from the arena, or this
        process does."""
        started = time.perf_counter_ns()
        failed = True
        reply = None if self._worker_reply_soon is None else ReadAnswer(unique)
        try:
            data = await self.fs.read(fh, offset, size, True, reply)
            failed = False
        except FSError as err:
            channel.reply(failure(unique, err.errno))
            return
        except Exception as err:
            log.error("internal error in read: %r", err, exc_info=True)
            channel.reply(codec.reply_error(unique, errno.EIO))
            return
        except BaseException:
            channel.reply(codec.reply_error(unique, errno.EIO))
            raise
        finally:
            self.stats.record("read", time.perf_counter_ns() - started, failed)
        if reply is not None and reply.sent:
            self.stats.read_replies["landed"] += 1
            return
        if self._worker_reply_soon is not None and len(data) >= WORKER_REPLY_MIN:
            if await self._worker_reply_soon(unique, data, self._answered(channel, unique, data)):
                return  # the answer comes to ``_answered``
        self._reply_data(channel, unique, data)

    def read_now(self, channel: Channel, unique: int, fh: int, offset: int, size: int) -> bool:
        """Answer READ ``unique`` at once if its bytes need no wait; False:
        nothing done, the READ needs :meth:`read`."""
        started = time.perf_counter_ns()
        try:
            data = self.fs.read_now(fh, offset, size)
        except Exception as err:  # a bug: the READ's task answers it, as any READ's
            log.error("internal error in read_now: %r", err, exc_info=True)
            return False
        if data is None:
            return False
        self.stats.record("read", time.perf_counter_ns() - started, False)
        if self._worker_reply_now is not None and len(data) >= WORKER_REPLY_MIN:
            if self._worker_reply_now(unique, data, self._answered(channel, unique, data)):
                return True
        self._reply_data(channel, unique, data)
        return True

    def _answered(self, channel: Channel, unique: int, data: Any) -> Callable[[bool], None]:
        """What runs at a worker's answer to the reply of READ ``unique``."""
        def answered(taken: bool) -> None:
            if taken:
                self.stats.read_replies["worker"] += 1
            else:  # refused (interrupted: refused here too), or the worker died first
                self._reply_data(channel, unique, data)
        return answered

    def _reply_data(self, channel: Channel, unique: int, data: Any) -> None:
        if channel.reply_vector([codec.reply_header(unique, len(data)), *pieces(data)]):
            self.stats.read_replies["fuse"] += 1
        else:
            channel.reply(codec.reply_error(unique, errno.EIO))  # the kernel still waits for an answer

    # -- WRITE ------------------------------------------------------------------------------------

    async def write(self, fh: int, offset: int, data: bytes | memoryview | Arriving) -> int:
        """The bytes written; FSError with the errno to answer."""
        started = time.perf_counter_ns()
        failed = True
        try:
            written = await self.fs.write(fh, offset, data)
            failed = False
            return written
        except FSError:
            raise
        except Exception as err:
            log.error("internal error in write: %r", err, exc_info=True)
            raise FSError(errno.EIO) from None
        finally:
            self.stats.record("write", time.perf_counter_ns() - started, failed)

    def write_now(self, fh: int, offset: int, data: bytes | memoryview | Arriving) -> int | None:
        """A WRITE done at once when it needs no wait; None: call :meth:`write`."""
        started = time.perf_counter_ns()
        try:
            written = self.fs.write_now(fh, offset, data)
        except Exception as err:  # a bug: the WRITE's task answers it
            log.error("internal error in write_now: %r", err, exc_info=True)
            return None
        if written is not None:
            self.stats.record("write", time.perf_counter_ns() - started, False)
        return written
