"""Metadata and directory-entry cache (stat, negative and listing entries).

Every FUSE lookup/getattr/readdir consults this before any RPC, so a warm
``ls -l`` of a large directory costs no round trip: :meth:`put_listing`
stores the listing *and* each entry's metadata.

Three kinds of entry share one LRU and one byte budget, each with its own
time to live (TTL):

* stat entries, keyed by path -- ``"a/b"`` holds an :class:`ObjectMeta`,
  ``"a/b/"`` a :class:`DirectoryMeta` (a directory, with its folder and
  placeholder) or :data:`DIR_MARKER` (a directory known only to exist);
  TTL ``ttl``;
* negative entries (:data:`ABSENT`), keyed the same way; TTL ``negative_ttl``;
* listings of a directory prefix; TTL ``listing_ttl``.

A listing answers for the names it holds for ``listing_ttl``, but its
silence -- a name it lacks -- is a negative answer, trusted only for
``negative_ttl`` from when the listing was made: after that, a name it
lacks is looked up in the bucket, so names another client creates appear
as fast after an ``ls`` as without one.

A TTL of -1 (any negative value) means forever and 0 means "do not cache",
as gcsfuse's ``--metadata-ttl``. Sizes are estimates (about 200 bytes plus
two per character), enough to bound memory without measuring objects.
Time comes from an injected clock so tests can drive expiry.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast

from rapidmount.storage.model import DirectoryMeta, ObjectMeta
from rapidmount.superblock.names import EntryKind, ListedEntry, parent_prefix

__all__ = [
    "ABSENT",
    "DIR_MARKER",
    "KERNEL_FOREVER",
    "DirMarker",
    "MetadataCache",
    "MetadataStats",
    "estimated_directory_bytes",
    "estimated_entry_bytes",
]

#: What the kernel is told for "forever" (ttl -1): a year, safely in range.
KERNEL_FOREVER = 365 * 24 * 3600.0

_ENTRY_BYTES = 200  # estimated fixed cost of one cached entry


class _Absent(enum.Enum):
    ABSENT = "ABSENT"

    def __repr__(self) -> str:
        return "ABSENT"


#: Cached negative answer: the path is known not to exist.
ABSENT = _Absent.ABSENT


class DirMarker:
    """Type of :data:`DIR_MARKER`, the cached "this directory exists"."""

    __slots__ = ()
    _instance: DirMarker | None = None

    def __new__(cls) -> DirMarker:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DIR_MARKER"


DIR_MARKER = DirMarker()


Cached: TypeAlias = "ObjectMeta | DirectoryMeta | DirMarker | Literal[_Absent.ABSENT]"


@dataclass
class MetadataStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_in_use: int = 0


class _Listing:
    """A cached listing; the by-name index is built on the first lookup only,
    so readdir-only use never pays for it."""

    __slots__ = ("entries", "_index", "silent_until")

    def __init__(self, entries: list[ListedEntry], silent_until: float) -> None:
        self.entries = entries
        self._index: dict[str, ListedEntry] | None = None
        #: until when a name missing from the listing is known not to exist
        self.silent_until = silent_until

    def find(self, name: str) -> ListedEntry | None:
        if self._index is None:
            self._index = {e.name: e for e in self.entries}
        return self._index.get(name)


def _meta_bytes(meta: ObjectMeta) -> int:
    if not meta.metadata:  # most objects: no custom metadata to count
        return _ENTRY_BYTES + 2 * len(meta.name)
    extra = sum(2 * (len(k) + len(v)) + 50 for k, v in meta.metadata.items())
    return _ENTRY_BYTES + 2 * len(meta.name) + extra


def _path_bytes(path: str) -> int:
    return _ENTRY_BYTES + 2 * len(path)


def _dir_bytes(prefix: str, record: object) -> int:
    """A directory's stat entry: its marker, and the placeholder it carries."""
    if isinstance(record, DirectoryMeta):
        placeholder = _meta_bytes(record.placeholder) if record.placeholder is not None else 0
        return _path_bytes(prefix) + placeholder + (_ENTRY_BYTES if record.folder is not None else 0)
    return _path_bytes(prefix)


def estimated_entry_bytes(meta: ObjectMeta) -> int:
    """Cache bytes a listed file costs: its stat entry and its listing entry."""
    return _meta_bytes(meta) + _path_bytes(meta.name)


def estimated_directory_bytes(prefix: str) -> int:
    """Cache bytes a listed directory costs: its marker, its listing and its
    entry in its parent's listing."""
    return 3 * _path_bytes(prefix)


class MetadataCache:
    """TTL + LRU cache of object metadata, negative answers and listings."""

    def __init__(
        self,
        *,
        ttl: float = 60.0,
        negative_ttl: float = 5.0,
        listing_ttl: float | None = None,
        budget_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.negative_ttl = negative_ttl
        self.listing_ttl = ttl if listing_ttl is None else listing_ttl
        #: a negative budget means unlimited
        self.budget_bytes = budget_bytes
        self._limit = float("inf") if budget_bytes < 0 else budget_bytes
        self._clock = clock
        self.stats = MetadataStats()
        # key -> (value, expires_at, estimated bytes). Stat keys are path
        # strings; listing keys are 1-tuples (prefix,), which never equal one.
        self._entries: OrderedDict[str | tuple[str], tuple[Cached | _Listing, float, int]] = OrderedDict()

    @property
    def bytes_in_use(self) -> int:
        return self.stats.bytes_in_use

    def __len__(self) -> int:
        return len(self._entries)

    # -- stat and negative entries -------------------------------------------

    def get(self, path: str) -> Cached | None:
        """Fresh cached answer for ``path`` ("a/b" file, "a/b/" directory):
        an :class:`ObjectMeta`, a :class:`DirectoryMeta` or :data:`DIR_MARKER`,
        :data:`ABSENT`, or None when unknown or expired."""
        return cast("Cached | None", self._fresh(path))  # a path's key holds a stat or negative entry

    def put_object(self, meta: ObjectMeta, *, listed_at: float | None = None) -> None:
        """Cache ``meta``; ``listed_at`` (this cache's clock) is when the
        server said so, if earlier than now: the TTL runs from then."""
        self._store(meta.name, meta, self.ttl, _meta_bytes(meta), listed_at)

    def put_dir(self, prefix: str, record: DirectoryMeta | None = None, *,
                listed_at: float | None = None) -> None:
        """Record that directory ``prefix`` ("a/b/") exists, with what the
        bucket holds of it (``record``), if that is known."""
        if not prefix.endswith("/"):
            raise ValueError(f"not a directory prefix: {prefix!r}")
        value = DIR_MARKER if record is None else record
        self._store(prefix, value, self.ttl, _dir_bytes(prefix, value), listed_at)

    def put_absent(self, path: str) -> None:
        """Record that ``path`` does not exist (for ``negative_ttl``)."""
        self._store(path, ABSENT, self.negative_ttl, _path_bytes(path))

    def invalidate(self, path: str) -> None:
        """Forget ``path`` and its parent's listing (its entry changed); for a
        directory also its own listing."""
        self._drop(path)
        self._drop((parent_prefix(path),))
        if path.endswith("/"):
            self._drop((path,))

    # -- listings -----------------------------------------------------------

    def put_listing(self, dir_prefix: str, entries: list[ListedEntry], *,
                    listed_at: float | None = None) -> None:
        """Cache a directory listing plus each entry's metadata (TTLs run
        from ``listed_at`` when given, as in :meth:`put_object`).

        Entries whose ``object`` is an :class:`ObjectMeta` are stored as stat
        entries and directories with their :class:`DirectoryMeta` (else
        :data:`DIR_MARKER`), so getattr after readdir needs no RPC. Stale stat entries the listing disproves are
        dropped: names a previously cached listing had and this one lacks
        (deleted), and a cached directory where the listing shows a file.
        """
        old = self._entries.get((dir_prefix,))
        if old is not None:
            present = {e.name for e in entries}
            for gone in cast(_Listing, old[0]).entries:
                if gone.name not in present:
                    self._drop(dir_prefix + gone.name)
                    self._drop(f"{dir_prefix}{gone.name}/")
        size = _path_bytes(dir_prefix)
        for entry in entries:
            size += _path_bytes(entry.name)
            if entry.kind is EntryKind.DIR:
                record = entry.object if isinstance(entry.object, DirectoryMeta) else None
                self.put_dir(f"{dir_prefix}{entry.name}/", record, listed_at=listed_at)
                continue
            # A file entry means no directory of that name (it would win).
            self._drop(f"{dir_prefix}{entry.name}/")
            if isinstance(entry.object, ObjectMeta):
                self.put_object(entry.object, listed_at=listed_at)
        # Stored last so that the entries above cannot evict it.
        listing = _Listing(list(entries), self._expiry(self.negative_ttl, listed_at))
        self._store((dir_prefix,), listing, self.listing_ttl, size, listed_at)

    @staticmethod
    def listing_bytes(dir_prefix: str, entries: list[ListedEntry]) -> int:
        """Bytes :meth:`put_listing` would add (at most) for this listing."""
        size = _path_bytes(dir_prefix)
        for entry in entries:
            size += _path_bytes(entry.name)
            if entry.kind is EntryKind.DIR:
                size += _dir_bytes(f"{dir_prefix}{entry.name}/", entry.object)
            elif isinstance(entry.object, ObjectMeta):
                size += _meta_bytes(entry.object)
        return size

    def room_for(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more fit in the budget without evicting anything."""
        return self.stats.bytes_in_use + nbytes <= self._limit

    def now(self) -> float:
        """This cache's clock (the time base of ``listed_at``)."""
        return self._clock()

    def get_listing(self, dir_prefix: str) -> list[ListedEntry] | None:
        """The fresh cached listing, or None. Shared, not copied: read-only."""
        listing = self._fresh_listing(dir_prefix)
        return None if listing is None else listing.entries

    def lookup_in_listing(
        self, dir_prefix: str, name: str
    ) -> ListedEntry | Literal[_Absent.ABSENT] | None:
        """With a fresh listing of ``dir_prefix``: the entry ``name``, or
        :data:`ABSENT` if the listing lacks it and is younger than
        ``negative_ttl``. None if there is no fresh listing, or its silence
        about ``name`` is too old to trust."""
        listing = self._fresh_listing(dir_prefix)
        if listing is None:
            return None
        entry = listing.find(name)
        if entry is not None:
            return entry
        return ABSENT if self._clock() < listing.silent_until else None

    def absent_for(self, dir_prefix: str, name: str) -> float:
        """Seconds from now that "``name`` is not in ``dir_prefix``" stays
        known, from the listing's silence or the cached negative answers of
        both the file and the directory: what the kernel may cache the
        answer for, so it never trusts it longer than this cache does."""
        now = self._clock()
        until = now
        item = self._entries.get((dir_prefix,))
        if item is not None and now < item[1]:
            listing = cast(_Listing, item[0])
            if listing.find(name) is None:
                until = max(until, min(listing.silent_until, item[1]))
        file_item = self._entries.get(dir_prefix + name)
        dir_item = self._entries.get(dir_prefix + name + "/")
        if file_item is not None and dir_item is not None and file_item[0] is ABSENT and dir_item[0] is ABSENT:
            until = max(until, min(file_item[1], dir_item[1]))
        return min(until - now, KERNEL_FOREVER)

    def invalidate_listing(self, dir_prefix: str) -> None:
        self._drop((dir_prefix,))

    def invalidate_below(self, dir_prefix: str) -> None:
        """Forget everything under directory ``dir_prefix`` ("a/b/"), its own
        entry and listing included: it was renamed, and what was known of its
        names must not show through a directory made there again. Scans the
        cache (about 40 ms for 100,000 entries): directory renames are rare."""
        if not dir_prefix.endswith("/"):
            raise ValueError(f"not a directory prefix: {dir_prefix!r}")
        doomed = [key for key in self._entries
                  if (key[0] if isinstance(key, tuple) else key).startswith(dir_prefix)]
        for key in doomed:
            self._drop(key)
        self.invalidate(dir_prefix)

    def clear(self) -> None:
        self._entries.clear()
        self.stats.bytes_in_use = 0

    # -- kernel timeouts ----------------------------------------------------

    def entry_timeout(self) -> float:
        """Seconds the kernel may keep a name -> inode entry."""
        return KERNEL_FOREVER if self.ttl < 0 else self.ttl

    def attr_timeout(self) -> float:
        """Seconds the kernel may keep attributes."""
        return self.entry_timeout()

    def negative_timeout(self) -> float:
        """Seconds the kernel may keep a "no such name" answer."""
        return KERNEL_FOREVER if self.negative_ttl < 0 else self.negative_ttl

    # -- internals ----------------------------------------------------------

    def _fresh_listing(self, dir_prefix: str) -> _Listing | None:
        return cast(_Listing | None, self._fresh((dir_prefix,)))  # a 1-tuple key holds a listing

    def _fresh(self, key: str | tuple[str]) -> Cached | _Listing | None:
        item = self._entries.get(key)
        if item is None:
            self.stats.misses += 1
            return None
        if self._clock() >= item[1]:
            self._drop(key)
            self.stats.misses += 1
            return None
        self._entries.move_to_end(key)
        self.stats.hits += 1
        return item[0]

    def _store(self, key: str | tuple[str], value: Cached | _Listing, ttl: float, nbytes: int,
               listed_at: float | None = None) -> None:
        """Insert or replace; the old value goes even when the new one is
        not kept (ttl 0, larger than the whole budget, or already expired)."""
        self._drop(key)
        if ttl == 0 or nbytes > self._limit:
            return
        now = self._clock()
        expires = self._expiry(ttl, listed_at)
        if expires <= now:
            return
        self._entries[key] = (value, expires, nbytes)
        stats = self.stats
        stats.bytes_in_use += nbytes
        while stats.bytes_in_use > self._limit:
            _, (_, _, freed) = self._entries.popitem(last=False)
            stats.bytes_in_use -= freed
            stats.evictions += 1

    def _expiry(self, ttl: float, listed_at: float | None = None) -> float:
        """When an answer given at ``listed_at`` (default: now) stops being
        trusted; ``ttl`` < 0 is never."""
        now = self._clock()
        return float("inf") if ttl < 0 else min(now, listed_at if listed_at is not None else now) + ttl

    def _drop(self, key: str | tuple[str]) -> None:
        item = self._entries.pop(key, None)
        if item is not None:
            self.stats.bytes_in_use -= item[2]
