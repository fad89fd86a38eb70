"""GCS object names <-> POSIX names.

Object names are split on ``/`` into directories. A segment that cannot be a
POSIX file name (empty, ``.``, ``..``, containing NUL, longer than 255 bytes
of UTF-8) makes the object invisible: it is *hidden*, and the caller logs it
once. Because ``.``/``..``/empty segments are never produced, and a FUSE name
is never joined to a path without validation, no name can resolve to
anything outside its directory, let alone outside the mount.

Path conventions shared with the inode table and metadata cache: the root is
``""``, a directory is its prefix with a trailing slash (``"a/b/"``), a file
is its object name (``"a/b/c"``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "MAX_NAME_BYTES",
    "EntryKind",
    "ListedEntry",
    "HiddenNames",
    "REASON_EMPTY",
    "REASON_DOT",
    "REASON_NUL",
    "REASON_SLASH",
    "REASON_TOO_LONG",
    "REASON_NOT_UTF8",
    "REASON_SHADOWED",
    "REASON_OUTSIDE",
    "invalid_reason",
    "is_valid_component",
    "component_from_fuse",
    "child_path",
    "split_object_name",
    "parent_prefix",
    "entries_from_listing",
]

MAX_NAME_BYTES = 255

REASON_EMPTY = "empty name segment"
REASON_DOT = "'.' or '..' segment"
REASON_NUL = "NUL byte in name"
REASON_SLASH = "'/' in name"
REASON_TOO_LONG = f"name segment longer than {MAX_NAME_BYTES} bytes"
REASON_NOT_UTF8 = "name is not valid UTF-8"
REASON_SHADOWED = "shadowed by directory"
REASON_OUTSIDE = "not under the listed directory"


class EntryKind(enum.Enum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class ListedEntry:
    """One visible directory entry. Frozen because caches share it."""

    name: str
    kind: EntryKind
    #: the listing's object record for files and symlinks, the record the
    #: listing made of a directory (its placeholder, its folder; opaque here);
    #: None for a directory nothing is known of but its name
    object: object | None


def invalid_reason(name: str) -> str | None:
    """Why ``name`` cannot be a POSIX directory entry, or None if it can."""
    if not name:
        return REASON_EMPTY
    if name == "." or name == "..":
        return REASON_DOT
    if "\x00" in name:
        return REASON_NUL
    if "/" in name:
        return REASON_SLASH
    if name.isascii():
        nbytes = len(name)
    else:
        try:
            nbytes = len(name.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates
            return REASON_NOT_UTF8
    if nbytes > MAX_NAME_BYTES:
        return REASON_TOO_LONG
    return None


def is_valid_component(name: str) -> bool:
    """Whether ``name`` can be one POSIX path component."""
    return invalid_reason(name) is None


def component_from_fuse(raw: bytes) -> str | None:
    """Decode a name the kernel sent (strict UTF-8); None if it is not a valid
    component (the caller answers ENOENT or EINVAL)."""
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return name if is_valid_component(name) else None


def child_path(dir_prefix: str, name: str, is_dir: bool) -> str:
    """Path of ``name`` inside the directory ``dir_prefix`` ("" or "a/b/").

    Validates ``name``: this is the one place names become paths, so it is
    where escaping the directory is stopped.
    """
    if dir_prefix and not dir_prefix.endswith("/"):
        raise ValueError(f"not a directory prefix: {dir_prefix!r}")
    reason = invalid_reason(name)
    if reason is not None:
        raise ValueError(f"invalid name {name!r}: {reason}")
    return f"{dir_prefix}{name}/" if is_dir else dir_prefix + name


def split_object_name(name: str) -> list[str] | None:
    """Components of an object name, or None if any segment is invalid.

    A trailing ``/`` (a directory placeholder, ``"a/b/"``) is allowed and
    yields the directory's components; check ``name.endswith("/")`` to tell.
    """
    parts = name.split("/")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    for part in parts:
        if invalid_reason(part) is not None:
            return None
    return parts


def parent_prefix(path: str) -> str:
    """Prefix of the directory holding ``path`` ("a/b/c" and "a/b/c/" -> "a/b/").
    The root ("") is its own parent."""
    if path.endswith("/"):
        path = path[:-1]
    return path[: path.rfind("/") + 1]


class HiddenNames:
    """Hidden names already reported, so each is logged once per mount.

    Bounded: it remembers ``max_entries`` names, as 64-bit fingerprints (a
    few dozen bytes each, whatever the length of the name). Hidden names
    past that are not logged one by one; :meth:`take_overflow` tells the
    caller, once, to say so. Forgetting old names instead would log each
    name of a directory holding more hidden names than that again at every
    listing.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        if max_entries <= 0:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        self._seen: set[int] = set()
        self._overflow = 0  # 0: never full; 1: full, not told yet; 2: told

    def note(self, object_name: str, reason: str) -> bool:
        """Record a hidden name; True the first time (the caller logs it),
        False if it was logged already or the memory is full."""
        fingerprint = hash(object_name)
        if fingerprint in self._seen:
            return False
        if len(self._seen) >= self.max_entries:
            self._overflow = self._overflow or 1
            return False
        self._seen.add(fingerprint)
        return True

    def take_overflow(self) -> bool:
        """True once, after the first hidden name that went unlogged."""
        if self._overflow == 1:
            self._overflow = 2
            return True
        return False

    def messages(self, newly_hidden: Iterable[tuple[str, str]]) -> list[tuple[str, tuple[object, ...]]]:
        """The log lines (format, arguments) for the names a listing hid for
        the first time: an object, or a prefix ending in "/" that hides every
        object below it; then, once, the line saying the memory is full."""
        lines: list[tuple[str, tuple[object, ...]]] = [
            ("hiding %r and every object below it: %s" if name.endswith("/") else "hiding object %r: %s",
             (name, reason)) for name, reason in newly_hidden]
        if self.take_overflow():
            lines.append(("more than %d hidden names: the others are hidden without a log line",
                          (self.max_entries,)))
        return lines

    def __contains__(self, object_name: object) -> bool:
        return hash(object_name) in self._seen

    def __len__(self) -> int:
        return len(self._seen)


def _never(record: object) -> bool:
    return False


def _placeholder(prefix: str, record: object | None) -> object | None:
    return record


def entries_from_listing(
    dir_prefix: str,
    objects: Iterable[tuple[str, object]],
    prefixes: Iterable[str],
    hidden: HiddenNames,
    *,
    is_symlink: Callable[[object], bool] = _never,
    directory_record: Callable[[str, object | None], object | None] = _placeholder,
) -> tuple[list[ListedEntry], list[tuple[str, str]]]:
    """Map a ``delimiter="/"`` listing of ``dir_prefix`` to directory entries.

    Returns the visible entries, sorted by name and unique, and the
    ``(object name, reason)`` pairs hidden for the first time (to log).

    * The directory's own placeholder object (name == ``dir_prefix``) is skipped.
    * An object ``dir_prefix + "x/"`` (a placeholder) or deeper ``"x/..."``
      denotes directory ``x``; its entry's object is ``directory_record(prefix of x,
      the placeholder's record or None)``, by default the placeholder's record.
    * A directory shadows a file of the same name (mountpoint-s3 rule): the
      file is hidden as "shadowed by directory".
    * Invalid components are hidden with their reason.
    """
    skip = len(dir_prefix)
    dirs: dict[str, object | None] = {}  # name -> its placeholder's record
    files: dict[str, tuple[str, ListedEntry]] = {}
    newly_hidden: list[tuple[str, str]] = []

    def hide(object_name: str, reason: str) -> None:
        if hidden.note(object_name, reason):
            newly_hidden.append((object_name, reason))

    def component(full: str) -> tuple[str, bool] | None:
        """(first component below dir_prefix, whether more follows), or None."""
        if not full.startswith(dir_prefix):
            hide(full, REASON_OUTSIDE)
            return None
        rest = full[skip:]
        if not rest:
            return None  # the directory itself
        name, slash, _ = rest.partition("/")
        reason = invalid_reason(name)
        if reason is not None:
            hide(full, reason)
            return None
        return name, bool(slash)

    for object_name, record in objects:
        found = component(object_name)
        if found is None:
            continue
        name, is_dir = found
        if not is_dir:
            kind = EntryKind.SYMLINK if is_symlink(record) else EntryKind.FILE
            files[name] = (object_name, ListedEntry(name, kind, record))
        elif object_name == f"{dir_prefix}{name}/":
            dirs[name] = record  # placeholder
        elif name not in dirs:
            dirs[name] = None

    for prefix in prefixes:
        found = component(prefix)
        if found is not None and found[0] not in dirs:
            dirs[found[0]] = None

    entries = [ListedEntry(name, EntryKind.DIR, directory_record(f"{dir_prefix}{name}/", record))
               for name, record in dirs.items()]
    for name, (object_name, entry) in files.items():
        if name in dirs:
            hide(object_name, REASON_SHADOWED)
        else:
            entries.append(entry)
    entries.sort(key=lambda e: e.name)
    return entries, newly_hidden
