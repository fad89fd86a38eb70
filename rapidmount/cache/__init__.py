"""Data caching (sans-I/O): the budgeted block cache behind file reads."""

from rapidmount.cache.page_cache import BlockKey, Buffer, CacheStats, PageCache

__all__ = ["BlockKey", "Buffer", "CacheStats", "PageCache"]
