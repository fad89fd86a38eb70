"""The superblock (sans-I/O): names, inodes and the metadata cache."""

from rapidmount.superblock.inodes import ROOT_INODE, Inode, InodeTable
from rapidmount.superblock.metadata_cache import (
    ABSENT,
    DIR_MARKER,
    DirMarker,
    MetadataCache,
    MetadataStats,

)
from rapidmount.superblock.names import (
    MAX_NAME_BYTES,
    EntryKind,
    HiddenNames,
    ListedEntry,
    child_path,
    component_from_fuse,
    entries_from_listing,
    is_valid_component,
    parent_prefix,
    split_object_name,
)

__all__ = [
    "ROOT_INODE", "Inode", "InodeTable",
    "ABSENT", "DIR_MARKER", "DirMarker", "MetadataCache", "MetadataStats",
    "MAX_NAME_BYTES", "EntryKind", "HiddenNames", "ListedEntry", "child_path",
    "component_from_fuse", "entries_from_listing", "is_valid_component", "parent_prefix",
    "split_object_name",
]
