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
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Generic, Iterable, Iterator, Mapping, Sequence, TypeVar

import google_crc32c

from rapidmount.storage.model import is_bucket_name
from rapidmount.storage.seam import COMPOSE_MAX_SOURCES

from . import listing
from .resources import object_bytes
from .blobs import BlobReader, FileBlobs, MemoryBlobs

logger = logging.getLogger("rapidmount.emulator.store")

BUCKET_KINDS = ("zonal", "hns", "flat")
ZONE = "us-central1-a"
REGION = "us-central1"

MAX_OBJECT_NAME_BYTES = 1024
MAX_FOLDER_NAME_BYTES = 512
MAX_FOLDER_DEPTH = 50


# ---------------------------------------------------------------- errors

class StoreError(Exception):
    """A request the store refuses; ``code`` names the gRPC status."""

    code = "INTERNAL"


class NotFound(StoreError):
    code = "NOT_FOUND"


class FailedPrecondition(StoreError):
    code = "FAILED_PRECONDITION"


class InvalidArgument(StoreError):
    code = "INVALID_ARGUMENT"


class OutOfRange(StoreError):
    code = "OUT_OF_RANGE"


class AlreadyExists(StoreError):
    code = "ALREADY_EXISTS"


# ---------------------------------------------------------------- records

@dataclass(frozen=True)
class Bucket:
    name: str
    kind: str
    create_time: float

    @property
    def zonal(self) -> bool:
        return self.kind == "zonal"

    @property
    def hierarchical(self) -> bool:
        return self.kind in ("zonal", "hns")

    @property
    def location_type(self) -> str:
        return "zone" if self.zonal else "region"

    @property
    def storage_class(self) -> str:
        return "RAPID" if self.zonal else "STANDARD"


@dataclass(frozen=True)
class ObjectRecord:
    bucket: str
    name: str
    generation: int
    metageneration: int
    size: int
    crc32c: int
    md5: bytes | None
    finalized: bool
    create_time: float
    update_time: float
    finalize_time: float | None
    content_type: str
    storage_class: str
    component_count: int
    metadata: Mapping[str, str]
    writer_epoch: int
    blob_id: int


@dataclass(frozen=True)
class FolderRecord:
    bucket: str
    name: str
    metageneration: int
    create_time: float
    update_time: float


@dataclass(frozen=True)
class Preconditions:
    """GCS generation/metageneration conditions; None means "not set"."""

    if_generation_match: int | None = None
    if_generation_not_match: int | None = None
    if_metageneration_match: int | None = None
    if_metageneration_not_match: int | None = None

    def check(self, record: ObjectRecord | None) -> None:
        generation = record.generation if record else 0
        if self.if_generation_match is not None and generation != self.if_generation_match:
            raise FailedPrecondition(
                f"if_generation_match={self.if_generation_match} but the live generation is "
                f"{generation or 'absent'}")
        if self.if_generation_not_match is not None and generation == self.if_generation_not_match:
            raise FailedPrecondition(f"if_generation_not_match={self.if_generation_not_match} matched")
        metageneration = record.metageneration if record else None
        if self.if_metageneration_match is not None and metageneration != self.if_metageneration_match:
            raise FailedPrecondition(
                f"if_metageneration_match={self.if_metageneration_match} but the metageneration is "
                f"{metageneration if metageneration is not None else 'absent'}")
        if self.if_metageneration_not_match is not None and (
                metageneration is None or metageneration == self.if_metageneration_not_match):
            raise FailedPrecondition(
                f"if_metageneration_not_match={self.if_metageneration_not_match} failed")


NO_PRECONDITIONS = Preconditions()


_Listed = TypeVar("_Listed")


@dataclass
class ObjectListing(Generic[_Listed]):
    objects: list[_Listed]  # records, or their serialized resources
    prefixes: list[str]
    next_page_token: str


@dataclass
class FolderListing:
    folders: list[FolderRecord]
    next_page_token: str


@dataclass
class _Txn:
    """Actions that must run only once the transaction's outcome is known."""

    on_commit: list[Callable[[], None]] = field(default_factory=list)
    on_rollback: list[Callable[[], None]] = field(default_factory=list)


# ---------------------------------------------------------------- names

def validate_object_name(name: str) -> None:
    if not name:
        raise InvalidArgument("object name must not be empty")
    encoded = _utf8(name, "object name")
    if len(encoded) > MAX_OBJECT_NAME_BYTES:
        raise InvalidArgument(f"object name is {len(encoded)} bytes; the limit is {MAX_OBJECT_NAME_BYTES}")
    if "\r" in name or "\n" in name:
        raise InvalidArgument("object names must not contain carriage returns or line feeds")
    if name in (".", ".."):
        raise InvalidArgument(f"object name {name!r} is not allowed")


def validate_folder_name(name: str) -> None:
    if not name or not name.endswith("/"):
        raise InvalidArgument(f"folder name {name!r} must be non-empty and end with '/'")
    encoded = _utf8(name, "folder name")
    if len(encoded) > MAX_FOLDER_NAME_BYTES:
        raise InvalidArgument(f"folder name is {len(encoded)} bytes; the limit is {MAX_FOLDER_NAME_BYTES}")
    if name.count("/") > MAX_FOLDER_DEPTH:
        raise InvalidArgument(f"folder {name!r} is deeper than {MAX_FOLDER_DEPTH} levels")
    if "\r" in name or "\n" in name:
        raise InvalidArgument("folder names must not contain carriage returns or line feeds")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid UTF-8") from exc


def folder_name(folder_id: str, what: str = "folder id") -> str:
    """The folder a folder id names: ids may leave out the trailing '/'."""
    if not folder_id:
        raise InvalidArgument(f"{what} is required")
    return folder_id if folder_id.endswith("/") else folder_id + "/"


def parent_folders(object_name: str) -> list[str]:
    """Folders an object lives under: every prefix ending in '/' (``a/`` for ``a/``)."""
    return [object_name[:i + 1] for i, char in enumerate(object_name) if char == "/"]


def parent_folder(folder: str) -> str:
    """The folder containing ``folder`` ('' is the bucket root)."""
    cut = folder[:-1].rfind("/")
    return folder[:cut + 1]


def bytes_beyond(offset: int, persisted: int, data: bytes) -> bytes:
    """The part of ``data``, written at ``offset``, that lies beyond ``persisted``.

    Bytes below the persisted size are skipped unchecked (as the Storage v2
    WriteObject contract says); an offset beyond it would leave a gap.
    """
    if offset > persisted:
        raise OutOfRange(f"write_offset {offset} is beyond the persisted size {persisted}")
    overlap = persisted - offset
    if overlap >= len(data):
        return b""
    return data[overlap:] if overlap else data


def check_folder_limits(object_name: str) -> None:
    if object_name.count("/") > MAX_FOLDER_DEPTH:
        raise InvalidArgument(
            f"object name has more than {MAX_FOLDER_DEPTH} '/' (the folder depth limit)")
    folders = parent_folders(object_name)
    if folders and len(folders[-1].encode()) > MAX_FOLDER_NAME_BYTES:
        raise InvalidArgument(
            f"object name implies a folder longer than {MAX_FOLDER_NAME_BYTES} bytes")


# ---------------------------------------------------------------- the store

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS buckets (
    name TEXT PRIMARY KEY, kind TEXT NOT NULL, create_time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS objects (
    bucket TEXT NOT NULL, name TEXT NOT NULL,
    generation INTEGER NOT NULL, metageneration INTEGER NOT NULL,
    size INTEGER NOT NULL, crc32c INTEGER NOT NULL, md5 BLOB,
    finalized INTEGER NOT NULL,
    create_time REAL NOT NULL, update_time REAL NOT NULL, finalize_time REAL,
    content_type TEXT NOT NULL, storage_class TEXT NOT NULL,
    component_count INTEGER NOT NULL, metadata TEXT NOT NULL,
    writer_epoch INTEGER NOT NULL, blob_id INTEGER NOT NULL,
    resource BLOB,
    PRIMARY KEY (bucket, name)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS folders (
    bucket TEXT NOT NULL, name TEXT NOT NULL, metageneration INTEGER NOT NULL,
    create_time REAL NOT NULL, update_time REAL NOT NULL,
    PRIMARY KEY (bucket, name)) WITHOUT ROWID;
"""

_OBJECT_COLUMNS = ("name, generation, metageneration, size, crc32c, md5, finalized, create_time, "
                   "update_time, finalize_time, content_type, storage_class, component_count, "
                   "metadata, writer_epoch, blob_id")
_FOLDER_COLUMNS = "name, metageneration, create_time, update_time"


class Store:
    """Buckets, objects and folders; see the module docstring."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self._lock = threading.RLock()
        if self.data_dir is None:
            self._db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            self.blobs: MemoryBlobs | FileBlobs = MemoryBlobs()
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.data_dir / "index.sqlite3", check_same_thread=False,
                                       isolation_level=None)
            # WAL + NORMAL: commits are cheap; `sync` checkpoints when a flush
            # must be durable, and start-up reconciles sizes from blob files.
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self.blobs = FileBlobs(self.data_dir / "blobs")
        self._db.executescript(_SCHEMA)
        self._add_resource_column()
        self._buckets = {row[0]: Bucket(*row) for row in
                         self._db.execute("SELECT name, kind, create_time FROM buckets")}
        row = self._db.execute("SELECT value FROM meta WHERE key = 'last_generation'").fetchone()
        self._last_generation = row[0] if row else 0
        if self.data_dir is not None:
            self._reconcile()

    def _add_resource_column(self) -> None:
        """Indexes written before rows carried their serialized resource get it now."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(objects)")}
        if "resource" not in columns:
            self._db.execute("ALTER TABLE objects ADD COLUMN resource BLOB")
        missing = self._db.execute(
            f"SELECT bucket, {_OBJECT_COLUMNS} FROM objects WHERE resource IS NULL").fetchall()
        if missing:
            with self._transaction():
                for row in missing:
                    self._store_resource(self._row_to_object(row[0], row[1:]))

    def close(self) -> None:
        with self._lock:
            self.blobs.close()
            self._db.close()

    # ------------------------------------------------------------ plumbing

    @contextmanager
    def _transaction(self) -> Iterator[_Txn]:
        with self._lock:
            txn = _Txn()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield txn
            except BaseException:
                self._db.execute("ROLLBACK")
                for action in txn.on_rollback:
                    _quietly(action)
                raise
            self._db.execute("COMMIT")
            for action in txn.on_commit:
                _quietly(action)

    def _next_generation(self) -> int:
        # Caller holds the lock (inside a transaction). Microsecond clock like
        # GCS, forced monotonic; unique across buckets, so it doubles as blob id.
        generation = max(time.time_ns() // 1000, self._last_generation + 1)
        self._last_generation = generation
        self._db.execute("INSERT INTO meta (key, value) VALUES ('last_generation', ?) "
                         "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (generation,))
        return generation

    def _bucket(self, name: str) -> Bucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            raise NotFound(f"bucket {name!r} does not exist")
        return bucket

    def _row_to_object(self, bucket: str, row: Sequence) -> ObjectRecord:
        (name, generation, metageneration, size, crc, md5, finalized, create_time, update_time,
         finalize_time, content_type, storage_class, component_count, metadata, epoch, blob_id) = row
        return ObjectRecord(bucket, name, generation, metageneration, size, crc, md5, bool(finalized),
                            create_time, update_time, finalize_time, content_type, storage_class,
                            component_count, {} if metadata == "{}" else json.loads(metadata), epoch, blob_id)

    def _live(self, bucket: str, name: str) -> ObjectRecord | None:
        row = self._db.execute(f"SELECT {_OBJECT_COLUMNS} FROM objects WHERE bucket = ? AND name = ?",
                               (bucket, name)).fetchone()
        return self._row_to_object(bucket, row) if row else None

    def _write_object(self, record: ObjectRecord) -> None:
        """Insert or replace the row of ``record``, with its serialized resource."""
        self._db.execute(
            f"INSERT OR REPLACE INTO objects (bucket, {_OBJECT_COLUMNS}, resource) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (record.bucket, record.name, record.generation, record.metageneration, record.size,
             record.crc32c, record.md5, int(record.finalized), record.create_time,
             record.update_time, record.finalize_time, record.content_type, record.storage_class,
             record.component_count, json.dumps(dict(record.metadata), sort_keys=True) if record.metadata else "{}",
             record.writer_epoch, record.blob_id, object_bytes(record)))

    def _store_resource(self, record: ObjectRecord) -> None:
        """Refresh the cached resource of a row changed by a partial UPDATE."""
        self._db.execute("UPDATE objects SET resource = ? WHERE bucket = ? AND name = ?",
                         (object_bytes(record), record.bucket, record.name))

    def _ensure_parent_folders(self, bucket: Bucket, object_name: str, now: float) -> None:
        if bucket.hierarchical:
            self._db.executemany(
                "INSERT OR IGNORE INTO folders (bucket, name, metageneration, create_time, update_time) "
                "VALUES (?, ?, 1, ?, ?)",
                [(bucket.name, folder, now, now) for folder in parent_folders(object_name)])

    def _place_object(self, txn: _Txn, bucket: Bucket, record: ObjectRecord,
                      replaced: ObjectRecord | None) -> None:
        """Insert ``record`` as the live generation, dropping ``replaced``'s bytes after commit."""
        self._ensure_parent_folders(bucket, record.name, record.create_time)
        self._write_object(record)
        if replaced is not None and replaced.blob_id != record.blob_id:
            txn.on_commit.append(lambda: self.blobs.delete(replaced.blob_id))

    def _new_blob(self, txn: _Txn, pieces: Iterable[bytes] = ()) -> int:
        blob_id = self._next_generation()
        self.blobs.create(blob_id, pieces)
        txn.on_rollback.append(lambda: self.blobs.delete(blob_id))
        return blob_id

    def _reconcile(self) -> None:
        """After a restart: blob files are the truth for unfinalized sizes
        (each append reaches the file before the index), and blobs no row
        refers to (interrupted uploads) are removed."""
        with self._transaction():
            rows = self._db.execute(
                "SELECT bucket, name, size, blob_id, finalized FROM objects").fetchall()
            referenced = set()
            present = self.blobs.ids()
            for bucket, name, size, blob_id, finalized in rows:
                referenced.add(blob_id)
                if blob_id not in present and not finalized:
                    self.blobs.create(blob_id)
                try:
                    actual = self.blobs.size(blob_id)
                except FileNotFoundError:
                    logger.warning("object %s/%s lost its data file", bucket, name)
                    continue
                if not finalized and actual != size:
                    crc = _crc32c_of(self.blobs, blob_id, actual)
                    self._db.execute("UPDATE objects SET size = ?, crc32c = ? WHERE bucket = ? AND name = ?",
                                     (actual, crc, bucket, name))
                    changed = self._live(bucket, name)
                    if changed is not None:
                        self._store_resource(changed)
            for orphan in present - referenced:
                self.blobs.delete(orphan)

    # ------------------------------------------------------------ buckets

    def create_bucket(self, name: str, kind: str = "zonal") -> Bucket:
        """Create a bucket; an existing bucket of the same kind is returned as is."""
        if kind not in BUCKET_KINDS:
            raise InvalidArgument(f"bucket kind must be one of {', '.join(BUCKET_KINDS)}, not {kind!r}")
        if not is_bucket_name(name):
            raise InvalidArgument(f"invalid bucket name {name!r}")
        with self._transaction():
            existing = self._buckets.get(name)
            if existing is not None:
                if existing.kind != kind:
                    raise AlreadyExists(f"bucket {name!r} exists and is {existing.kind}, not {kind}")
                return existing
            bucket = Bucket(name, kind, time.time())
            self._db.execute("INSERT INTO buckets (name, kind, create_time) VALUES (?, ?, ?)",
                             (bucket.name, bucket.kind, bucket.create_time))
            self._buckets[name] = bucket
            return bucket

    def get_bucket(self, name: str) -> Bucket:
        with self._lock:
            return self._bucket(name)

    # ------------------------------------------------------------ reading

    def get_object(self, bucket: str, name: str, generation: int = 0,
                   preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        return self.get_object_resource(bucket, name, generation, preconditions)[0]

    def get_object_resource(self, bucket: str, name: str, generation: int = 0,
                            preconditions: Preconditions = NO_PRECONDITIONS) -> tuple[ObjectRecord, bytes]:
        """The live object and its serialized ``Object`` resource."""
        with self._lock:
            self._bucket(bucket)
            row = self._db.execute(f"SELECT {_OBJECT_COLUMNS}, resource FROM objects "
                                   "WHERE bucket = ? AND name = ?", (bucket, name)).fetchone()
            record = self._row_to_object(bucket, row[:-1]) if row else None
            if record is None or (generation and record.generation != generation):
                what = f"generation {generation} of " if generation else ""
                raise NotFound(f"{what}object {name!r} does not exist in bucket {bucket!r}")
            preconditions.check(record)
            return record, row[-1]

    def find_object(self, bucket: str, name: str) -> ObjectRecord | None:
        with self._lock:
            self._bucket(bucket)
            return self._live(bucket, name)

    def open_reader(self, bucket: str, name: str, generation: int = 0,
                    preconditions: Preconditions = NO_PRECONDITIONS) -> tuple[ObjectRecord, BlobReader]:
        """The object plus a reader of its bytes that outlives deletes and overwrites."""
        record, _, reader = self.open_reader_resource(bucket, name, generation, preconditions)
        return record, reader

    def open_reader_resource(self, bucket: str, name: str, generation: int = 0,
                             preconditions: Preconditions = NO_PRECONDITIONS
                             ) -> tuple[ObjectRecord, bytes, BlobReader]:
        """``open_reader`` plus the object's serialized resource."""
        with self._lock:
            record, resource = self.get_object_resource(bucket, name, generation, preconditions)
            return record, resource, self.blobs.open_reader(record.blob_id)

    def read_all(self, bucket: str, name: str) -> bytes:
        with self._lock:
            record = self.get_object(bucket, name)
            return self.blobs.read(record.blob_id, 0, record.size)

    # ------------------------------------------------------------ appendable objects

    def create_appendable(self, bucket: str, name: str,
                          preconditions: Preconditions = NO_PRECONDITIONS, *,
                          metadata: Mapping[str, str] | None = None, content_type: str = "",
                          storage_class: str = "") -> ObjectRecord:
        """A new, empty, unfinalized generation (replacing any live one); writer epoch 1."""
        validate_object_name(name)
        with self._transaction() as txn:
            target = self._bucket(bucket)
            if not target.zonal:
                raise FailedPrecondition(
                    f"bucket {bucket!r} is not a zonal bucket; appendable objects need a zonal (Rapid) bucket")
            check_folder_limits(name)
            replaced = self._live(bucket, name)
            preconditions.check(replaced)
            blob_id = self._new_blob(txn)
            now = time.time()
            record = ObjectRecord(bucket, name, blob_id, 1, 0, 0, None, False, now, now, None,
                                  content_type, storage_class or target.storage_class, 0,
                                  dict(metadata or {}), 1, blob_id)
            self._place_object(txn, target, record, replaced)
            return record

    def open_appendable(self, bucket: str, name: str, generation: int, *,
                        writer_epoch: int | None = None,
                        preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        """Attach a writer to an unfinalized generation.

        Without ``writer_epoch`` this is a takeover: preconditions are checked
        and the epoch is bumped, fencing the previous writer. With the epoch
        from a write handle it is a resume by the current writer; an older
        epoch is stale.
        """
        with self._transaction():
            record = self._appendable(bucket, name, generation)
            if writer_epoch is None:
                preconditions.check(record)
                record = replace(record, writer_epoch=record.writer_epoch + 1)
                self._db.execute("UPDATE objects SET writer_epoch = ? WHERE bucket = ? AND name = ?",
                                 (record.writer_epoch, bucket, name))
            elif writer_epoch != record.writer_epoch:
                raise FailedPrecondition(
                    "stale write handle: a different writer has become the exclusive writer of this object")
            return record

    def _appendable(self, bucket: str, name: str, generation: int) -> ObjectRecord:
        self._bucket(bucket)
        record = self._live(bucket, name)
        if record is None or record.generation != generation:
            raise NotFound(f"generation {generation} of object {name!r} does not exist in bucket {bucket!r}")
        if record.finalized:
            raise FailedPrecondition(f"object {name!r} is finalized; it can no longer be appended to")
        return record

    def _writer(self, bucket: str, name: str, generation: int, writer_epoch: int) -> ObjectRecord:
        record = self._appendable(bucket, name, generation)
        if record.writer_epoch != writer_epoch:
            raise FailedPrecondition(
                "a different writer has become the exclusive writer of this object (takeover)")
        return record

    def writer_state(self, bucket: str, name: str, generation: int, writer_epoch: int) -> ObjectRecord:
        """The object as seen by its writer; fails if that writer was fenced."""
        with self._lock:
            return self._writer(bucket, name, generation, writer_epoch)

    def append(self, bucket: str, name: str, generation: int, writer_epoch: int,
               offset: int, data: bytes, crc32c: int | None = None) -> ObjectRecord:
        """Persist ``data`` written at ``offset``; bytes below the persisted size are skipped.
        ``crc32c``: the already verified checksum of ``data``, if known."""
        with self._transaction():
            record = self._writer(bucket, name, generation, writer_epoch)
            given = len(data)
            data = bytes_beyond(offset, record.size, data)
            if not data:
                return record
            self.blobs.append(record.blob_id, data, crc32c if len(data) == given else None)
            record = replace(record, size=record.size + len(data),
                             crc32c=google_crc32c.extend(record.crc32c, data), update_time=time.time())
            self._db.execute("UPDATE objects SET size = ?, crc32c = ?, update_time = ?, resource = ? "
                             "WHERE bucket = ? AND name = ?",
                             (record.size, record.crc32c, record.update_time, object_bytes(record),
                              bucket, name))
            return record

    def sync(self, record: ObjectRecord) -> None:
        """Make the object's bytes (and the index) durable: a flush. May block on fsync."""
        if not self.blobs.durable:
            return
        self.blobs.sync(record.blob_id)
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def finalize(self, bucket: str, name: str, generation: int, writer_epoch: int, *,
                 expected_crc32c: int | None = None, expected_md5: bytes | None = None) -> ObjectRecord:
        """Seal the object. Slow parts (MD5, fsync) run outside the lock: only
        this writer can grow the object, so its first ``size`` bytes are fixed."""
        record = self.writer_state(bucket, name, generation, writer_epoch)
        if expected_crc32c is not None and expected_crc32c != record.crc32c:
            raise InvalidArgument(
                f"object_checksums.crc32c {expected_crc32c} does not match the crc32c of the "
                f"{record.size} bytes persisted ({record.crc32c})")
        md5 = None
        if expected_md5:
            md5 = _md5_of(self.blobs, record.blob_id, record.size)
            if md5 != expected_md5:
                raise InvalidArgument("object_checksums.md5_hash does not match the data persisted")
        self.blobs.sync(record.blob_id)
        with self._transaction() as txn:
            if self._writer(bucket, name, generation, writer_epoch).size != record.size:
                raise FailedPrecondition("the object grew while it was being finalized")
            now = time.time()
            record = replace(record, finalized=True, finalize_time=now, update_time=now, md5=md5)
            self._write_object(record)
            txn.on_commit.append(lambda: self.blobs.release(record.blob_id))
            return record

    # ------------------------------------------------------------ whole-object uploads

    def begin_upload(self) -> int:
        """A staging blob for a one-shot upload; invisible until ``commit_upload``."""
        with self._transaction() as txn:
            blob_id = self._new_blob(txn)
        return blob_id

    def upload_append(self, blob_id: int, data: bytes) -> None:
        self.blobs.append(blob_id, data)

    def abort_upload(self, blob_id: int) -> None:
        self.blobs.delete(blob_id)

    def commit_upload(self, blob_id: int, bucket: str, name: str,
                      preconditions: Preconditions = NO_PRECONDITIONS, *,
                      metadata: Mapping[str, str] | None = None, content_type: str = "",
                      storage_class: str = "", expected_crc32c: int | None = None,
                      expected_md5: bytes | None = None, component_count: int = 0,
                      finalize: bool = True) -> ObjectRecord:
        """Publish a staged blob as the live generation of ``name``.

        On failure the staged blob is deleted.
        """
        try:
            validate_object_name(name)
            size = self.blobs.size(blob_id)
            crc = _crc32c_of(self.blobs, blob_id, size)
            if expected_crc32c is not None and expected_crc32c != crc:
                raise InvalidArgument(
                    f"object_checksums.crc32c {expected_crc32c} does not match the crc32c of the "
                    f"{size} bytes received ({crc})")
            # MD5 costs a full pass; only computed when the client sends one to check.
            md5 = _md5_of(self.blobs, blob_id, size) if expected_md5 else None
            if expected_md5 and md5 != expected_md5:
                raise InvalidArgument("object_checksums.md5_hash does not match the data received")
            if finalize:
                self.blobs.sync(blob_id)
            with self._transaction() as txn:
                target = self._bucket(bucket)
                if not finalize and not target.zonal:
                    raise FailedPrecondition(f"bucket {bucket!r} is not zonal; objects there are always finalized")
                check_folder_limits(name)
                replaced = self._live(bucket, name)
                preconditions.check(replaced)
                now = time.time()
                record = ObjectRecord(bucket, name, self._next_generation(), 1, size, crc, md5, finalize,
                                      now, now, now if finalize else None, content_type,
                                      storage_class or target.storage_class, component_count,
                                      dict(metadata or {}), 1, blob_id)
                self._place_object(txn, target, record, replaced)
        except BaseException:
            self.blobs.delete(blob_id)
            raise
        if finalize:
            self.blobs.release(blob_id)
        return record

    def put_object(self, bucket: str, name: str, data: bytes,
                   preconditions: Preconditions = NO_PRECONDITIONS, *, finalize: bool = True,
                   metadata: Mapping[str, str] | None = None, content_type: str = "") -> ObjectRecord:
        blob_id = self.begin_upload()
        try:
            self.upload_append(blob_id, data)
        except BaseException:
            self.abort_upload(blob_id)
            raise
        return self.commit_upload(blob_id, bucket, name, preconditions, metadata=metadata,
                                  content_type=content_type, finalize=finalize)

    def put_many(self, bucket: str, objects: Mapping[str, bytes]) -> list[ObjectRecord]:
        """Many finalized objects in one transaction (fast test setup)."""
        for name in objects:
            validate_object_name(name)
            check_folder_limits(name)
        records = []
        with self._transaction() as txn:
            target = self._bucket(bucket)
            now = time.time()
            for name, data in objects.items():
                replaced = self._live(bucket, name)
                blob_id = self._new_blob(txn, [data])
                record = ObjectRecord(bucket, name, blob_id, 1, len(data), google_crc32c.value(bytes(data)),
                                      None, True, now, now, now, "",
                                      target.storage_class, 0, {}, 1, blob_id)
                self._place_object(txn, target, record, replaced)
                records.append(record)
        return records

    # ------------------------------------------------------------ object metadata

    def delete_object(self, bucket: str, name: str, generation: int = 0,
                      preconditions: Preconditions = NO_PRECONDITIONS) -> None:
        with self._transaction() as txn:
            record = self.get_object(bucket, name, generation, preconditions)
            self._db.execute("DELETE FROM objects WHERE bucket = ? AND name = ?", (bucket, name))
            txn.on_commit.append(lambda: self.blobs.delete(record.blob_id))

    def update_object(self, bucket: str, name: str, generation: int = 0,
                      preconditions: Preconditions = NO_PRECONDITIONS, *,
                      metadata: Mapping[str, str] | None = None,
                      metadata_patch: Mapping[str, str | None] | None = None,
                      content_type: str | None = None) -> ObjectRecord:
        """Replace the given fields (None = keep), then apply ``metadata_patch``
        (a None value removes the key); bumps the metageneration."""
        with self._transaction():
            record = self.get_object(bucket, name, generation, preconditions)
            new_metadata = dict(metadata) if metadata is not None else dict(record.metadata)
            for key, value in (metadata_patch or {}).items():
                if value is None:
                    new_metadata.pop(key, None)
                else:
                    new_metadata[key] = value
            record = replace(
                record, metageneration=record.metageneration + 1, update_time=time.time(),
                metadata=new_metadata,
                content_type=content_type if content_type is not None else record.content_type)
            self._write_object(record)
            return record

    def move_object(self, bucket: str, source: str, destination: str, *,
                    source_preconditions: Preconditions = NO_PRECONDITIONS,
                    destination_preconditions: Preconditions = NO_PRECONDITIONS) -> ObjectRecord:
        """Atomic rename within a bucket; the bytes stay, the destination gets a new generation."""
        validate_object_name(destination)
        if source == destination:
            raise InvalidArgument("source and destination objects must differ")
        with self._transaction() as txn:
            target = self._bucket(bucket)
            check_folder_limits(destination)
            record = self.get_object(bucket, source, 0, source_preconditions)
            replaced = self._live(bucket, destination)
            destination_preconditions.check(replaced)
            self._db.execute("DELETE FROM objects WHERE bucket = ? AND name = ?", (bucket, source))
            now = time.time()
            moved = replace(record, name=destination, generation=self._next_generation(),
                            metageneration=1, update_time=now, create_time=now, writer_epoch=1)
            self._place_object(txn, target, moved, replaced)
            return moved

    def compose(self, bucket: str, destination: str, sources: Sequence[tuple[str, int, int | None]],
                preconditions: Preconditions = NO_PRECONDITIONS, *,
                metadata: Mapping[str, str] | None = None, content_type: str = "",
                expected_crc32c: int | None = None) -> ObjectRecord:
        """Concatenate finalized ``(name, generation or 0, if_generation_match)`` sources."""
        if not sources:
            raise InvalidArgument("ComposeObject needs at least one source object")
        if len(sources) > COMPOSE_MAX_SOURCES:
            raise InvalidArgument(f"ComposeObject takes at most {COMPOSE_MAX_SOURCES} source objects")
        readers: list[BlobReader] = []
        try:
            with self._lock:  # snapshot the sources; copy them without holding the lock
                if self._bucket(bucket).zonal:
                    raise FailedPrecondition("ComposeObject is not supported on zonal (Rapid) buckets")
                records = []
                for name, generation, if_generation_match in sources:
                    record, reader = self.open_reader(bucket, name, generation,
                                                      Preconditions(if_generation_match=if_generation_match))
                    readers.append(reader)
                    if not record.finalized:
                        raise FailedPrecondition(f"source object {name!r} is not finalized")
                    records.append(record)
            blob_id = self.begin_upload()
            try:
                for record, reader in zip(records, readers):
                    for offset in range(0, record.size, _HASH_CHUNK):
                        self.upload_append(blob_id, reader.read(offset, min(_HASH_CHUNK, record.size - offset)))
            except BaseException:
                self.abort_upload(blob_id)
                raise
        finally:
            for reader in readers:
                reader.close()
        components = sum(max(1, record.component_count) for record in records)
        return self.commit_upload(blob_id, bucket, destination, preconditions, metadata=metadata,
                                  content_type=content_type, expected_crc32c=expected_crc32c,
                                  component_count=components)

    # ------------------------------------------------------------ listing

    def _object_scan(self, bucket: str, start: str, end: str | None, columns: str = _OBJECT_COLUMNS,
                     batch: int = listing.SCAN_BATCH) -> listing.NameScan:
        unbounded = f"SELECT {columns} FROM objects WHERE bucket = ? AND name >= ? ORDER BY name LIMIT ?"
        bounded = (f"SELECT {columns} FROM objects WHERE bucket = ? AND name >= ? AND name < ? "
                   "ORDER BY name LIMIT ?")

        def fetch(lo: str, hi: str | None, limit: int):
            if hi is None:
                return self._db.execute(unbounded, (bucket, lo, limit)).fetchall()
            return self._db.execute(bounded, (bucket, lo, hi, limit)).fetchall()
        return listing.NameScan(fetch, start, end, batch)

    def _folder_scan(self, bucket: str, start: str, end: str | None) -> listing.NameScan:
        def fetch(lo: str, hi: str | None, limit: int):
            if hi is None:
                return self._db.execute(
                    f"SELECT {_FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name >= ? "
                    "ORDER BY name LIMIT ?", (bucket, lo, limit)).fetchall()
            return self._db.execute(
                f"SELECT {_FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name >= ? AND name < ? "
                "ORDER BY name LIMIT ?", (bucket, lo, hi, limit)).fetchall()
        return listing.NameScan(fetch, start, end)

    @staticmethod
    def _scan_bounds(prefix: str, start: str, end: str, page_token: str) -> tuple[str, str | None]:
        lower = max(prefix, start)
        if page_token:
            try:
                lower = max(lower, listing.decode_page_token(page_token))
            except ValueError as exc:
                raise InvalidArgument(str(exc)) from None
        upper = listing.successor(prefix) if prefix else None
        if end and (upper is None or end < upper):
            upper = end
        return lower, upper

    def list_objects(self, bucket: str, *, prefix: str = "", delimiter: str = "",
                     include_trailing_delimiter: bool = False, lexicographic_start: str = "",
                     lexicographic_end: str = "", page_size: int = 0, page_token: str = "",
                     include_folders_as_prefixes: bool = False) -> ObjectListing[ObjectRecord]:
        """A page of objects (``ObjectRecord``s) and collapsed prefixes."""
        with self._lock:
            page = self._list_page(bucket, _OBJECT_COLUMNS, prefix, delimiter, include_trailing_delimiter,
                                   lexicographic_start, lexicographic_end, page_size, page_token,
                                   include_folders_as_prefixes)
            return ObjectListing([self._row_to_object(bucket, row) for row in page.objects],
                                 page.prefixes, page.next_page_token)

    def list_object_resources(self, bucket: str, *, prefix: str = "", delimiter: str = "",
                              include_trailing_delimiter: bool = False, lexicographic_start: str = "",
                              lexicographic_end: str = "", page_size: int = 0, page_token: str = "",
                              include_folders_as_prefixes: bool = False) -> ObjectListing[bytes]:
        """``list_objects``, with each object as its serialized ``Object`` resource (bytes)."""
        with self._lock:
            page = self._list_page(bucket, "name, resource", prefix, delimiter, include_trailing_delimiter,
                                   lexicographic_start, lexicographic_end, page_size, page_token,
                                   include_folders_as_prefixes)
        return ObjectListing([row[1] for row in page.objects], page.prefixes, page.next_page_token)

    def _list_page(self, bucket: str, columns: str, prefix: str, delimiter: str,
                   include_trailing_delimiter: bool, lexicographic_start: str, lexicographic_end: str,
                   page_size: int, page_token: str, include_folders_as_prefixes: bool) -> listing.Page:
        # Caller holds the lock.
        try:
            page_size = listing.clamp_page_size(page_size)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        target = self._bucket(bucket)
        lower, upper = self._scan_bounds(prefix, lexicographic_start, lexicographic_end, page_token)
        # Without a delimiter nothing is skipped: read the whole page (and the next name) at once.
        batch = listing.SCAN_BATCH if delimiter else page_size + 1
        stream = listing.entries(self._object_scan(bucket, lower, upper, columns, batch), prefix, delimiter)
        if include_folders_as_prefixes and target.hierarchical and delimiter == "/":
            folders = listing.child_folder_prefixes(self._folder_scan(bucket, lower, upper), prefix)
            stream = listing.merge_entries(stream, folders)
        return listing.paginate(stream, page_size, include_trailing_delimiter)

    # ------------------------------------------------------------ folders

    def _hierarchical(self, bucket: str) -> Bucket:
        target = self._bucket(bucket)
        if not target.hierarchical:
            raise FailedPrecondition(
                f"bucket {bucket!r} does not have hierarchical namespace enabled; folders are not supported")
        return target

    def _folder(self, bucket: str, name: str) -> FolderRecord | None:
        row = self._db.execute(f"SELECT {_FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name = ?",
                               (bucket, name)).fetchone()
        return FolderRecord(bucket, *row) if row else None

    def create_folder(self, bucket: str, name: str, *, recursive: bool = False) -> FolderRecord:
        validate_folder_name(name)
        with self._transaction():
            self._hierarchical(bucket)
            if self._folder(bucket, name) is not None:
                raise AlreadyExists(f"folder {name!r} already exists in bucket {bucket!r}")
            parent = parent_folder(name)
            now = time.time()
            if parent and self._folder(bucket, parent) is None:
                if not recursive:
                    raise FailedPrecondition(
                        f"parent folder {parent!r} does not exist (set recursive to create it)")
            self._db.executemany(
                "INSERT OR IGNORE INTO folders (bucket, name, metageneration, create_time, update_time) "
                "VALUES (?, ?, 1, ?, ?)", [(bucket, folder, now, now) for folder in parent_folders(name)])
            return FolderRecord(bucket, name, 1, now, now)

    def get_folder(self, bucket: str, name: str,
                   preconditions: Preconditions = NO_PRECONDITIONS) -> FolderRecord:
        with self._lock:
            self._hierarchical(bucket)
            folder = self._folder(bucket, name)
            if folder is None:
                raise NotFound(f"folder {name!r} does not exist in bucket {bucket!r}")
            _check_folder_preconditions(folder, preconditions)
            return folder

    def delete_folder(self, bucket: str, name: str,
                      preconditions: Preconditions = NO_PRECONDITIONS) -> None:
        with self._transaction():
            self.get_folder(bucket, name, preconditions)
            if self._has_names_below("objects", bucket, name) or self._has_names_below(
                    "folders", bucket, name, exclude_self=True):
                raise FailedPrecondition(f"folder {name!r} is not empty")
            self._db.execute("DELETE FROM folders WHERE bucket = ? AND name = ?", (bucket, name))

    def _has_names_below(self, table: str, bucket: str, prefix: str, exclude_self: bool = False) -> bool:
        lower = listing.immediate_successor(prefix) if exclude_self else prefix
        upper = listing.successor(prefix)
        sql = f"SELECT 1 FROM {table} WHERE bucket = ? AND name >= ?"
        params: list = [bucket, lower]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        return self._db.execute(sql + " LIMIT 1", params).fetchone() is not None

    def list_folders(self, bucket: str, *, prefix: str = "", delimiter: str = "",
                     lexicographic_start: str = "", lexicographic_end: str = "",
                     page_size: int = 0, page_token: str = "") -> FolderListing:
        if prefix and not prefix.endswith("/"):
            raise InvalidArgument("ListFolders prefix must be empty or end with '/'")
        if delimiter not in ("", "/"):
            raise InvalidArgument("ListFolders supports only the delimiter '/'")
        try:
            page_size = listing.clamp_page_size(page_size)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        with self._lock:
            self._hierarchical(bucket)
            lower, upper = self._scan_bounds(prefix, lexicographic_start, lexicographic_end, page_token)
            scan = self._folder_scan(bucket, lower, upper)
            folders: list[FolderRecord] = []
            while (row := scan.peek()) is not None:
                name = row[0]
                if len(folders) == page_size:
                    return FolderListing(folders, listing.encode_page_token(name))
                folders.append(FolderRecord(bucket, *row))
                if delimiter and name != prefix:
                    # A child of the prefix: its own subfolders are deeper; skip them.
                    scan.seek(listing.successor(name))
                else:
                    scan.advance()
            return FolderListing(folders, "")

    def rename_folder(self, bucket: str, source: str, destination: str,
                      preconditions: Preconditions = NO_PRECONDITIONS) -> FolderRecord:
        """Atomically move a folder, its subfolders and every object below it."""
        validate_folder_name(destination)
        with self._transaction():
            self._hierarchical(bucket)
            folder = self.get_folder(bucket, source, preconditions)
            if destination == source or destination.startswith(source):
                raise InvalidArgument(f"cannot rename folder {source!r} into itself ({destination!r})")
            if self._folder(bucket, destination) is not None:
                raise AlreadyExists(f"destination folder {destination!r} already exists")
            parent = parent_folder(destination)
            if parent and self._folder(bucket, parent) is None:
                raise FailedPrecondition(f"destination parent folder {parent!r} does not exist")
            now = time.time()
            moved_objects = self._rows_below("objects", _OBJECT_COLUMNS, bucket, source)
            for row in moved_objects:
                check_folder_limits(destination + row[0][len(source):])
            moved_folders = self._rows_below("folders", _FOLDER_COLUMNS, bucket, source)
            self._delete_below("objects", bucket, source)
            self._delete_below("folders", bucket, source)
            for row in moved_folders:
                name, metageneration, create_time, _ = row
                self._db.execute(
                    "INSERT INTO folders (bucket, name, metageneration, create_time, update_time) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (bucket, destination + name[len(source):], metageneration + 1, create_time, now))
            for row in moved_objects:
                record = self._row_to_object(bucket, row)
                self._write_object(replace(record, name=destination + record.name[len(source):],
                                           metageneration=record.metageneration + 1, update_time=now))
            return FolderRecord(bucket, destination, folder.metageneration + 1, folder.create_time, now)

    def _rows_below(self, table: str, columns: str, bucket: str, prefix: str) -> list:
        upper = listing.successor(prefix)
        sql = f"SELECT {columns} FROM {table} WHERE bucket = ? AND name >= ?"
        params: list = [bucket, prefix]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        return self._db.execute(sql + " ORDER BY name", params).fetchall()

    def _delete_below(self, table: str, bucket: str, prefix: str) -> None:
        upper = listing.successor(prefix)
        sql = f"DELETE FROM {table} WHERE bucket = ? AND name >= ?"
        params: list = [bucket, prefix]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        self._db.execute(sql, params)


def _check_folder_preconditions(folder: FolderRecord, preconditions: Preconditions) -> None:
    if (preconditions.if_metageneration_match is not None
            and folder.metageneration != preconditions.if_metageneration_match):
        raise FailedPrecondition(
            f"if_metageneration_match={preconditions.if_metageneration_match} but the folder's "
            f"metageneration is {folder.metageneration}")
    if (preconditions.if_metageneration_not_match is not None
            and folder.metageneration == preconditions.if_metageneration_not_match):
        raise FailedPrecondition(
            f"if_metageneration_not_match={preconditions.if_metageneration_not_match} matched")


_HASH_CHUNK = 8 * 1024 * 1024


def _crc32c_of(blobs: MemoryBlobs | FileBlobs, blob_id: int, size: int) -> int:
    crc = 0
    for offset in range(0, size, _HASH_CHUNK):
        crc = google_crc32c.extend(crc, blobs.read(blob_id, offset, min(_HASH_CHUNK, size - offset)))
    return crc


def _md5_of(blobs: MemoryBlobs | FileBlobs, blob_id: int, size: int) -> bytes:
    digest = hashlib.md5()
    for offset in range(0, size, _HASH_CHUNK):
        digest.update(blobs.read(blob_id, offset, min(_HASH_CHUNK, size - offset)))
    return digest.digest()


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except OSError as exc:
        logger.warning("cleanup failed: %s", exc)
