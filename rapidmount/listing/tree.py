"""A flat listing regrouped into per-directory listings (sans-I/O).

A listing without delimiter returns every object below the root; a
directory's entries are what a ``delimiter="/"`` listing of it would have
returned: the objects directly in it and the prefixes of its
subdirectories. :class:`TreeListing` builds exactly that, so directories
filled from it look the same as directories listed one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from rapidmount.storage.model import FolderMeta, ObjectMeta, directory_meta
from rapidmount.superblock.metadata_cache import estimated_directory_bytes, estimated_entry_bytes
from rapidmount.superblock.names import HiddenNames, ListedEntry, entries_from_listing, invalid_reason, parent_prefix

__all__ = ["TreeListing"]


class _Directory:
    __slots__ = ("objects", "prefixes", "folders", "nbytes")

    def __init__(self) -> None:
        #: its files, and the placeholders ("x/") of its subdirectories
        self.objects: list[ObjectMeta] = []
        self.prefixes: set[str] = set()
        #: the folders of its subdirectories, by prefix (for their times)
        self.folders: dict[str, FolderMeta] = {}
        self.nbytes = 0


class TreeListing:
    """Every directory below ``root`` ("" or "a/b/"), from objects and folders."""

    def __init__(self, root: str) -> None:
        if root and not root.endswith("/"):
            raise ValueError(f"not a directory prefix: {root!r}")
        self.root = root
        self._dirs: dict[str, _Directory] = {root: _Directory()}
        #: prefixes with a segment that cannot be a directory name: hidden by their parent
        self._unreachable: set[str] = set()
        self.objects = 0
        self.directories_seen = 1
        #: estimated metadata-cache bytes of the directories not taken yet
        self.estimated_bytes = 0

    def __len__(self) -> int:
        """Directories not taken yet."""
        return len(self._dirs)

    def _directory(self, prefix: str) -> _Directory:
        directory = self._dirs.get(prefix)
        if directory is None:
            directory = self._dirs[prefix] = _Directory()
            self.directories_seen += 1
        return directory

    def _link_parents(self, name: str) -> str | None:
        """Record every directory on the way to ``name``; returns its own
        directory, or None when a segment on the way cannot be a directory
        name (``a/../b``): the parent lists that prefix, which hides it and
        everything below, and nothing below it is kept."""
        parent = self.root
        position = len(self.root)
        while (cut := name.find("/", position)) >= 0:
            child = name[:cut + 1]
            if child not in self._dirs:
                if child in self._unreachable:
                    return None
                self._directory(parent).prefixes.add(child)
                if invalid_reason(name[position:cut]) is not None:
                    self._unreachable.add(child)
                    return None
                self._directory(child)
            parent, position = child, cut + 1
        self._directory(parent)
        return parent

    def add_objects(self, objects: Iterable[ObjectMeta]) -> None:
        root = self.root
        for meta in objects:
            if not meta.name.startswith(root):
                continue
            self.objects += 1
            parent = self._link_parents(meta.name)
            if parent is None:
                continue
            if parent == meta.name:  # a placeholder "a/b/": an entry of "a/" (the root's own is none)
                if parent == root:
                    continue
                parent = parent_prefix(parent)
            directory = self._dirs[parent]
            directory.objects.append(meta)
            nbytes = estimated_entry_bytes(meta)
            directory.nbytes += nbytes
            self.estimated_bytes += nbytes

    def add_folders(self, folders: Iterable[FolderMeta]) -> None:
        """Folders of a hierarchical-namespace bucket ("a/b/"): directories even
        when empty, whose times their parents' listings carry."""
        for folder in folders:
            prefix = folder.name
            if prefix.startswith(self.root) and prefix.endswith("/") and prefix != self.root:
                known = prefix in self._dirs
                if self._link_parents(prefix) is not None:
                    self._dirs[parent_prefix(prefix)].folders[prefix] = folder
                    if not known:
                        nbytes = estimated_directory_bytes(prefix)
                        self._dirs[prefix].nbytes += nbytes
                        self.estimated_bytes += nbytes

    def directories(self) -> list[str]:
        """Every directory prefix, shallow ones first (then by name)."""
        return sorted(self._dirs, key=lambda prefix: (prefix.count("/"), prefix))

    def listing(self, prefix: str, hidden: HiddenNames, *,
                is_symlink: Callable[[object], bool]) -> tuple[list[ListedEntry], list[tuple[str, str]]]:
        """The entries of directory ``prefix`` and the names newly hidden (to log)."""
        directory = self._dirs[prefix]
        folders = directory.folders
        return entries_from_listing(prefix, ((meta.name, meta) for meta in directory.objects),
                                    directory.prefixes, hidden, is_symlink=is_symlink,
                                    directory_record=lambda child, placeholder: directory_meta(
                                        child, folders.get(child), placeholder))

    def take(self, prefix: str, hidden: HiddenNames, *,
             is_symlink: Callable[[object], bool]) -> tuple[list[ListedEntry], list[tuple[str, str]]]:
        """:meth:`listing`, then forget the directory: once it is complete
        (every key below it listed) nothing more can arrive for it."""
        result = self.listing(prefix, hidden, is_symlink=is_symlink)
        self.estimated_bytes -= self._dirs.pop(prefix).nbytes
        return result

    def __iter__(self) -> Iterator[str]:
        return iter(self._dirs)
