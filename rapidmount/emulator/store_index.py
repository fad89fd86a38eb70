"""The base of the emulator's store: the SQLite index, the blobs, and the buckets.

``StoreIndex`` owns what every part of ``Store`` shares: the one re-entrant
lock, transactions (with actions deferred to their outcome), the generation
clock, the row <-> ``ObjectRecord`` mapping, placing an object as the live
generation, reconciling the index with the blob files after a restart, and
the buckets themselves. The other ``store_*`` modules add one concern each.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from rapidmount.storage.model import is_bucket_name

from .blob_digests import crc32c_of
from .blobs import FileBlobs, MemoryBlobs
from .resources import object_bytes
from .store_errors import AlreadyExists, InvalidArgument, NotFound
from .store_names import parent_folders
from .store_records import BUCKET_KINDS, Bucket, ObjectRecord

logger = logging.getLogger("rapidmount.emulator.store")

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

#: The columns of an ``objects`` row that make an ``ObjectRecord`` (with its bucket).
OBJECT_COLUMNS = ("name, generation, metageneration, size, crc32c, md5, finalized, create_time, "
                  "update_time, finalize_time, content_type, storage_class, component_count, "
                  "metadata, writer_epoch, blob_id")
#: The columns of a ``folders`` row that make a ``FolderRecord`` (with its bucket).
FOLDER_COLUMNS = "name, metageneration, create_time, update_time"


@dataclass
class Transaction:
    """Actions that must run only once the transaction's outcome is known."""

    on_commit: list[Callable[[], None]] = field(default_factory=list)
    on_rollback: list[Callable[[], None]] = field(default_factory=list)


class StoreIndex:
    """The index and blobs every part of ``Store`` works on, and its buckets."""

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
        self._last_generation: int = row[0] if row else 0
        if self.data_dir is not None:
            self._reconcile()

    def _add_resource_column(self) -> None:
        """Indexes written before rows carried their serialized resource get it now."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(objects)")}
        if "resource" not in columns:
            self._db.execute("ALTER TABLE objects ADD COLUMN resource BLOB")
        missing = self._db.execute(
            f"SELECT bucket, {OBJECT_COLUMNS} FROM objects WHERE resource IS NULL").fetchall()
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
    def _transaction(self) -> Iterator[Transaction]:
        with self._lock:
            txn = Transaction()
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

    @staticmethod
    def _now() -> float:
        """The bucket's clock: every time the store stamps comes from here."""
        return time.time()

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

    def _row_to_object(self, bucket: str, row: Sequence[Any]) -> ObjectRecord:
        (name, generation, metageneration, size, crc, md5, finalized, create_time, update_time,
         finalize_time, content_type, storage_class, component_count, metadata, epoch, blob_id) = row
        return ObjectRecord(bucket, name, generation, metageneration, size, crc, md5, bool(finalized),
                            create_time, update_time, finalize_time, content_type, storage_class,
                            component_count, {} if metadata == "{}" else json.loads(metadata), epoch, blob_id)

    def _live(self, bucket: str, name: str) -> ObjectRecord | None:
        row = self._db.execute(f"SELECT {OBJECT_COLUMNS} FROM objects WHERE bucket = ? AND name = ?",
                               (bucket, name)).fetchone()
        return self._row_to_object(bucket, row) if row else None

    def _write_object(self, record: ObjectRecord) -> None:
        """Insert or replace the row of ``record``, with its serialized resource."""
        self._db.execute(
            f"INSERT OR REPLACE INTO objects (bucket, {OBJECT_COLUMNS}, resource) "
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

    def _place_object(self, txn: Transaction, bucket: Bucket, record: ObjectRecord,
                      replaced: ObjectRecord | None) -> None:
        """Insert ``record`` as the live generation, dropping ``replaced``'s bytes after commit."""
        self._ensure_parent_folders(bucket, record.name, record.create_time)
        self._write_object(record)
        if replaced is not None and replaced.blob_id != record.blob_id:
            txn.on_commit.append(lambda: self.blobs.delete(replaced.blob_id))

    def _new_blob(self, txn: Transaction, pieces: Iterable[bytes] = ()) -> int:
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
                    crc = crc32c_of(self.blobs, blob_id, actual)
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
            bucket = Bucket(name, kind, self._now())
            self._db.execute("INSERT INTO buckets (name, kind, create_time) VALUES (?, ?, ?)",
                             (bucket.name, bucket.kind, bucket.create_time))
            self._buckets[name] = bucket
            return bucket

    def get_bucket(self, name: str) -> Bucket:
        with self._lock:
            return self._bucket(name)


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except OSError as exc:
        logger.warning("cleanup failed: %s", exc)
