"""The emulator's object store: buckets, objects, generations, folders.

The one model of a bucket in rapidmount: the emulator's gRPC service and
the in-memory store behind the storage seam
(``rapidmount.emulator.memory_store.MemoryStore``) both run on it.

Pure Python, no gRPC. Metadata lives in SQLite (``:memory:``, or
``DIR/index.sqlite3``); bytes live in ``blobs`` (memory, or ``DIR/blobs/``).
Only the live generation of each object is kept (no versioning).

Rapid semantics modelled here:

* appendable objects are created unfinalized on zonal buckets, grow by
  appends at the persisted size, and are readable while they grow;
* a single writer: every takeover bumps the object's *writer epoch*; writes
  carrying an older epoch fail with FailedPrecondition (fencing);
* buckets with hierarchical namespace (zonal, hns) have real folders, and
  creating an object creates its parent folders.

Choices where the real service's behaviour is not documented (also in
docs/configuration.md, "Service behaviours the emulator models"; tests in
tests/emulator/test_service_quirks.py):

* a new generation written over an *unfinalized* object, without a
  precondition, replaces it, as any write replaces the live generation.
  The old generation is gone: its writer's next append fails with
  NOT_FOUND (the generation no longer exists, as after a delete; the
  official client does not retry NOT_FOUND, so the fenced writer fails
  loudly instead of writing into the new object), and opening it fails with
  NOT_FOUND. A read stream that opened it before keeps the bytes it pinned
  (reads of a generation finish even if it is replaced, as for finalized
  objects). ``if_generation_match=0`` refuses the write (FAILED_PRECONDITION);
* MoveObject moves unfinalized and append-written objects alike, keeping
  bytes and CRC32C (no MD5 is required: appended objects have none);
* a folder created implicitly by an object name stays when its last object
  is deleted (HNS folders are resources of their own); flat buckets have
  no folders, only common prefixes;
* a folder's ``update_time`` is set when it is made and when it is renamed
  (with those of the folders below it), never by changes to the objects
  inside it.

Every method is thread-safe (one re-entrant lock) and quick enough to call
from an event loop, except ``sync``, which may fsync.

``Store`` is assembled here from one part per concern: ``store_index`` (the
SQLite index, blobs, transactions, buckets), ``store_objects`` (reads,
delete, update, move), ``store_uploads`` (staged whole-object writes),
``store_appends`` (appendable objects), ``store_compose``,
``store_listing`` (ListObjects) and ``store_folders``; records, errors,
names and preconditions have modules of their own, re-exported here.
"""

from __future__ import annotations

from .store_appends import Appends, bytes_beyond
from .store_compose import Compose
from .store_errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    StoreError,
)
from .store_folders import Folders
from .store_listing import ObjectListings
from .store_names import (
    MAX_FOLDER_DEPTH,
    MAX_FOLDER_NAME_BYTES,
    MAX_OBJECT_NAME_BYTES,
    check_folder_limits,
    folder_name,
    parent_folder,
    parent_folders,
    validate_folder_name,
    validate_object_name,
)
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import (
    BUCKET_KINDS,
    REGION,
    ZONE,
    Bucket,
    FolderListing,
    FolderRecord,
    ObjectListing,
    ObjectRecord,
)

__all__ = [
    "Store",
    "BUCKET_KINDS", "ZONE", "REGION", "Bucket", "ObjectRecord", "FolderRecord", "ObjectListing",
    "FolderListing",
    "StoreError", "NotFound", "FailedPrecondition", "InvalidArgument", "OutOfRange", "AlreadyExists",
    "Preconditions", "NO_PRECONDITIONS",
    "MAX_OBJECT_NAME_BYTES", "MAX_FOLDER_NAME_BYTES", "MAX_FOLDER_DEPTH", "validate_object_name",
    "validate_folder_name", "folder_name", "parent_folders", "parent_folder", "check_folder_limits",
    "bytes_beyond",
]


class Store(Compose, Appends, ObjectListings, Folders):
    """Buckets, objects and folders; see the module docstring."""
