"""The local cache's index: entries, their bytes and their order of use. No I/O.

One entry per object name: the generation it holds, its size, the CRC32C of
its bytes, and the signature of its file when it was written (inode, mtime
and ctime, which any change to the file moves). Entries are kept least
recently used first; :meth:`Index.reserve` evicts from there to make room.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Entry", "EntryKey", "Index", "IndexFormatError", "Signature", "INDEX_VERSION"]

INDEX_VERSION = 1

#: (st_ino, st_mtime_ns, st_ctime_ns) of an entry's file as it was written
Signature = tuple[int, int, int]


class IndexFormatError(ValueError):
    """The index file is not one this version wrote."""


@dataclass(frozen=True, slots=True)
class EntryKey:
    bucket: str
    name: str
    generation: int

    @property
    def file_name(self) -> str:
        """The entry's file in the cache directory: no object name appears there."""
        digest = hashlib.sha256(f"{self.bucket}\0{self.name}\0{self.generation}".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()


@dataclass(slots=True)
class Entry:
    key: EntryKey
    size: int
    crc32c: int
    signature: Signature
    #: its file was checked (or written) by this daemon: it may be served
    verified: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"bucket": self.key.bucket, "name": self.key.name, "generation": self.key.generation,
                "size": self.size, "crc32c": self.crc32c, "signature": list(self.signature)}

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> Entry:
        try:
            key = EntryKey(str(item["bucket"]), str(item["name"]), int(item["generation"]))
            ino, mtime, ctime = (int(v) for v in item["signature"])
            size, crc = int(item["size"]), int(item["crc32c"])
        except (KeyError, TypeError, ValueError) as err:
            raise IndexFormatError(f"a malformed entry: {err}") from None
        if size < 0 or not 0 <= crc < 1 << 32:
            raise IndexFormatError("an entry's size or checksum is out of range")
        return cls(key, size, crc, (ino, mtime, ctime))


class Index:
    """Entries by (bucket, name), least recently used first, within ``budget`` bytes.

    Bytes being filled are reserved first, so entries and fills together
    stay within the budget.
    """

    def __init__(self, budget: int) -> None:
        if budget <= 0:
            raise ValueError("the cache's budget must be positive")
        self.budget = budget
        self._entries: OrderedDict[tuple[str, str], Entry] = OrderedDict()
        self.used = 0  # bytes of entries
        self.reserved = 0  # bytes of fills under way

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._entries.values()))

    def get(self, bucket: str, name: str) -> Entry | None:
        return self._entries.get((bucket, name))

    def touch(self, entry: Entry) -> None:
        """A hit: the entry is now the most recently used."""
        slot = (entry.key.bucket, entry.key.name)
        if self._entries.get(slot) is entry:
            self._entries.move_to_end(slot)

    def reserve(self, size: int) -> list[Entry] | None:
        """Room for a fill of ``size`` bytes: the entries evicted for it (the
        caller deletes their files), or None if it can never fit."""
        if size > self.budget:
            return None
        evicted: list[Entry] = []
        while self.used + self.reserved + size > self.budget and self._entries:
            _, entry = self._entries.popitem(last=False)
            self.used -= entry.size
            evicted.append(entry)
        if self.used + self.reserved + size > self.budget:
            for entry in reversed(evicted):  # fills under way hold the rest: wait for a later open
                self._insert(entry, front=True)
            return None
        self.reserved += size
        return evicted

    def over_budget(self) -> list[Entry]:
        """The least recently used entries removed while the entries exceed the budget."""
        evicted: list[Entry] = []
        while self.used + self.reserved > self.budget and self._entries:
            _, entry = self._entries.popitem(last=False)
            self.used -= entry.size
            evicted.append(entry)
        return evicted

    def release(self, size: int) -> None:
        """A fill ended without an entry: its reservation is free again."""
        self.reserved -= size
        assert self.reserved >= 0

    def add(self, entry: Entry, *, reserved: int = 0) -> Entry | None:
        """An entry, most recently used (from a fill's reservation of
        ``reserved`` bytes); the entry it replaces, if any."""
        self.reserved -= reserved
        old = self.remove(entry.key.bucket, entry.key.name)
        self._insert(entry)
        return old

    def remove(self, bucket: str, name: str) -> Entry | None:
        entry = self._entries.pop((bucket, name), None)
        if entry is not None:
            self.used -= entry.size
        return entry

    def _insert(self, entry: Entry, *, front: bool = False) -> None:
        slot = (entry.key.bucket, entry.key.name)
        self._entries[slot] = entry
        self.used += entry.size
        if front:
            self._entries.move_to_end(slot, last=False)

    def to_json(self) -> dict[str, Any]:
        return {"version": INDEX_VERSION, "entries": [e.to_json() for e in self._entries.values()]}

    def load(self, document: Any) -> None:
        """Entries from :meth:`to_json`'s document, in their order of use."""
        if not isinstance(document, dict) or document.get("version") != INDEX_VERSION:
            raise IndexFormatError("not an index of this version")
        items = document.get("entries")
        if not isinstance(items, list):
            raise IndexFormatError("no list of entries")
        for item in items:
            if not isinstance(item, dict):
                raise IndexFormatError("an entry is not an object")
            self.add(Entry.from_json(item))


def describe(entry: Entry) -> str:
    return f"{entry.key.name}#{entry.key.generation} ({entry.size} bytes)"

