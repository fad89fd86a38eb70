"""Readahead policy (sans-I/O): decides what each read fetches and prefetches."""

from rapidmount.prefetch.readahead import ReadaheadPolicy, ReadPlan

__all__ = ["ReadaheadPolicy", "ReadPlan"]
