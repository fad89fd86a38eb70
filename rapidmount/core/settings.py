"""The settings the filesystem core reads, as one typed value of its own.

The daemon builds a :class:`CoreSettings` from its mount configuration
(``rapidmount.daemon.core_settings``); the core and scan-ahead read only
this, so they depend on nothing of the daemon. The defaults are the mount
flags' defaults, which lets a test name only what it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CoreSettings:
    """What one mount's core is told; each field is the flag of the same name
    unless its doc says otherwise."""

    # -- what the mount looks like
    read_only: bool = False  #: no change reaches the bucket (EROFS), and no write bits show
    file_mode: int = 0o644  #: permission bits of files
    dir_mode: int = 0o755  #: permission bits of directories
    preserve_mode: bool = False  #: a file's chmod bits live in its object metadata
    only_dir: str = ""  #: the prefix of the bucket mounted ("" for all of it)
    # -- data cache and readahead
    page_cache_budget: int = 192 * MiB  #: bytes the block cache may hold (--cache-size less the transfer buffer)
    cache_block_size: int = 2 * MiB  #: bytes of one cached block
    readahead_initial: int = 4 * MiB  #: first readahead window of a sequential reader (0: none)
    readahead_max: int = 64 * MiB  #: the largest readahead window
    readahead_step: int = 8 * MiB  #: bytes of blocks fetched in one call of a readahead
    small_file_size: int = 2 * MiB  #: finalized objects up to this size are fetched whole at open
    max_request_size: int = 4 * MiB  #: the largest READ or WRITE the kernel sends
    no_direct_writes: bool = False  #: write-only opens go through the kernel's page cache too
    # -- scan-ahead (rapidmount.scanahead reads these three)
    prefetch_files: int = 32  #: files whose first block a scan fetches ahead (0: off)
    prefetch_streams: int = 16  #: files fetched ahead at once
    compose_prefetch: bool = False  #: fetch small files ahead through composed temporary objects
    # -- writes
    temp_dir: str | None = None  #: where staged copies live (None: the system's temporary directory)
    finalize_on_close: bool = False  #: zonal buckets: the last close finalizes the object
    rename_dir_limit: int = 0  #: buckets without folders: rename directories of at most this many objects
    # -- metadata cache
    metadata_ttl: float = 60.0  #: seconds attributes are trusted (-1: forever)
    negative_ttl: float = 5.0  #: seconds a "does not exist" is trusted
    listing_ttl: float = 60.0  #: seconds a listing is trusted (the flag's default: ``metadata_ttl``)
    metadata_cache_size: int = 64 * MiB  #: byte budget of the metadata cache
    prefetch_metadata: bool = False  #: list the whole tree in the background at mount time
    prefetch_metadata_workers: int = 8  #: ListObjects calls of that listing at once
