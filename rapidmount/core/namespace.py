"""Namespace operations: names to inodes, listings, and changes to names.

Lookups answer from the metadata cache when it is fresh and otherwise make
one round trip; every change (mkdir, rmdir, unlink, rename, symlink) goes
to the bucket with a generation precondition and then updates the caches
of this mount, so it sees its own change at once.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from rapidmount.cache.page_cache import PageCache
from rapidmount.core.errors import FSError, NoSuchName, RetryRefused, log_failure, storage_call
from rapidmount.core.kernel import KernelCache, RecordingKernel
from rapidmount.core.settings import CoreSettings
from rapidmount.core.stats import FSStats
from rapidmount.storage.errors import StorageError
from rapidmount.storage.model import (MTIME_METADATA_KEY, SYMLINK_METADATA_KEY, DirectoryMeta, FolderMeta, ObjectMeta,
                                      directory_meta, format_mtime, listed_meta)
from rapidmount.storage.seam import ObjectStore
from rapidmount.superblock.inodes import ROOT_INODE, Inode, InodeTable
from rapidmount.superblock.metadata_cache import ABSENT, MetadataCache
from rapidmount.superblock.names import (
    EntryKind, HiddenNames, ListedEntry, component_from_fuse, entries_from_listing, parent_prefix)

log = logging.getLogger("rapidmount.fs")

_P = ParamSpec("_P")
_R = TypeVar("_R")


REFUSAL_SECONDS = 2.0  # the kernel retries at once: changes of a refused name are refused this long
REFUSALS_REMEMBERED = 1024


def kind_of(meta: ObjectMeta) -> EntryKind:
    return EntryKind.SYMLINK if meta.is_symlink else EntryKind.FILE


class Namespace:
    """Inodes, the metadata cache and every operation on names."""

    def __init__(self, settings: CoreSettings, store: ObjectStore, cache: PageCache, stats: FSStats, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.store = store
        self.layout = store.layout
        self.cache = cache
        self.stats = stats
        self.inodes = InodeTable()
        root_prefix = settings.only_dir.strip("/")
        self.root_prefix = root_prefix + "/" if root_prefix else ""
        self.inodes.get(ROOT_INODE).path = self.root_prefix
        self.meta = MetadataCache(
            ttl=settings.metadata_ttl, negative_ttl=settings.negative_ttl,
            listing_ttl=settings.listing_ttl, budget_bytes=settings.metadata_cache_size, clock=clock)
        self._clock = clock  # the TTLs' and the refusal windows' time
        self.hidden = HiddenNames()
        #: inodes with pending writes: their own state knows better than any stat
        self.is_writing: Callable[[int], bool] = lambda ino: False
        #: told of every change this mount makes (the metadata preload skips stale directories)
        self.on_change: Callable[[str], None] = lambda path: None
        self.kernel: KernelCache = RecordingKernel()
        # Names whose last change was refused (ESTALE), until when: Linux
        # retries a path call that failed with ESTALE once, after a fresh
        # lookup, which would find the other client's object and change it.
        self._refused: dict[tuple[int, str], float] = {}
        self._root_loaded = not self.root_prefix  # the bucket's root has no folder to ask for
        self._root_time_told = False

    # -- inodes -----------------------------------------------------------------------------------

    def inode(self, ino: int) -> Inode:
        try:
            return self.inodes.get(ino)
        except KeyError:
            raise FSError(errno.ENOENT) from None

    def directory(self, ino: int) -> Inode:
        inode = self.inode(ino)
        if inode.kind is not EntryKind.DIR:
            raise FSError(errno.ENOTDIR)
        return inode

    def apply(self, inode: Inode, meta: ObjectMeta) -> None:
        """Take the object's metadata into the inode (unless writes are pending)."""
        if self.is_writing(inode.ino):
            return
        if inode.generation and meta.generation != inode.generation:
            # A new generation: cached blocks of the old one are useless.
            self.cache.invalidate_object(inode.path, keep_generation=meta.generation)
        inode.generation = meta.generation
        inode.metageneration = meta.metageneration
        inode.size = meta.size
        inode.mtime_ns = meta.mtime_ns
        inode.ctime_ns = meta.ctime_ns
        inode.finalized = meta.finalized
        inode.symlink_target = meta.symlink_target
        inode.permissions = meta.permissions if self.settings.preserve_mode else None

    def apply_directory(self, inode: Inode, record: DirectoryMeta) -> None:
        """Take what the bucket holds of a directory into its inode: its times
        (see :meth:`DirectoryMeta.times`; an implicit directory keeps its own)."""
        inode.directory = record
        times = record.times()
        if times is not None:
            inode.mtime_ns, inode.ctime_ns = times

    async def load_root(self) -> None:
        """Once: the times of the mount's root, when it is a prefix of the
        bucket (``--only-dir``); a failure leaves the time the mount started."""
        if self._root_loaded:
            return
        self._root_loaded = True
        try:
            _, directory = await storage_call(self.store.stat_name, self.root_prefix[:-1])
        except FSError:
            return  # logged; the root keeps the mount's start time
        if directory is not None:
            self.apply_directory(self.inodes.get(ROOT_INODE), directory)

    def changed(self, path: str) -> None:
        """Forget what the caches knew of ``path`` (and its directory's listing)."""
        self.meta.invalidate(path)
        self.meta.invalidate(path + "/")
        self.on_change(path)

    def stale(self, parent: Inode, name: str, *, refused: bool = True) -> None:
        """Another client changed ``name``: drop this mount's view of it, the
        kernel's included, so the next lookup sees the bucket's object.
        ``refused``: a change was refused (ESTALE); refuse the kernel's retry too."""
        if refused:
            now = self._clock()
            self._refused = {key: until for key, until in self._refused.items() if until > now}
            if len(self._refused) < REFUSALS_REMEMBERED:
                self._refused[(parent.ino, name)] = now + REFUSAL_SECONDS
        self.changed(parent.path + name)
        self.kernel.forget_entry(parent.ino, name)
        child = self.inodes.child(parent.ino, name)
        if child is not None:
            self.kernel.forget_attributes(child.ino)

    def check_not_refused(self, *names: tuple[Inode, str]) -> None:
        """A change of a name refused moments ago is refused again: the kernel
        retries the refused call at once, after lookups that show the user
        nothing. Every name of the call stays refused for the whole window
        (a rename onto a refused name must not be retried with a source the
        retry's lookup found)."""
        now = self._clock()
        refused = [parent.path + name for parent, name in names
                   if self._refused.get((parent.ino, name), 0.0) > now]
        if refused:
            for parent, name in names:
                self._refused[(parent.ino, name)] = max(self._refused.get((parent.ino, name), 0.0),
                                                        now + REFUSAL_SECONDS / 4)
            raise RetryRefused(refused[0])

    def seen_generation(self, parent: Inode, name: str, entry: ListedEntry | None) -> int:
        """The generation this mount last showed for ``name``: that of the
        kernel's inode, else of the entry just found; 0 for a free name or a
        file that exists only here (or a directory: it has no generation)."""
        if entry is None or entry.kind is EntryKind.DIR:
            return 0
        child = self.inodes.child(parent.ino, name)
        if child is not None and child.kind is entry.kind:
            if child.generation:
                return child.generation
            if child.kind is EntryKind.FILE:
                return 0  # this mount's own file, never uploaded: nothing of the bucket's was seen
        return listed_meta(entry.object).generation if entry.object is not None else 0

    async def guarded(self, parent: Inode, name: str, call: Callable[_P, Awaitable[_R]], *args: _P.args,
                      **kwargs: _P.kwargs) -> _R:
        """A change conditional on what this mount saw of ``name``. Refused
        (ESTALE), or gone (ENOENT), means another client changed it."""
        try:
            return await storage_call(call, *args, **kwargs)
        except FSError as err:
            if err.errno in (errno.ESTALE, errno.ENOENT):
                self.stale(parent, name, refused=err.errno == errno.ESTALE)
            raise

    def forget(self, items: list[tuple[int, int]]) -> list[int]:
        """The kernel dropped references; returns the inodes now gone."""
        gone = []
        for ino, count in items:
            self.inodes.forget(ino, count)
            if ino not in self.inodes:
                gone.append(ino)
        return gone

    # -- lookup -----------------------------------------------------------------------------------

    def entry_inode(self, parent: Inode, entry: ListedEntry, *, looked_up: bool = False) -> Inode:
        if entry.kind is EntryKind.DIR:
            inode = self.inodes.resolve(parent.ino, entry.name, entry.kind)
            if isinstance(entry.object, DirectoryMeta):
                self.apply_directory(inode, entry.object)
            return inode
        if entry.object is None:
            return self.inodes.resolve(parent.ino, entry.name, entry.kind)
        meta = listed_meta(entry.object)
        # A new generation is a new inode (as in gcsfuse): handles open on the
        # old one keep reading the generation, and the page cache, they had.
        previous = self.inodes.child(parent.ino, entry.name)
        if previous is not None and not previous.generation and previous.kind is EntryKind.FILE \
                and not self.is_writing(previous.ino):
            # This mount's own file, never uploaded: another client's object
            # under its name is a new file, not this one.
            self.inodes.detach(previous.ino)
        inode = self.inodes.resolve(parent.ino, entry.name, entry.kind, generation=meta.generation)
        if previous is not None and previous is not inode:
            if not previous.open_count:
                self.cache.invalidate_object(inode.path, keep_generation=meta.generation)
            if not looked_up:
                # A listing found the name replaced: the kernel's entry still
                # names the old inode, and a change by that name must not act
                # on an object the user never saw.
                self.kernel.forget_entry(parent.ino, entry.name)
        self.apply(inode, meta)
        return inode

    async def find(self, parent: Inode, name: str) -> ListedEntry | None:
        """What ``name`` is inside ``parent``: from caches when fresh, else one round trip."""
        child = self.inodes.child(parent.ino, name)
        if child is not None and self.is_writing(child.ino):
            return ListedEntry(name, child.kind, None)  # this mount's own file, maybe not uploaded yet
        listed = self.meta.lookup_in_listing(parent.path, name)
        if listed is ABSENT:
            return None
        if listed is not None:
            return listed
        file_path = parent.path + name
        dir_path = file_path + "/"
        as_dir, as_file = self.meta.get(dir_path), self.meta.get(file_path)
        if as_dir is not None and as_dir is not ABSENT:  # the directory wins
            return ListedEntry(name, EntryKind.DIR, as_dir if isinstance(as_dir, DirectoryMeta) else None)
        if as_dir is ABSENT and as_file is ABSENT:
            return None
        if as_dir is ABSENT and isinstance(as_file, ObjectMeta):
            return ListedEntry(name, kind_of(as_file), as_file)
        self.stats.rpc_lookups += 1
        meta, directory = await storage_call(self.store.stat_name, file_path)
        if directory is not None:
            self.meta.put_dir(dir_path, directory)
        else:
            self.meta.put_absent(dir_path)
        if meta is None:
            self.meta.put_absent(file_path)
        else:
            self.meta.put_object(meta)
        if directory is not None:
            return ListedEntry(name, EntryKind.DIR, directory)
        if meta is None:
            return None
        return ListedEntry(name, kind_of(meta), meta)

    async def lookup(self, parent_ino: int, raw_name: bytes) -> Inode:
        self.stats.lookups += 1
        parent = self.directory(parent_ino)
        if raw_name in (b".", b".."):
            inode = parent if raw_name == b"." else self.inode(parent.parent or ROOT_INODE)
            self.inodes.lookup(inode.ino)
            return inode
        name = component_from_fuse(raw_name)
        if name is None:
            raise FSError(errno.ENAMETOOLONG if len(raw_name) > 255 else errno.ENOENT)
        entry = await self.find(parent, name)
        if entry is None:
            raise NoSuchName(self.meta.absent_for(parent.path, name))
        inode = self.entry_inode(parent, entry, looked_up=True)
        self.inodes.lookup(inode.ino)
        return inode

    async def refresh(self, inode: Inode) -> None:
        """Bring the inode up to date from the cache, or from one GetObject."""
        cached = self.meta.get(inode.path)
        meta: ObjectMeta | None
        if isinstance(cached, ObjectMeta):
            meta = cached
        else:
            meta = await storage_call(self.store.get_object, inode.path)
            if meta is None:
                self.meta.put_absent(inode.path)
                if inode.open_count:
                    return  # keep serving the generation the open handles pinned
                raise FSError(errno.ENOENT)
            self.meta.put_object(meta)
        if inode.generation and meta.generation != inode.generation:
            # The name now holds a newer object, which gets its own inode at
            # the next lookup: make the kernel look it up again.
            self.kernel.forget_entry(inode.parent, inode.name)
            return
        if not inode.generation and inode.kind is EntryKind.FILE and not self.is_writing(inode.ino):
            # A file this mount made and never uploaded (its upload was
            # refused): the object under its name is another client's, never
            # to be taken for this inode's.
            self.kernel.forget_entry(inode.parent, inode.name)
            raise FSError(errno.ESTALE, f"{inode.path!r} now names another client's object")
        self.apply(inode, meta)

    async def readlink(self, ino: int) -> str:
        inode = self.inode(ino)
        if inode.kind is not EntryKind.SYMLINK or inode.symlink_target is None:
            raise FSError(errno.EINVAL)
        return inode.symlink_target

    # -- listings ---------------------------------------------------------------------------------

    async def listing(self, directory: str) -> list[ListedEntry]:
        entries = self.meta.get_listing(directory)
        if entries is not None:
            return entries
        self.stats.listings += 1
        objects, prefixes, folders = await self._list_directory(directory)
        entries, hidden = entries_from_listing(
            directory, ((meta.name, meta) for meta in objects), prefixes, self.hidden,
            is_symlink=lambda record: listed_meta(record).is_symlink,
            directory_record=lambda prefix, placeholder: directory_meta(prefix, folders.get(prefix), placeholder))
        for message, args in self.hidden.messages(hidden):
            log.warning(message, *args)
        self.meta.put_listing(directory, entries)
        return entries

    async def _list_directory(self, directory: str) -> tuple[list[ObjectMeta], list[str], dict[str, FolderMeta]]:
        """The objects and prefixes of ``directory`` and, on buckets with
        folders, the subfolders it has (for their times: one more request,
        made only when there are subdirectories). Subfolders that fail to
        list cost their times, not the listing."""
        objects, prefixes, _ = await storage_call(self.store.list_directory, directory)
        if not self.layout.folders or not prefixes:
            return objects, prefixes, {}
        try:
            folders = await self.store.list_child_folders(directory)
        except StorageError as err:
            log_failure(err, f"the folders of {directory!r} (their times) did not list: ")
            return objects, prefixes, {}
        return objects, prefixes, {folder.name: folder for folder in folders}

    async def directory_is_empty(self, prefix: str) -> bool:
        page = await storage_call(self.store.list_page, prefix, page_size=2)
        return not page.prefixes and all(meta.name == prefix for meta in page.objects)

    # -- changes ----------------------------------------------------------------------------------

    def check_writable(self) -> None:
        if self.settings.read_only:
            raise FSError(errno.EROFS)

    @staticmethod
    def new_name(raw_name: bytes) -> str:
        name = component_from_fuse(raw_name)
        if name is None:
            raise FSError(errno.ENAMETOOLONG if len(raw_name) > 255 else errno.EINVAL)
        if "\n" in name or "\r" in name:
            log.warning("refusing the name %r: object names cannot hold carriage returns or line feeds", name)
            raise FSError(errno.EINVAL)
        return name

    async def existing(self, parent_ino: int, raw_name: bytes) -> tuple[Inode, str, ListedEntry]:
        """For a change to an existing name: (its directory, the name, what it is)."""
        self.check_writable()
        parent = self.directory(parent_ino)
        name = self.new_name(raw_name)
        self.check_not_refused((parent, name))
        entry = await self.find(parent, name)
        if entry is None:
            raise FSError(errno.ENOENT)
        return parent, name, entry

    async def free_name(self, parent_ino: int, raw_name: bytes) -> tuple[Inode, str]:
        """For a new name: (its directory, the name); EEXIST if it is taken."""
        self.check_writable()
        parent = self.directory(parent_ino)
        name = self.new_name(raw_name)
        if await self.find(parent, name) is not None:
            raise FSError(errno.EEXIST)
        return parent, name

    async def unlink(self, parent: Inode, name: str, generation: int) -> None:
        """Delete generation ``generation`` of ``name``; 0: the file exists only
        here, nothing to delete in the bucket."""
        path = parent.path + name
        if generation != 0:
            await self.guarded(parent, name, self.store.delete_object, path, if_generation_match=generation)
        self.changed(path)
        self.meta.put_absent(path)
        child = self.inodes.child(parent.ino, name)
        if child is not None:
            self.inodes.detach(child.ino)

    async def mkdir(self, parent_ino: int, raw_name: bytes) -> Inode:
        parent, name = await self.free_name(parent_ino, raw_name)
        prefix = parent.path + name + "/"
        record: DirectoryMeta | None = None
        if self.layout.folders:
            folder = await storage_call(self.store.create_folder, prefix)
            if folder is not None:
                record = DirectoryMeta(prefix, folder, None)  # a new folder holds no placeholder
        else:
            # Cached answers may be old and a directory of a flat bucket can be
            # implied by any object below it: ask the bucket itself.
            meta, existing = await storage_call(self.store.stat_name, parent.path + name)
            if meta is not None or existing is not None:
                self.changed(parent.path + name)
                raise FSError(errno.EEXIST)
            try:
                placeholder = await storage_call(self.store.write_object, prefix, None, 0, if_generation_match=0)
            except FSError as err:
                if err.errno == errno.ESTALE:  # the placeholder appeared meanwhile
                    raise FSError(errno.EEXIST) from None
                raise
            record = DirectoryMeta(prefix, None, placeholder)
        self.changed(parent.path + name)
        self.meta.put_dir(prefix, record)
        inode = self.inodes.resolve(parent.ino, name, EntryKind.DIR)
        if record is None:  # made again after its worker died: the folder's own record is not at hand
            inode.mtime_ns = inode.ctime_ns = time.time_ns()
        else:
            self.apply_directory(inode, record)
        self.inodes.lookup(inode.ino)
        return inode

    async def set_directory_mtime(self, inode: Inode, mtime_ns: int) -> None:
        """Keep a directory's mtime in its placeholder object ``dir/`` (made
        if there is none), as ``gcsfuse_mtime``: folders hold no custom
        metadata. The bucket's own root has no name to hold it: its time is
        kept in this mount's memory only, and a log line says so once."""
        if not inode.path:
            if not self._root_time_told:
                self._root_time_told = True
                log.warning("the bucket's root directory keeps no times: the time set on the mount's root "
                            "is kept until this mount ends, not in the bucket")
            inode.mtime_ns = mtime_ns
            return
        prefix, known = inode.path, inode.directory
        value = {MTIME_METADATA_KEY: format_mtime(mtime_ns)}
        placeholder = known.placeholder if known is not None else None
        for attempt in range(2):
            try:
                if placeholder is None:
                    meta = await storage_call(self.store.write_object, prefix, None, 0, if_generation_match=0,
                                              metadata=value)
                else:
                    meta = await storage_call(self.store.update_metadata, prefix, placeholder.generation, value,
                                              if_metageneration_match=placeholder.metageneration)
                break
            except FSError as err:
                # The placeholder is not as this mount saw it (another client
                # made, changed or deleted it): it is no file of the user's,
                # so ask for it and set the time on what is there.
                if attempt or err.errno not in (errno.ESTALE, errno.ENOENT, errno.EEXIST):
                    raise
                placeholder = await storage_call(self.store.get_object, prefix)
        record = DirectoryMeta(prefix, known.folder if known is not None else None, meta)
        self.meta.invalidate_listing(parent_prefix(prefix))  # its entry there is older
        self.meta.put_dir(prefix, record)
        self.on_change(prefix)
        self.apply_directory(inode, record)

    async def rmdir(self, parent_ino: int, raw_name: bytes) -> None:
        parent, name, entry = await self.existing(parent_ino, raw_name)
        if entry.kind is not EntryKind.DIR:
            raise FSError(errno.ENOTDIR)
        prefix = parent.path + name + "/"
        if not await self.directory_is_empty(prefix):
            raise FSError(errno.ENOTEMPTY)
        placeholder = await storage_call(self.store.get_object, prefix)
        if placeholder is not None:
            await storage_call(self.store.delete_object, prefix, if_generation_match=placeholder.generation)
        if self.layout.folders:
            try:
                await storage_call(self.store.delete_folder, prefix)
            except FSError as err:
                if err.errno != errno.ENOENT or placeholder is None:
                    raise
        self.changed(parent.path + name)
        self.meta.invalidate_listing(prefix)  # it was empty: nothing of this mount's lies below
        self.meta.put_absent(prefix)
        child = self.inodes.child(parent.ino, name)
        if child is not None:
            self.inodes.detach(child.ino)

    async def rename_directory(self, source: str, destination: str, replace: bool) -> None:
        if self.layout.folders:
            if replace:
                await storage_call(self.store.delete_folder, destination)
            folder = await storage_call(self.store.rename_folder, source, destination)
            self._forget_below(source, destination)
            moved = self._known_directory(source)
            if moved is not None and folder is not None:
                # The rename is the folder's update: its new time, and the
                # placeholder (moved with it) keeps any time set on it.
                placeholder = moved.directory.placeholder if moved.directory is not None else None
                self.apply_directory(moved, DirectoryMeta(destination, folder, placeholder))
            return
        limit = self.settings.rename_dir_limit
        if not limit:
            raise FSError(errno.ENOTSUP, "renaming directories needs --rename-dir-limit on this bucket")
        objects, _, complete = await storage_call(self.store.list_directory, source, delimiter="",
                                                  limit=limit + 1)
        if not complete or len(objects) > limit:
            raise FSError(errno.ENOTSUP, f"directory has more than --rename-dir-limit={limit} objects")
        for meta in objects:
            await storage_call(self.store.move_object, meta.name, destination + meta.name[len(source):],
                               if_source_generation_match=meta.generation, if_generation_match=0)
        self._forget_below(source, destination)

    def _known_directory(self, prefix: str) -> Inode | None:
        """The inode of directory ``prefix`` ("a/b/"), if this mount knows it."""
        inode: Inode | None = self.inodes.get(ROOT_INODE)
        for name in prefix[len(self.root_prefix):].split("/")[:-1]:
            if inode is None:
                return None
            inode = self.inodes.child(inode.ino, name)
        return inode

    def _forget_below(self, *prefixes: str) -> None:
        """A directory moved: nothing known below its old path (or below the
        empty one it replaced) holds any more."""
        for prefix in prefixes:
            self.meta.invalidate_below(prefix)

    async def move_file(self, old_parent: Inode, old_name: str, new_parent: Inode, new_name: str,
                        generation: int, target_generation: int) -> ObjectMeta:
        """MoveObject of the generation this mount saw, onto the target it saw (0: none)."""
        try:
            return await storage_call(self.store.move_object, old_parent.path + old_name,
                                      new_parent.path + new_name, if_source_generation_match=generation,
                                      if_generation_match=target_generation)
        except FSError as err:
            if err.errno in (errno.ESTALE, errno.ENOENT):
                self.stale(old_parent, old_name, refused=err.errno == errno.ESTALE)
                self.stale(new_parent, new_name, refused=err.errno == errno.ESTALE)
            raise

    def renamed(self, old_parent: Inode, old_name: str, new_parent: Inode, new_name: str,
                moved_meta: ObjectMeta | None) -> Inode | None:
        """Update the caches and inodes after a rename; returns the moved inode if known."""
        source_path, target_path = old_parent.path + old_name, new_parent.path + new_name
        for path in (source_path, target_path):
            self.changed(path)
        self.meta.put_absent(source_path)
        replaced = self.inodes.child(new_parent.ino, new_name)
        if replaced is not None:
            self.inodes.detach(replaced.ino)
        moved = self.inodes.child(old_parent.ino, old_name)
        if moved is not None:
            self.inodes.move(moved.ino, new_parent.ino, new_name)
        if moved_meta is not None:
            # The destination is a new generation; the moved inode now names it.
            self.meta.put_object(moved_meta)
            if moved is not None:
                self.apply(moved, moved_meta)
        return moved

    async def symlink(self, parent_ino: int, raw_name: bytes, target: bytes) -> Inode:
        parent, name = await self.free_name(parent_ino, raw_name)
        path = parent.path + name
        meta = await storage_call(
            self.store.write_object, path, None, 0, if_generation_match=0,
            metadata={SYMLINK_METADATA_KEY: target.decode("utf-8", "surrogateescape")})
        self.changed(path)
        self.meta.put_object(meta)
        inode = self.inodes.resolve(parent.ino, name, EntryKind.SYMLINK, generation=meta.generation)
        self.apply(inode, meta)
        self.inodes.lookup(inode.ino)
        return inode
