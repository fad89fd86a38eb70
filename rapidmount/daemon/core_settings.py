"""The filesystem core's settings, taken from a mount's configuration."""

from __future__ import annotations

from rapidmount.core.settings import CoreSettings
from rapidmount.daemon.config import MountConfig


def core_settings(config: MountConfig) -> CoreSettings:
    """What the core and scan-ahead read of ``config``, its derived values resolved."""
    return CoreSettings(
        read_only=config.read_only, file_mode=config.file_mode, dir_mode=config.dir_mode,
        preserve_mode=config.preserve_mode, only_dir=config.only_dir,
        page_cache_budget=config.page_cache_budget, cache_block_size=config.cache_block_size,
        readahead_initial=config.readahead_initial, readahead_max=config.readahead_max,
        readahead_step=config.readahead_step, small_file_size=config.small_file_size,
        max_request_size=config.max_request_size, no_direct_writes=config.no_direct_writes,
        prefetch_files=config.prefetch_files, prefetch_streams=config.prefetch_streams,
        compose_prefetch=config.compose_prefetch,
        temp_dir=config.temp_dir, finalize_on_close=config.finalize_on_close,
        rename_dir_limit=config.rename_dir_limit,
        metadata_ttl=config.metadata_ttl, negative_ttl=config.negative_ttl,
        listing_ttl=config.effective_listing_ttl, metadata_cache_size=config.metadata_cache_size,
        prefetch_metadata=config.prefetch_metadata, prefetch_metadata_workers=config.prefetch_metadata_workers)
