"""Scan-ahead: fetching the files a directory scan is about to open.

``planner`` predicts them (no I/O); ``files`` fetches their first blocks
into the page cache, in batches, in the FUSE process (trio); ``batches`` is
how a data-plane worker reads a batch (asyncio). The package imports
nothing of the filesystem core.
"""
