"""One mount's configuration: its bucket and mount point, the mount switches
of ``-o``, its settings, and what follows from them.

A :class:`MountConfig` is a frozen value, made once from everything given
(``rapidmount.daemon.config`` collects it); it remembers where each setting
given came from, for ``--print-config`` and the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from rapidmount.daemon.flag_values import default_max_background, default_workers
from rapidmount.daemon.flags import FLAG_BY_DEST, Settings

#: The ``-o`` options that are not flags: option -> (the MountConfig field it sets, to what).
MOUNT_SWITCHES: Mapping[str, tuple[str, bool]] = {
    "ro": ("read_only", True),
    "rw": ("read_only", False),
    "allow_other": ("allow_other", True),
    "default_permissions": ("default_permissions", True),
}
# -o options understood (besides flags spelled as key=value).
MOUNT_OPTIONS = tuple(MOUNT_SWITCHES)


@dataclass(frozen=True, repr=False)
class MountConfig(Settings):
    """One mount: its bucket and mount point, the mount switches, and its
    settings (the fields of :class:`~rapidmount.daemon.flags.Settings`)."""

    bucket: str
    mountpoint: str
    _: KW_ONLY
    read_only: bool = False
    allow_other: bool = False
    default_permissions: bool = False
    #: where each field given came from (``profile NAME``, ``config file PATH``, ``flag``, ``-o``), by name
    sources: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __repr__(self) -> str:
        return f"MountConfig({self.bucket!r}, {self.mountpoint!r}, values={self.values!r})"

    @property
    def values(self) -> dict[str, Any]:
        """The settings given (the others are defaults), by field name."""
        return {name: getattr(self, name) for name in self.sources if name in FLAG_BY_DEST}

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")

    @property
    def permission_checks(self) -> bool:
        """Whether the kernel checks modes, owner and group (FUSE's default_permissions).

        With allow_other, other users reach the mount with its credentials:
        the modes are then the only thing that keeps them out, so the checks
        are on unless explicitly turned off."""
        return self.default_permissions or (self.allow_other and not self.no_permission_checks)

    @property
    def effective_listing_ttl(self) -> float:
        return self.metadata_ttl if self.listing_ttl is None else self.listing_ttl

    @property
    def effective_transfer_buffer(self) -> int:
        if self.transfer_buffer is not None:
            return self.transfer_buffer
        # A quarter, as long as the page cache keeps its 4 blocks.
        return max(0, min(self.cache_size // 4, self.cache_size - 4 * self.cache_block_size))

    @property
    def page_cache_budget(self) -> int:
        """What the page cache may hold: --cache-size less the transfer buffer (one shared arena)."""
        return self.cache_size - self.effective_transfer_buffer

    @property
    def effective_workers(self) -> int:
        return default_workers() if self.workers is None else self.workers

    @property
    def effective_fuse_limits(self) -> tuple[int, int]:
        """(max_background, congestion_threshold) to set; 0 leaves that one to the kernel."""
        background = default_max_background() if self.max_background is None else self.max_background
        if self.congestion_threshold is not None:
            return background, self.congestion_threshold
        return background, max(1, background * 3 // 4) if background else 0
