"""Name-range queries on the store's index, shared by listings and folder moves.

Every query is bounded by a name range (``name >= lower AND name < upper``)
so SQLite answers it from the primary key, however large the bucket.
"""

from __future__ import annotations

from typing import Any

from . import listing
from .store_errors import InvalidArgument
from .store_index import FOLDER_COLUMNS, OBJECT_COLUMNS, StoreIndex


class NameRanges(StoreIndex):
    """Scans, lookups and deletes over the names in a range."""

    def _object_scan(self, bucket: str, start: str, end: str | None, columns: str = OBJECT_COLUMNS,
                     batch: int = listing.SCAN_BATCH) -> listing.NameScan:
        unbounded = f"SELECT {columns} FROM objects WHERE bucket = ? AND name >= ? ORDER BY name LIMIT ?"
        bounded = (f"SELECT {columns} FROM objects WHERE bucket = ? AND name >= ? AND name < ? "
                   "ORDER BY name LIMIT ?")

        def fetch(lo: str, hi: str | None, limit: int) -> list[Any]:
            if hi is None:
                return self._db.execute(unbounded, (bucket, lo, limit)).fetchall()
            return self._db.execute(bounded, (bucket, lo, hi, limit)).fetchall()
        return listing.NameScan(fetch, start, end, batch)

    def _folder_scan(self, bucket: str, start: str, end: str | None) -> listing.NameScan:
        def fetch(lo: str, hi: str | None, limit: int) -> list[Any]:
            if hi is None:
                return self._db.execute(
                    f"SELECT {FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name >= ? "
                    "ORDER BY name LIMIT ?", (bucket, lo, limit)).fetchall()
            return self._db.execute(
                f"SELECT {FOLDER_COLUMNS} FROM folders WHERE bucket = ? AND name >= ? AND name < ? "
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

    def _has_names_below(self, table: str, bucket: str, prefix: str, exclude_self: bool = False) -> bool:
        lower = listing.immediate_successor(prefix) if exclude_self else prefix
        upper = listing.successor(prefix)
        sql = f"SELECT 1 FROM {table} WHERE bucket = ? AND name >= ?"
        params = [bucket, lower]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        return self._db.execute(sql + " LIMIT 1", params).fetchone() is not None

    def _rows_below(self, table: str, columns: str, bucket: str, prefix: str) -> list[Any]:
        upper = listing.successor(prefix)
        sql = f"SELECT {columns} FROM {table} WHERE bucket = ? AND name >= ?"
        params = [bucket, prefix]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        return self._db.execute(sql + " ORDER BY name", params).fetchall()

    def _delete_below(self, table: str, bucket: str, prefix: str) -> None:
        upper = listing.successor(prefix)
        sql = f"DELETE FROM {table} WHERE bucket = ? AND name >= ?"
        params = [bucket, prefix]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        self._db.execute(sql, params)
