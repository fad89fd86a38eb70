"""Ordered, seekable listing over a SQLite name index.

Listing must stay fast at 100k+ names, so nothing here scans a bucket from
the start: a ``NameScan`` reads rows in name order in small batches from a
start position, and ``seek`` jumps past a whole ``prefix + delimiter``
subtree with one indexed range query. Python ``str`` order (code points) is
the same as UTF-8 byte order, which is what SQLite's BINARY collation uses,
so "lexicographic" means the same thing on both sides.
"""

from __future__ import annotations

import base64
import heapq
import json
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Iterator, Sequence

MAX_PAGE_SIZE = 1000
SCAN_BATCH = 256
_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def successor(prefix: str) -> str | None:
    """The smallest string greater than every string that starts with ``prefix``.

    None if there is none (the prefix is all U+10FFFF) or the prefix is empty.
    """
    while prefix:
        last = ord(prefix[-1])
        if last < _MAX_CODE_POINT:
            bumped = last + 1
            if bumped in _SURROGATES:  # not encodable as UTF-8; skip the block
                bumped = _SURROGATES.stop
            return prefix[:-1] + chr(bumped)
        prefix = prefix[:-1]
    return None


def immediate_successor(name: str) -> str:
    """The smallest string greater than ``name`` itself."""
    return name + "\x00"


class NameScan:
    """Rows of one table in name order, read in batches, with seeking.

    ``fetch(start, end, limit)`` must return rows whose first column is the
    name, ``start <= name < end`` (``end`` None = unbounded), ordered by name.
    """

    def __init__(self, fetch: Callable[[str, str | None, int], Sequence[Sequence[Any]]],
                 start: str, end: str | None, batch: int = SCAN_BATCH):
        self._fetch = fetch
        self._batch = batch
        self._end = end
        self._next_start: str | None = start
        self._rows: list[Sequence[Any]] = []
        self._index = 0

    def peek(self) -> Sequence[Any] | None:
        if self._index >= len(self._rows):
            if self._next_start is None:
                return None
            self._rows = list(self._fetch(self._next_start, self._end, self._batch))
            self._index = 0
            if len(self._rows) < self._batch:
                self._next_start = None  # this batch reaches the end of the range
            else:
                self._next_start = immediate_successor(self._rows[-1][0])
            if not self._rows:
                return None
        return self._rows[self._index]

    def advance(self) -> None:
        self._index += 1

    def drain(self) -> Sequence[Sequence[Any]]:
        """Every buffered row not yet taken (reading a batch if none is),
        all taken at once; empty at the end of the range."""
        if self.peek() is None:
            return ()
        rows = self._rows[self._index:] if self._index else self._rows
        self._index = len(self._rows)
        return rows

    def seek(self, name: str | None) -> None:
        """Skip every row below ``name`` (None: skip everything)."""
        if name is None:
            self._rows, self._index, self._next_start = [], 0, None
            return
        # Rows already buffered may cover the jump (small subtrees): use them.
        while self._index < len(self._rows) and self._rows[self._index][0] < name:
            self._index += 1
        if self._index >= len(self._rows) and self._next_start is not None:
            self._next_start = max(self._next_start, name)


#: One listing result, ``(key, is_prefix, row)``: an object row, or a collapsed
#: prefix. A prefix entry may also carry the row of an object named exactly
#: like the prefix (``dir/`` with delimiter ``/``), for include_trailing_delimiter.
#: A plain tuple: the hot loops make many, and a tuple is several times cheaper
#: to make than a class instance.
Entry = tuple[str, bool, Sequence[Any] | None]


def entries(scan: NameScan, prefix: str, delimiter: str) -> Iterator[Entry]:
    """Objects and collapsed prefixes under ``prefix``, as ``Entry`` tuples, in name order."""
    if not delimiter:  # no prefix collapses: whole batches at a time
        while rows := scan.drain():
            for object_row in rows:
                name = object_row[0]
                if not name.startswith(prefix):
                    return
                yield name, False, object_row
        return
    while (row := scan.peek()) is not None:
        name = row[0]
        if not name.startswith(prefix):
            return
        if delimiter:
            cut = name.find(delimiter, len(prefix))
            if cut >= 0:
                collapsed = name[:cut + len(delimiter)]
                yield collapsed, True, (row if name == collapsed else None)
                scan.seek(successor(collapsed))
                continue
        yield name, False, row
        scan.advance()


def child_folder_prefixes(scan: NameScan, prefix: str) -> Iterator[Entry]:
    """Folders one level below ``prefix`` as prefix entries (folder names end in '/')."""
    for key, is_prefix, _ in entries(scan, prefix, "/"):
        if is_prefix:
            yield key, True, None


def merge_entries(*sources: Iterator[Entry]) -> Iterator[Entry]:
    """Merge sorted entry streams; a prefix seen in several streams appears once.

    On a tie the earlier stream wins, so pass the object stream first: its
    prefix entries may carry a trailing-delimiter object row.
    """
    last_prefix = None
    for entry in heapq.merge(*sources, key=itemgetter(0)):
        if entry[1]:
            if entry[0] == last_prefix:
                continue
            last_prefix = entry[0]
        yield entry


@dataclass
class Page:
    objects: list[Sequence[Any]]
    prefixes: list[str]
    next_page_token: str


def paginate(stream: Iterator[Entry], page_size: int, include_trailing_delimiter: bool) -> Page:
    """Take up to ``page_size`` results (objects + prefixes) from ``stream``.

    A prefix and its trailing-delimiter object travel together; a page may
    exceed a page_size of 1 by that one object rather than split them.
    """
    objects: list[Sequence[Any]] = []
    prefixes: list[str] = []
    taken = 0
    for key, is_prefix, row in stream:
        with_object = is_prefix and row is not None and include_trailing_delimiter
        if taken and taken + 1 + with_object > page_size:
            # The next page starts at this (untaken) entry.
            return Page(objects, prefixes, encode_page_token(key))
        if is_prefix:
            prefixes.append(key)
            taken += 1
            if with_object and row is not None:
                objects.append(row)
                taken += 1
        elif row is not None:  # an object entry always has its row
            objects.append(row)
            taken += 1
    return Page(objects, prefixes, "")


def clamp_page_size(page_size: int) -> int:
    if page_size < 0:
        raise ValueError(f"page_size must not be negative, got {page_size}")
    return MAX_PAGE_SIZE if page_size == 0 else min(page_size, MAX_PAGE_SIZE)


# Page tokens are opaque to clients: the first name the next page may return.

def encode_page_token(resume_at: str) -> str:
    raw = json.dumps({"v": 1, "at": resume_at}, ensure_ascii=False).encode()
    return base64.urlsafe_b64encode(raw).decode()


def decode_page_token(token: str) -> str:
    """The resume position in ``token``; raises ValueError if it is not ours."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        resume_at = data.get("at")
        if data.get("v") == 1 and isinstance(resume_at, str):
            return resume_at
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed page_token {token!r}") from exc
    raise ValueError(f"malformed page_token {token!r}")
