"""Scan-ahead: fetching the files a directory scan is about to open (FUSE process, trio).

``planner`` predicts them (no I/O); ``files`` fetches their first blocks into
the page cache, in batches. A worker reads a batch with
``rapidmount.workers.scan_batches``. The package imports nothing of the
filesystem core.
"""
