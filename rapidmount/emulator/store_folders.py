"""Folders of hierarchical-namespace buckets: create, get, delete, list, rename.

A folder made implicitly by an object name stays when its last object is
deleted; a folder's ``update_time`` is set when it is made and when it is
renamed, never by changes to the objects inside it.
"""

from __future__ import annotations

from dataclasses import replace

from . import listing
from .store_errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from .store_index import FOLDER_COLUMNS, OBJECT_COLUMNS
from .store_names import check_folder_limits, parent_folder, parent_folders, validate_folder_name
from .store_preconditions import NO_PRECONDITIONS, Preconditions
from .store_records import Bucket, FolderListing, FolderRecord
from .store_scans import NameRanges


class Folders(NameRanges):
    """The folder operations of ``Store``."""

    def _hierarchical(self, bucket: str) -> Bucket:
        target = self._bucket(bucket)
        if not target.hierarchical:
            raise FailedPrecondition(
                f"bucket {bucket!r} does not have hierarchical namespace enabled; folders are not supported")
        return target

    def _folder(self, bucket: str, name: str) -> FolderRecord | None:
        row = self._db.execute(f"SELECT {FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name = ?",
                               (bucket, name)).fetchone()
        return FolderRecord(bucket, *row) if row else None

    def create_folder(self, bucket: str, name: str, *, recursive: bool = False) -> FolderRecord:
        validate_folder_name(name)
        with self._transaction():
            self._hierarchical(bucket)
            if self._folder(bucket, name) is not None:
                raise AlreadyExists(f"folder {name!r} already exists in bucket {bucket!r}")
            parent = parent_folder(name)
            now = self._now()
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
            preconditions.check_folder(folder)
            return folder

    def delete_folder(self, bucket: str, name: str,
                      preconditions: Preconditions = NO_PRECONDITIONS) -> None:
        with self._transaction():
            self.get_folder(bucket, name, preconditions)
            if self._has_names_below("objects", bucket, name) or self._has_names_below(
                    "folders", bucket, name, exclude_self=True):
                raise FailedPrecondition(f"folder {name!r} is not empty")
            self._db.execute("DELETE FROM folders WHERE bucket = ? AND name = ?", (bucket, name))

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
            now = self._now()
            moved_objects = self._rows_below("objects", OBJECT_COLUMNS, bucket, source)
            for row in moved_objects:
                check_folder_limits(destination + row[0][len(source):])
            moved_folders = self._rows_below("folders", FOLDER_COLUMNS, bucket, source)
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
