"""Counters of the filesystem core, exported as metrics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FSStats:
    lookups: int = 0
    rpc_lookups: int = 0
    listings: int = 0
    bytes_read: int = 0
    direct_reads: int = 0
    reads: int = 0
    blocks_fetched: int = 0
    bytes_fetched: int = 0
    whole_file_fetches: int = 0
    #: files fetched ahead of a scan, and those later opened while cached or in flight
    scan_prefetches: int = 0
    scan_hits: int = 0
    bytes_written: int = 0
    writers_flushed: int = 0  # appends made durable or staged files uploaded
