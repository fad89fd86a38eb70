"""The object and bucket model both sides of the storage seam speak.

The filesystem core and every storage implementation (gRPC, in-memory)
import these types from here and from nowhere else.
"""

from __future__ import annotations

import calendar
import datetime
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

__all__ = ["BucketLayout", "DirectoryMeta", "FolderMeta", "ListPage", "ObjectMeta", "SYMLINK_METADATA_KEY",
           "MTIME_METADATA_KEY", "MODE_METADATA_KEY", "directory_meta", "format_mtime", "is_bucket_name",
           "parse_mtime"]

#: Custom metadata keys shared with gcsfuse, so one bucket looks the same through both.
SYMLINK_METADATA_KEY = "gcsfuse_symlink_target"
MTIME_METADATA_KEY = "gcsfuse_mtime"
#: rclone's key for a file's st_mode, in octal (e.g. "100755")
MODE_METADATA_KEY = "mode"

_EMPTY_METADATA: Mapping[str, str] = MappingProxyType({})
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\d)[Tt ](\d\d:\d\d:\d\d)(?:\.(\d+))?([Zz]|[+-]\d\d:\d\d)")


def is_bucket_name(name: str) -> bool:
    """Whether Cloud Storage accepts ``name`` as a bucket name (no dot-separated part is empty)."""
    return _BUCKET_NAME.fullmatch(name) is not None and ".." not in name


def format_mtime(mtime_ns: int) -> str:
    """An mtime as gcsfuse stores it: RFC 3339 in UTC, with nanoseconds."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(mtime_ns // 1_000_000_000))
    return f"{stamp}.{mtime_ns % 1_000_000_000:09d}Z"


def parse_mtime(value: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 stamp; None if it is not one."""
    match = _RFC3339.fullmatch(value.strip())
    if match is None:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(f"{match[1]}T{match[2]}")
    except ValueError:
        return None
    zone = match[4]
    offset = 0 if zone in ("Z", "z") else (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60) * (-1 if zone[0] == "+" else 1)
    seconds = calendar.timegm(parsed.timetuple()) + offset
    return seconds * 1_000_000_000 + int((match[3] or "").ljust(9, "0")[:9])


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What the mount needs of one GCS object. Immutable: it is shared."""

    name: str
    generation: int
    metageneration: int
    size: int
    mtime_ns: int
    ctime_ns: int
    finalized: bool
    crc32c: int | None = None
    #: custom metadata, frozen into a read-only mapping
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY_METADATA, hash=False)

    def __post_init__(self) -> None:
        if type(self.metadata) is not MappingProxyType:
            object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    def __reduce__(self) -> tuple[type[ObjectMeta], tuple[object, ...]]:
        # Crosses from a data-plane worker; a read-only mapping does not pickle.
        return ObjectMeta, (self.name, self.generation, self.metageneration, self.size, self.mtime_ns,
                            self.ctime_ns, self.finalized, self.crc32c, dict(self.metadata))

    @property
    def is_symlink(self) -> bool:
        return SYMLINK_METADATA_KEY in self.metadata

    @property
    def symlink_target(self) -> str | None:
        return self.metadata.get(SYMLINK_METADATA_KEY)

    @property
    def permissions(self) -> int | None:
        """The permission bits kept in metadata (``mode``), None if absent or not octal."""
        try:
            return int(self.metadata[MODE_METADATA_KEY], 8) & 0o7777
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class FolderMeta:
    """What the mount needs of one folder (buckets with hierarchical namespace)."""

    name: str  # "a/b/"
    metageneration: int
    create_time_ns: int
    #: the service sets it when the folder is made and when it is renamed, not
    #: when objects in it change
    update_time_ns: int


@dataclass(frozen=True, slots=True)
class DirectoryMeta:
    """What the bucket holds of the directory ``prefix`` ("a/b/"): its folder
    (buckets with folders) and its placeholder object ``a/b/``, each None when
    there is none (or none was seen). Folders carry no custom metadata, so a
    time set on a directory is kept in its placeholder's ``gcsfuse_mtime``."""

    prefix: str
    folder: FolderMeta | None = None
    placeholder: ObjectMeta | None = None

    @property
    def kept_mtime_ns(self) -> int | None:
        """The time set on the directory (``utime``), kept in its placeholder."""
        placeholder = self.placeholder
        if placeholder is None or MTIME_METADATA_KEY not in placeholder.metadata:
            return None
        return parse_mtime(placeholder.metadata[MTIME_METADATA_KEY])

    def times(self) -> tuple[int, int] | None:
        """(mtime, ctime) in nanoseconds. mtime: the time set on the directory,
        else its folder's update time, else its placeholder's update time;
        ctime: the folder's update time, else the placeholder's creation time.
        None when the bucket has neither (an implicit directory of a flat bucket)."""
        folder, placeholder = self.folder, self.placeholder
        if folder is not None:
            kept = self.kept_mtime_ns
            return (folder.update_time_ns if kept is None else kept), folder.update_time_ns
        if placeholder is not None:  # its mtime_ns is already the kept time, if one was set
            return placeholder.mtime_ns, placeholder.ctime_ns
        return None


def directory_meta(prefix: str, folder: FolderMeta | None, placeholder: object | None) -> DirectoryMeta | None:
    """The record of a listed directory ``prefix``: its folder and its
    placeholder's record (an :class:`ObjectMeta`); None if neither is known."""
    if folder is None and placeholder is None:
        return None
    return DirectoryMeta(prefix, folder, cast(ObjectMeta | None, placeholder))


def listed_meta(record: object) -> ObjectMeta:
    """The record of a listed entry: the mount's listings hold ObjectMeta,
    which the names layer (``superblock``) keeps opaque."""
    return cast(ObjectMeta, record)


@dataclass
class ListPage:
    objects: list[ObjectMeta]
    prefixes: list[str]
    next_page_token: str


@dataclass(frozen=True)
class BucketLayout:
    """What the mount knows of a bucket (GetStorageLayout), and what it can do.

    The core asks the capability properties below, never the raw location
    type or namespace flag, so a new kind of bucket changes one place.
    """

    name: str
    location: str
    location_type: str
    hierarchical_namespace: bool
    forced_type: str | None = None  # "zonal" or "regional" from --bucket-type

    @property
    def detected_zonal(self) -> bool:
        return self.location_type == "zone"

    @property
    def zonal(self) -> bool:
        if self.forced_type is not None:
            return self.forced_type == "zonal"
        return self.detected_zonal

    # -- capabilities -----------------------------------------------------------------------------

    @property
    def appendable_objects(self) -> bool:
        """Objects stay open for appends (BidiWriteObject), and can be taken over."""
        return self.zonal

    @property
    def bidi_reads(self) -> bool:
        """Ranges are read over one long-lived BidiReadObject stream per handle."""
        return self.zonal

    @property
    def folders(self) -> bool:
        """Directories are real folders (mkdir, rmdir, an atomic RenameFolder)."""
        return self.hierarchical_namespace

    @property
    def compose(self) -> bool:
        """ComposeObject works (zonal buckets refuse it)."""
        return not self.zonal

    def describe_type(self) -> str:
        """e.g. "zonal (detected)" or "regional (forced by --bucket-type; detected zonal)"."""
        kind = "zonal" if self.zonal else "regional"
        if self.forced_type is None:
            return f"{kind} (detected)"
        if not self.location_type:
            return f"{kind} (forced by --bucket-type; not detected)"
        return f"{kind} (forced by --bucket-type; detected {'zonal' if self.detected_zonal else 'regional'})"
