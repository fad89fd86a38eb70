"""Parsers of the mount's flag values, the limits they check, and the defaults
that follow the machine.

Each parser takes the text of a flag, a ``-o`` option or a config-file key
and returns the typed value, or raises ValueError with a message that says
what it expected; :mod:`rapidmount.daemon.flags` names the flag in front of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rapidmount.daemon.profiles import affinity_cpus
from rapidmount.daemon.profiles import default_workers as _default_workers
from rapidmount.shared import allocator

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: Below this a worker could pass --worker-memory-limit just by starting.
MIN_WORKER_MEMORY_LIMIT = 32 * MiB
MIN_CACHE_BLOCK, MAX_CACHE_BLOCK = 4 * KiB, 64 * MiB
MIN_REQUEST, MAX_REQUEST = 1 * MiB, 16 * MiB
#: Pipes for WRITEs handed to workers (--write-pipes): each holds one WRITE in flight.
MAX_WRITE_PIPES = 64

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1 << 40}


def parse_size(text: str) -> int:
    """``"512MiB"``, ``"1G"``, ``"4096"`` → bytes (binary units)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 64MiB, 1GiB)")
    number, unit, _ = match.groups()
    value = float(number) * _UNITS[unit.lower()]
    if value != int(value):
        raise ValueError(f"not a whole number of bytes: {text!r}")
    return int(value)


def parse_seconds(text: str, *, forever: bool = True) -> float:
    """Seconds as a number; ``-1`` means forever where ``forever`` allows it."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number of seconds: {text!r}") from None
    if forever and value < 0 and value != -1:
        raise ValueError(f"must be >= 0, or -1 for forever: {text!r}")
    if not forever and value <= 0:
        raise ValueError(f"must be > 0: {text!r}")
    return value


def parse_positive_seconds(text: str) -> float:
    """Seconds, strictly positive (no 'forever': a bound is the point)."""
    return parse_seconds(text, forever=False)


def parse_mode(text: str) -> int:
    try:
        value = int(str(text), 8)
    except ValueError:
        raise ValueError(f"not an octal mode: {text!r} (example: 0644)") from None
    if not 0 <= value <= 0o7777:
        raise ValueError(f"mode out of range: {text!r}")
    return value


def parse_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a numeric id: {text!r}") from None
    if not 0 <= value < 2**32 - 1:
        raise ValueError(f"id out of range: {text!r}")
    return value


def parse_endpoint(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        if text.startswith("google-c2p:///"):
            return text
        raise ValueError(f"not HOST:PORT: {text!r}")
    return text


_PROJECT_RE = re.compile(r"(?:[a-z][a-z0-9.-]*[a-z0-9]:)?[a-z][a-z0-9-]{4,28}[a-z0-9]|[0-9]{1,20}")


def parse_project(text: str) -> str:
    if not _PROJECT_RE.fullmatch(text):
        raise ValueError(f"not a Google Cloud project ID or number: {text!r} (example: my-project)")
    return text


BUCKET_TYPES = ("auto", "zonal", "regional")


def parse_bucket_type(text: str) -> str:
    if text.lower() not in BUCKET_TYPES:
        raise ValueError(f"not a bucket type: {text!r} (auto, zonal, regional)")
    return text.lower()


def parse_worker_allocator(text: str) -> str:
    if text.lower() not in allocator.ALLOCATORS:
        raise ValueError(f"not an allocator: {text!r} ({', '.join(allocator.ALLOCATORS)})")
    return text.lower()


def parse_positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise ValueError(f"must be > 0: {text!r}")
    return value


def parse_non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise ValueError(f"must be >= 0: {text!r}")
    return value


def parse_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"not a port number: {text!r}") from None
    if not 0 <= value < 65536:
        raise ValueError(f"port out of range (0-65535): {text!r}")
    return value


def parse_listen_address(text: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise ValueError(f"not an IP address: {text!r} (examples: 127.0.0.1, 0.0.0.0, ::)") from None


def parse_log_format(text: str) -> str:
    if text.lower() not in ("text", "json"):
        raise ValueError(f"not a log format: {text!r} (text, json)")
    return text.lower()


def _parse_count_up_to(limit: int) -> Callable[[str], int]:
    """A parser of a whole number from 1 to ``limit``."""
    def parse(text: str) -> int:
        value = parse_positive_int(text)
        if value > limit:
            raise ValueError(f"must be at most {limit}: {text!r}")
        return value
    return parse


MAX_READ_STREAMS = 64
MAX_WORKERS = 64
MAX_LISTING_CALLS = 256
parse_read_streams = _parse_count_up_to(MAX_READ_STREAMS)
parse_workers = _parse_count_up_to(MAX_WORKERS)
parse_prefetch_metadata_workers = _parse_count_up_to(MAX_LISTING_CALLS)


def parse_fuse_limit(text: str) -> int:
    value = parse_non_negative_int(text)
    if value > 65535:
        raise ValueError(f"must be at most 65535: {text!r}")
    return value


def parse_log_level(text: str) -> str:
    if text.lower() not in ("debug", "info", "warning", "error"):
        raise ValueError(f"not a log level: {text!r} (debug, info, warning, error)")
    return text.lower()


# -- defaults that follow the machine (the unset --workers and --max-background) ---------------

def default_workers(cpus: int | None = None) -> int:
    """Data-plane workers by default (``profiles.default_workers``), for this machine unless ``cpus``."""
    return _default_workers(cpus or affinity_cpus())


def default_max_background(cpus: int | None = None) -> int:
    """gcsfuse's FUSE ``max_background`` for zonal (Rapid) buckets: min(max(12, 2 x CPUs), 192)."""
    return min(max(12, 2 * (cpus or affinity_cpus())), 192)
