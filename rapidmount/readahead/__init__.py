"""Readahead within one open file: which blocks to fetch (``policy``, no I/O)
and the trio fetcher that fetches them into the page cache (``fetcher``)."""

from rapidmount.readahead.policy import ReadaheadPolicy, ReadPlan, StoreTally

__all__ = ["ReadaheadPolicy", "ReadPlan", "StoreTally"]
