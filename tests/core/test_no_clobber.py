"""No mutation of the mount can change an object whose generation it did not see.

A second writer races the mount: it replaces, appends to and deletes the
same few names while the mount writes, truncates, renames, unlinks and sets
times. The store audits every call that changes an existing object: it
must carry a precondition naming the live generation, and that generation
must be one the mount's user saw (a lookup, stat or listing answered with
it, as the kernel caches them) or one the mount wrote itself. Refusals
(ESTALE) are the expected outcome of a lost race; a clobber is a failure.
"""

from __future__ import annotations

import errno
import os
import random

import pytest
import trio

from rapidmount.core import Filesystem, FSError
from rapidmount.core.settings import CoreSettings
from rapidmount.emulator.memory_store import MemoryStore
from rapidmount.storage.model import ObjectMeta

SEQUENCES = int(os.environ.get("RAPIDMOUNT_CLOBBER_SEQUENCES", "1000"))
STEPS = 12
NAMES = ("a", "b", "c")


class AuditedStore(MemoryStore):
    """A MemoryStore that checks every change against what it showed the core."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind=kind)
        self.shown: set[tuple[str, int]] = set()
        self.clobbers: list[str] = []

    def _show(self, meta):
        if isinstance(meta, ObjectMeta):
            self.shown.add((meta.name, meta.generation))
        return meta

    def _audit(self, what: str, name: str, precondition: int | None) -> None:
        live = self.meta(name)
        if live is None:
            return  # nothing there to clobber
        if precondition is None:
            self.clobbers.append(f"{what} {name!r}: no precondition over generation {live.generation}")
        elif precondition and precondition == live.generation and (name, precondition) not in self.shown:
            self.clobbers.append(f"{what} {name!r}: generation {precondition} was never shown to the mount")

    async def write_object(self, name, source, size, *, if_generation_match, metadata=None):
        self._audit("write", name, if_generation_match)
        return self._show(await super().write_object(name, source, size, if_generation_match=if_generation_match,
                                                     metadata=metadata))

    async def delete_object(self, name, *, if_generation_match=None):
        self._audit("delete", name, if_generation_match)
        await super().delete_object(name, if_generation_match=if_generation_match)

    async def move_object(self, source, destination, *, if_source_generation_match=None, if_generation_match=None):
        self._audit("move from", source, if_source_generation_match)
        self._audit("move onto", destination, if_generation_match)
        return self._show(await super().move_object(source, destination,
                                                    if_source_generation_match=if_source_generation_match,
                                                    if_generation_match=if_generation_match))

    async def update_metadata(self, name, generation, metadata, *, if_metageneration_match=None):
        self._audit("update", name, generation)
        return self._show(await super().update_metadata(name, generation, metadata,
                                                        if_metageneration_match=if_metageneration_match))

    def open_appender(self, name):
        appender = super().open_appender(name)
        store, create = self, appender.create

        async def audited_create(*, if_generation_match=0, metadata=None):
            store._audit("create", name, if_generation_match)
            return store._show(await create(if_generation_match=if_generation_match, metadata=metadata))

        appender.create = audited_create
        return appender


class Kernel:
    """The kernel's side: a dentry cache (kept until the core says to forget
    an entry) through which every operation by name goes, as in VFS."""

    def __init__(self, fs: Filesystem, store: AuditedStore) -> None:
        self.fs, self.store = fs, store
        self.dentries: dict[str, int] = {}
        self.forgotten = 0

    def show(self, inode) -> None:
        if inode.generation:
            self.store.shown.add((inode.path, inode.generation))

    def _sync(self) -> None:
        told = self.fs.kernel.entries
        for _, name in told[self.forgotten:]:
            self.dentries.pop(name, None)
        self.forgotten = len(told)

    async def ino(self, name: str, *, shown: bool = True) -> int | None:
        self._sync()
        if name not in self.dentries:
            try:
                inode = await self.fs.lookup(1, name.encode())
            except FSError:
                return None
            if shown:
                self.show(inode)
            self.dentries[name] = inode.ino
        return self.dentries[name]

    async def stat(self, name: str) -> None:
        ino = await self.ino(name)
        if ino is not None:
            try:
                self.show(await self.fs.getattr(ino))
            except FSError:
                self.dentries.pop(name, None)

    async def path_call(self, names: tuple[str, ...], call) -> None:
        """A call by path, as VFS makes it: on ESTALE, Linux looks the names up
        afresh and retries once (``retry_estale``)."""
        try:
            await call()
        except FSError as err:
            if err.errno != errno.ESTALE:
                raise
            self.dropped(*names)
            # The retry's lookups happen inside the failed call: what they found
            # counts as seen only after it (later calls use those dentries).
            found = [await self.ino(name, shown=False) for name in names]
            try:
                if found[0] is None:
                    raise FSError(errno.ENOENT) from None
                await call()
            finally:
                for ino in found:
                    if ino is not None and ino in self.fs.namespace.inodes:
                        self.show(self.fs.namespace.inodes.get(ino))

    def dropped(self, *names: str) -> None:
        for name in names:
            self.dentries.pop(name, None)


async def _mount_step(kernel: Kernel, rng: random.Random, handles: dict[int, str]) -> None:
    fs = kernel.fs
    name = rng.choice(NAMES)
    action = rng.choice(("create", "write", "append", "close", "truncate", "unlink", "rename", "utime",
                         "stat", "list"))
    if action == "create":
        if await kernel.ino(name) is not None:
            return  # O_CREAT of an existing name opens it
        fh, inode = await fs.create(1, name.encode(), os.O_RDWR)
        kernel.dentries[name] = inode.ino
        handles[fh] = name
    elif action in ("write", "append"):
        ino = await kernel.ino(name)
        if ino is None:
            return
        flags = os.O_WRONLY | (os.O_APPEND if action == "append" else 0)
        fh, _, _ = await fs.open(ino, flags)
        handles[fh] = name
        offset = 0 if action == "write" else (await fs.getattr(ino)).size
        await fs.write(fh, rng.randrange(0, 4) if action == "write" else offset, b"m" * rng.randrange(1, 6))
    elif action == "close" and handles:
        fh = rng.choice(sorted(handles))
        del handles[fh]
        try:
            await fs.flush(fh)
        finally:
            await fs.release(fh)
    elif action == "truncate":
        if await kernel.ino(name) is not None:
            size = rng.randrange(0, 3)
            await kernel.path_call((name,), lambda: fs.truncate(kernel.dentries[name], size))
    elif action == "unlink":
        if await kernel.ino(name) is not None:
            await kernel.path_call((name,), lambda: fs.unlink(1, name.encode()))
            kernel.dropped(name)
    elif action == "rename":
        target = rng.choice(NAMES)
        if await kernel.ino(name) is not None:
            await kernel.ino(target)
            await kernel.path_call((name, target), lambda: fs.rename(1, name.encode(), 1, target.encode()))
            kernel.dentries[target] = kernel.dentries.pop(name)
    elif action == "utime":
        if await kernel.ino(name) is not None:
            when = rng.randrange(1, 2**40) * 1000
            await kernel.path_call((name,), lambda: fs.set_mtime(kernel.dentries[name], when))
    elif action == "stat":
        await kernel.stat(name)
    else:
        fh = await fs.opendir(1)
        try:
            async for entry_name, inode, _ in fs.readdir(fh, 0):
                if entry_name not in (".", ".."):
                    fs.entry_returned(inode.ino)  # the kernel holds a reference, as the adapter says
                    kernel.show(inode)
                    kernel.dentries[entry_name] = inode.ino
        finally:
            fs.releasedir(fh)


def _other_writer_step(store: AuditedStore, rng: random.Random) -> None:
    name = rng.choice(NAMES)
    action = rng.choice(("replace", "replace", "append", "delete"))
    live = store.meta(name)
    if action == "replace" or live is None:
        store.put(name, b"other-" + bytes([rng.randrange(97, 123)]),
                  appendable=store.layout.appendable_objects, finalize=False if store.layout.zonal else None)
    elif action == "append" and not live.finalized:
        store.append_external(name, b"+x")
    elif action == "delete":
        store.delete_external(name)


async def _sequence(kind: str, seed: int, temp_dir: str) -> list[str]:
    rng = random.Random(seed)
    store = AuditedStore(kind)
    for name in NAMES[:2]:
        store.put(name, b"seed", appendable=store.layout.appendable_objects,
                  finalize=False if store.layout.zonal else None)
    fs = Filesystem(CoreSettings(temp_dir=temp_dir, metadata_ttl=60.0), store, uid=0, gid=0)
    handles: dict[int, str] = {}
    kernel = Kernel(fs, store)
    async with trio.open_nursery() as nursery:
        fs.attach(nursery)
        for _ in range(STEPS):
            if rng.random() < 0.35:
                _other_writer_step(store, rng)
            try:
                await _mount_step(kernel, rng, handles)
            except FSError as err:
                assert err.errno in (errno.ESTALE, errno.ENOENT, errno.EEXIST, errno.EBADF), \
                    f"seed {seed}: unexpected {errno.errorcode.get(err.errno)}: {err}"
        for fh in list(handles):
            try:
                await fs.flush(fh)
            except FSError as err:
                assert err.errno in (errno.ESTALE, errno.ENOENT), f"seed {seed}: close failed with {err}"
            await fs.release(fh)
        nursery.cancel_scope.cancel()
    return store.clobbers


@pytest.mark.parametrize("kind", ["zonal", "flat"])
def test_a_racing_writer_is_never_clobbered(kind, tmp_path):
    clobbers = []
    for seed in range(SEQUENCES // 2):
        found = trio.run(_sequence, kind, seed, str(tmp_path))
        clobbers += [f"seed {seed}: {line}" for line in found]
    assert not clobbers, "\n".join(clobbers[:20])
