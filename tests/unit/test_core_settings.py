"""The core's settings (rapidmount.core.settings) and how the daemon takes
them from a mount's configuration (rapidmount.daemon.core_settings)."""

from __future__ import annotations

import dataclasses

import pytest

from rapidmount.core.settings import CoreSettings
from rapidmount.daemon.config import MountConfig
from rapidmount.daemon.core_settings import core_settings

MiB = 1 << 20


def test_a_mount_given_no_flags_gives_the_core_its_default_settings():
    assert core_settings(MountConfig("a-bucket", "/mnt")) == CoreSettings()


def test_every_core_setting_comes_from_the_mount_configuration():
    given = dict(file_mode=0o600, dir_mode=0o700, preserve_mode=True, only_dir="top", cache_size=512 * MiB,
                 cache_block_size=4 * MiB, readahead_initial=8 * MiB, readahead_max=128 * MiB,
                 readahead_step=16 * MiB, small_file_size=1 * MiB, max_request_size=8 * MiB, no_direct_writes=True,
                 prefetch_files=4, prefetch_streams=2, compose_prefetch=True, temp_dir="/var/tmp",
                 finalize_on_close=True, rename_dir_limit=5, metadata_ttl=30.0, negative_ttl=1.0, listing_ttl=10.0,
                 metadata_cache_size=8 * MiB, prefetch_metadata=True, prefetch_metadata_workers=3)
    settings = core_settings(MountConfig("a-bucket", "/mnt", read_only=True, **given))
    default = CoreSettings()
    unchanged = [field.name for field in dataclasses.fields(CoreSettings)
                 if getattr(settings, field.name) == getattr(default, field.name)]
    assert not unchanged, "not taken from the configuration"
    assert settings.page_cache_budget == 384 * MiB, "--cache-size less the transfer buffer (a quarter)"
    assert settings.listing_ttl == 10.0


def test_a_listing_is_trusted_as_long_as_the_metadata_unless_told_otherwise():
    assert core_settings(MountConfig("a-bucket", "/mnt", metadata_ttl=7.0)).listing_ttl == 7.0


def test_the_core_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CoreSettings().read_only = True  # type: ignore[misc]
