"""A mount's configuration, from the command line: collected, then made once.

The config file, the flags, ``-o`` and ``--profile`` each give settings;
:class:`GivenSettings` collects them with where each came from (a later
source wins: the config file, then flags, then ``-o``; the profile fills
only what none of them gave), and builds the frozen :class:`MountConfig`,
which :func:`validate` then checks as a whole.

The flag table is :mod:`rapidmount.daemon.flags`, its value parsers
:mod:`rapidmount.daemon.flag_values`, the TOML file
:mod:`rapidmount.daemon.config_file`, and :class:`MountConfig` itself
:mod:`rapidmount.daemon.mount_config`; the names others use are here too.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rapidmount.daemon.config_file import effective_toml, load_config_file
from rapidmount.daemon.flag_values import (
    KiB,
    MAX_CACHE_BLOCK,
    MAX_LISTING_CALLS,
    MAX_READ_STREAMS,
    MAX_REQUEST,
    MAX_WORKERS,
    MAX_WRITE_PIPES,
    MIN_CACHE_BLOCK,
    MIN_REQUEST,
    MIN_WORKER_MEMORY_LIMIT,
    default_max_background,
    default_workers,
    parse_prefetch_metadata_workers,
    parse_read_streams,
    parse_size,
    parse_workers,
)
from rapidmount.daemon.flags import FLAG_BY_DEST, FLAGS, ConfigError, Flag, Settings, add_flags, parse_flag_value
from rapidmount.daemon.mount_config import MOUNT_OPTIONS, MOUNT_SWITCHES, MountConfig
from rapidmount.daemon.profiles import Machine, this_machine
from rapidmount.daemon.profiles import settings as profile_settings
from rapidmount.storage.model import is_bucket_name

__all__ = [
    "FLAGS",
    "FLAG_BY_DEST",
    "MAX_LISTING_CALLS",
    "MAX_READ_STREAMS",
    "MAX_WORKERS",
    "MOUNT_OPTIONS",
    "ConfigError",
    "Flag",
    "GivenSettings",
    "MountConfig",
    "Settings",
    "add_flags",
    "apply_mount_options",
    "apply_profile",
    "config_from_args",
    "default_max_background",
    "default_workers",
    "effective_toml",
    "load_config_file",
    "parse_prefetch_metadata_workers",
    "parse_read_streams",
    "parse_size",
    "parse_workers",
    "validate",
]

#: What a mount may be given: its settings, and the switches of -o (ro, allow_other, ...).
_GIVABLE = frozenset(FLAG_BY_DEST) | {name for name, _ in MOUNT_SWITCHES.values()}


class GivenSettings:
    """What one mount was given, by :class:`MountConfig` field name, and where
    each value came from; :meth:`build` makes the :class:`MountConfig`."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        #: ``config file PATH``, ``flag``, ``-o`` or ``profile NAME``, by field name
        self.sources: dict[str, str] = {}

    def update(self, values: Mapping[str, Any], source: str) -> None:
        """Take ``values`` (already parsed), given by ``source``: each wins over what was given before."""
        for name, value in values.items():
            if name not in _GIVABLE:
                raise KeyError(f"no such setting: {name!r}")
            self.values[name] = value
            self.sources[name] = source

    def value_of(self, name: str) -> Any:
        """The setting ``name`` as it stands: given, else its default."""
        return self.values[name] if name in self.values else FLAG_BY_DEST[name].default

    def build(self, bucket: str, mountpoint: str) -> MountConfig:
        return MountConfig(bucket, mountpoint, **self.values, sources=dict(self.sources))


def apply_mount_options(given: GivenSettings, options: Iterable[str], source: str = "-o") -> None:
    """Take ``-o a,b=c`` options (mount(8) style): the switches ``ro``, ``rw``,
    ``allow_other``, ``default_permissions``, and any flag as ``name=value``
    (a switch also as its bare name)."""
    values: dict[str, Any] = {}
    for group in options:
        for item in filter(None, (part.strip() for part in group.split(","))):
            key, sep, value = item.partition("=")
            if key in MOUNT_SWITCHES and not sep:
                name, on = MOUNT_SWITCHES[key]
                values[name] = on
                continue
            flag = FLAG_BY_DEST.get(key.replace("-", "_"))
            if flag is None:
                raise ConfigError(f"unknown mount option: {key!r}")
            values[flag.dest] = parse_flag_value(flag, value if sep else None)
    given.update(values, source)


def apply_profile(given: GivenSettings, machine: Machine | None = None) -> None:
    """Fill the settings nobody gave with those of the profile given, if any."""
    profile = given.values.get("profile")
    if profile is None:
        return
    source = f"profile {profile}"
    chosen = profile_settings(profile, machine or this_machine())
    given.update({name: value for name, value in chosen.items() if name not in given.sources}, source)
    if given.sources.get("readahead_initial") == source and \
            given.value_of("readahead_initial") > given.value_of("readahead_max"):
        # The user's smaller --readahead-max wins over the profile's first window.
        given.update({"readahead_initial": given.value_of("readahead_max")}, source)


def _flags_given(args: argparse.Namespace) -> dict[str, Any]:
    """The flags on the command line (argparse leaves the others None), parsed."""
    given: dict[str, Any] = {}
    for flag in FLAGS:
        raw = getattr(args, flag.dest)
        if raw is not None:
            given[flag.dest] = True if flag.is_switch else parse_flag_value(flag, raw)
    return given


def config_from_args(args: argparse.Namespace) -> MountConfig:
    given = GivenSettings()
    if getattr(args, "config_file", None):
        from_file = load_config_file(args.config_file)
        source = f"config file {args.config_file}"
        apply_mount_options(given, from_file.pop("options", []), source)
        given.update(from_file, source)
    given.update(_flags_given(args), "flag")
    apply_mount_options(given, args.options or [])
    apply_profile(given)
    config = given.build(args.bucket, args.mountpoint)
    validate(config)
    return config


def validate(config: MountConfig) -> None:
    if not is_bucket_name(config.bucket or ""):
        raise ConfigError(f"not a valid bucket name: {config.bucket!r}")
    if config.anonymous and not config.emulator and "endpoint" not in config.values:
        raise ConfigError("--anonymous needs an explicit --endpoint")
    if config.anonymous and config.key_file is not None:
        raise ConfigError("--key-file and --anonymous exclude each other")
    if config.directpath and config.anonymous:
        raise ConfigError("--directpath needs credentials: it cannot be combined with --anonymous")
    if config.directpath and config.ca_file is not None:
        raise ConfigError("--directpath uses Google's own certificates: drop --ca-file")
    if not MIN_CACHE_BLOCK <= config.cache_block_size <= MAX_CACHE_BLOCK:
        raise ConfigError(f"--cache-block-size: must be between {MIN_CACHE_BLOCK >> 10}KiB and "
                          f"{MAX_CACHE_BLOCK >> 20}MiB")
    if config.cache_size < config.cache_block_size * 4:
        raise ConfigError("--cache-size: must hold at least 4 blocks of --cache-block-size")
    if config.page_cache_budget < config.cache_block_size * 4:
        raise ConfigError("--transfer-buffer: must leave at least 4 blocks of --cache-block-size of --cache-size "
                          "to the page cache")
    if 0 < config.worker_memory_limit < MIN_WORKER_MEMORY_LIMIT:
        raise ConfigError(f"--worker-memory-limit: must be 0 (no limit) or at least "
                          f"{MIN_WORKER_MEMORY_LIMIT >> 20}MiB, above what a worker needs to start")
    if config.default_permissions and config.no_permission_checks:
        raise ConfigError("-o default_permissions and --no-permission-checks contradict each other: drop one")
    if config.compose_prefetch and config.read_only:
        raise ConfigError("--compose-prefetch writes temporary objects: not with -o ro")
    if not MIN_REQUEST <= config.max_request_size <= MAX_REQUEST or config.max_request_size % (4 * KiB):
        raise ConfigError(f"--max-request-size: must be whole 4KiB pages from {MIN_REQUEST >> 20}MiB to "
                          f"{MAX_REQUEST >> 20}MiB")
    if config.write_pipes > MAX_WRITE_PIPES:
        raise ConfigError(f"--write-pipes: at most {MAX_WRITE_PIPES}")
    if config.readahead_initial > config.readahead_max:
        raise ConfigError("--readahead-initial: must not exceed --readahead-max")
    if config.cache_dir is not None and config.cache_dir_size is not None and config.cache_dir_size <= 0:
        raise ConfigError("--cache-dir-size: must be positive")
    if config.cache_dir is not None and config.mountpoint and _inside(config.cache_dir, config.mountpoint):
        raise ConfigError("--cache-dir: must not be inside the mountpoint")
    if config.only_dir and (config.only_dir.startswith("/") or "//" in config.only_dir):
        raise ConfigError(f"--only-dir: not a valid prefix: {config.only_dir!r}")


def _inside(path: str, directory: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real == top or real.startswith(top.rstrip("/") + "/")

