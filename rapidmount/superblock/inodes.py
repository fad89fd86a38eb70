"""The inode table: stable inode numbers for the kernel.

An inode lives while the kernel can name it: its lookup count (``nlookup``,
raised once per entry handed to the kernel, lowered by FORGET) is positive,
it is open, or it is still reachable by name from its parent. Inode numbers
only ever grow, so a number is never reused within the process and the
kernel can never confuse a dead inode with a new one.

Identity rule (as gcsfuse): the same name and kind keeps its inode; a
change of kind (a file replaced by a directory) or, when the caller passes
it, of object generation gets a fresh inode, and the old one is detached:
unreachable by name, alive by number until the kernel forgets it. That makes
it safe to keep the kernel page cache across opens.

``Inode.path`` is always the parent's path plus the name (see
:mod:`rapidmount.superblock.names`); :meth:`InodeTable.move` rewrites the
paths of every known descendant of a renamed directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rapidmount.storage.model import DirectoryMeta
from rapidmount.superblock.names import EntryKind, child_path

__all__ = ["ROOT_INODE", "Inode", "InodeTable"]

ROOT_INODE = 1


@dataclass(slots=True)
class Inode:
    ino: int
    parent: int
    name: str
    kind: EntryKind
    #: object name for files/symlinks, prefix with trailing "/" for dirs, "" for root
    path: str
    generation: int = 0
    metageneration: int = 0
    size: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0
    finalized: bool = True
    symlink_target: str | None = None
    permissions: int | None = None  # from object metadata, with --preserve-mode
    #: a directory's folder and placeholder, as the bucket last showed them
    directory: DirectoryMeta | None = None
    nlookup: int = 0
    open_count: int = 0
    #: True once the name was removed or replaced; alive only by number
    detached: bool = False
    #: stable id for page-cache keys (== ino, which is never reused)
    object_id: int = field(init=False)

    def __post_init__(self) -> None:
        self.object_id = self.ino


class InodeTable:
    """All inodes the mount knows, by number and by (parent, name)."""

    def __init__(self, root_kind: EntryKind = EntryKind.DIR) -> None:
        root = Inode(ROOT_INODE, ROOT_INODE, "", root_kind, "")
        self._inodes: dict[int, Inode] = {ROOT_INODE: root}
        # Directory ino -> name -> child ino, for attached children only.
        self._children: dict[int, dict[str, int]] = {}
        self._next_ino = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._inodes)

    def __contains__(self, ino: object) -> bool:
        return ino in self._inodes

    def get(self, ino: int) -> Inode:
        """The inode numbered ``ino``; KeyError if unknown (the caller answers ENOENT/ESTALE)."""
        return self._inodes[ino]

    def child(self, parent: int, name: str) -> Inode | None:
        """The attached child ``name`` of directory ``parent``, if known."""
        ino = self._children.get(parent, {}).get(name)
        return None if ino is None else self._inodes[ino]

    def children(self, parent: int) -> list[Inode]:
        """The attached, known children of ``parent`` (e.g. to detach those a
        fresh listing no longer shows)."""
        return [self._inodes[i] for i in self._children.get(parent, {}).values()]

    def resolve(
        self, parent: int, name: str, kind: EntryKind, *, generation: int | None = None
    ) -> Inode:
        """The child ``name`` of ``parent`` as ``kind``, created if needed.

        An existing child of another kind -- or, if ``generation`` is given,
        of another known (non-zero) generation -- is detached and replaced by
        a new inode. Does not count a lookup: call :meth:`lookup` for each
        entry actually returned to the kernel.
        """
        existing = self.child(parent, name)
        if existing is not None:
            if existing.kind is kind and (
                generation is None
                or not existing.generation
                or existing.generation == generation
            ):
                return existing
            self.detach(existing.ino)
        dir_inode = self._inodes[parent]
        if dir_inode.kind is not EntryKind.DIR:
            raise NotADirectoryError(f"inode {parent} is not a directory")
        path = child_path(dir_inode.path, name, kind is EntryKind.DIR)
        ino = self._next_ino
        self._next_ino += 1
        inode = Inode(ino, parent, name, kind, path, generation=generation or 0)
        self._inodes[ino] = inode
        self._children.setdefault(parent, {})[name] = ino
        return inode

    def lookup(self, ino: int) -> None:
        """Count one more reference held by the kernel."""
        self._inodes[ino].nlookup += 1

    def forget(self, ino: int, n: int) -> None:
        """The kernel dropped ``n`` references. Never fails: FORGET has no reply."""
        inode = self._inodes.get(ino)
        if inode is None:
            return
        inode.nlookup = max(0, inode.nlookup - n)
        self._maybe_drop(inode)

    def opened(self, ino: int) -> None:
        self._inodes[ino].open_count += 1

    def closed(self, ino: int) -> None:
        """A handle was released; may drop an inode the kernel already forgot."""
        inode = self._inodes.get(ino)
        if inode is None:
            return
        inode.open_count = max(0, inode.open_count - 1)
        self._maybe_drop(inode)

    def detach(self, ino: int) -> None:
        """The name is gone (unlink, rmdir, replaced): unreachable by name,
        alive by number until forgotten and closed."""
        inode = self._inodes[ino]
        if ino == ROOT_INODE:
            raise ValueError("cannot detach the root")
        self._unlink_name(inode)
        inode.detached = True
        self._maybe_drop(inode)

    def move(self, ino: int, new_parent: int, new_name: str) -> None:
        """Rename: attach ``ino`` as ``new_name`` in ``new_parent``.

        An existing different child at the destination is detached (rename
        replaces it). Directory moves rewrite the paths of all known
        descendants; moving a directory into itself is refused.
        """
        inode = self._inodes[ino]
        target = self._inodes[new_parent]
        if ino == ROOT_INODE:
            raise ValueError("cannot move the root")
        if target.kind is not EntryKind.DIR:
            raise NotADirectoryError(f"inode {new_parent} is not a directory")
        ancestor = target
        while True:  # refuse a cycle: is ino an ancestor of new_parent?
            if ancestor.ino == ino:
                raise ValueError("cannot move a directory into itself")
            parent = self._inodes.get(ancestor.parent)
            if parent is None or parent.ino == ROOT_INODE:
                break
            ancestor = parent
        new_path = child_path(target.path, new_name, inode.kind is EntryKind.DIR)
        displaced = self.child(new_parent, new_name)
        if displaced is not None and displaced is not inode:
            self.detach(displaced.ino)
        self._unlink_name(inode)
        inode.parent, inode.name, inode.detached = new_parent, new_name, False
        self._children.setdefault(new_parent, {})[new_name] = ino
        self._repath(inode, new_path)

    # -- internals ----------------------------------------------------------

    def _repath(self, inode: Inode, path: str) -> None:
        """Set ``inode.path`` and re-derive the paths of its known subtree."""
        inode.path = path
        stack = [inode]
        while stack:
            parent = stack.pop()
            for child_ino in self._children.get(parent.ino, {}).values():
                child = self._inodes[child_ino]
                child.path = child_path(parent.path, child.name, child.kind is EntryKind.DIR)
                stack.append(child)

    def _unlink_name(self, inode: Inode) -> None:
        """Remove the (parent, name) -> inode mapping if it still points here."""
        siblings = self._children.get(inode.parent)
        if siblings is not None and siblings.get(inode.name) == inode.ino:
            del siblings[inode.name]
            if not siblings:
                del self._children[inode.parent]

    def _unreferenced(self, inode: Inode) -> bool:
        return inode.nlookup == 0 and inode.open_count == 0 and inode.ino != ROOT_INODE

    def _maybe_drop(self, inode: Inode) -> None:
        """Drop an inode nobody can reach by number any more.

        A detached inode goes as soon as it is unreferenced. An attached one
        goes too (the kernel will look the name up again and get a new
        number), taking along its never-looked-up descendants (created by
        :meth:`resolve` for a readdir), unless some descendant is still
        referenced: that keeps a live child's parent and path valid. Dropping
        may cascade to ancestors left unreferenced and childless.
        """
        while self._unreferenced(inode):
            if not self._prune_subtree(inode):
                return
            self._unlink_name(inode)
            del self._inodes[inode.ino]
            parent = self._inodes.get(inode.parent)
            if parent is None or parent.ino in self._children:
                return
            inode = parent

    def _prune_subtree(self, inode: Inode) -> bool:
        """Drop the unreferenced descendants of ``inode``; True if none is left."""
        for child_ino in list(self._children.get(inode.ino, {}).values()):
            child = self._inodes[child_ino]
            if self._unreferenced(child) and self._prune_subtree(child):
                self._unlink_name(child)
                del self._inodes[child_ino]
        return inode.ino not in self._children
