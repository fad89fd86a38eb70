"""Scan-ahead: fetching the files a directory scan is about to open.

``planner`` predicts them (no I/O); ``files`` fetches their first blocks
into the page cache, in batches, on trio.
"""
