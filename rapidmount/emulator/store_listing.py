"""ListObjects on the store: a page of objects and collapsed prefixes.

The algorithm (ordered scans, delimiter skips, page tokens) is in
``listing``; this module binds it to the store's index.
"""

from __future__ import annotations

from . import listing
from .store_errors import InvalidArgument
from .store_index import OBJECT_COLUMNS
from .store_records import ObjectListing, ObjectRecord
from .store_scans import NameRanges


class ObjectListings(NameRanges):
    """The object listings of ``Store``."""

    def list_objects(self, bucket: str, *, prefix: str = "", delimiter: str = "",
                     include_trailing_delimiter: bool = False, lexicographic_start: str = "",
                     lexicographic_end: str = "", page_size: int = 0, page_token: str = "",
                     include_folders_as_prefixes: bool = False) -> ObjectListing[ObjectRecord]:
        """A page of objects (``ObjectRecord``s) and collapsed prefixes."""
        with self._lock:
            page = self._list_page(bucket, OBJECT_COLUMNS, prefix, delimiter, include_trailing_delimiter,
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
