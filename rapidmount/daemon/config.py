"""Every mount flag, its type, default, help and validation, in one place.

:class:`Settings` declares each flag as a typed field; :data:`FLAGS` is
built from its fields, the command line (``daemon/cli.py``), ``-o``, the config
file and ``--print-config`` from :data:`FLAGS`, and ``docs/configuration.md``
is checked against them by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from rapidmount.shared import allocator
from rapidmount.daemon.profiles import Machine, affinity_cpus, parse_profile, this_machine
from rapidmount.daemon.profiles import default_workers as _default_workers
from rapidmount.daemon.profiles import settings as profile_settings
from rapidmount.storage.model import is_bucket_name

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


def default_workers(cpus: int | None = None) -> int:
    """Data-plane workers by default (``profiles.default_workers``), for this machine unless ``cpus``."""
    return _default_workers(cpus or affinity_cpus())


def parse_fuse_limit(text: str) -> int:
    value = parse_non_negative_int(text)
    if value > 65535:
        raise ValueError(f"must be at most 65535: {text!r}")
    return value


def default_max_background(cpus: int | None = None) -> int:
    """gcsfuse's FUSE ``max_background`` for zonal (Rapid) buckets: min(max(12, 2 x CPUs), 192)."""
    return min(max(12, 2 * (cpus or affinity_cpus())), 192)


def parse_log_level(text: str) -> str:
    if text.lower() not in ("debug", "info", "warning", "error"):
        raise ValueError(f"not a log level: {text!r} (debug, info, warning, error)")
    return text.lower()


_T = TypeVar("_T")


def setting(help: str, default: _T, parse: Callable[[str], _T], *, metavar: str | None = None,
            internal: bool = False) -> _T:
    """A field of :class:`Settings` that is also a flag taking a value (``parse`` raises ValueError).
    ``internal``: accepted, but not shown by ``--help`` (an escape hatch, or tuning for benchmarks)."""
    return field(default=default, metadata={"help": help, "parse": parse, "metavar": metavar, "internal": internal})


def switch(help: str, *, internal: bool = False) -> bool:
    """A field of :class:`Settings` that is also a flag taking no value (off by default)."""
    return field(default=False, metadata={"help": help, "parse": None, "metavar": None, "internal": internal})


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Every mount flag, as a typed field: its type, default, help and parser.

    This class is the flag table: :data:`FLAGS` (the command line, ``-o``,
    the config file, ``--print-config``) is built from its fields, in order,
    and ``--cache-size`` is the field ``cache_size``.
    """

    profile: str | None = setting(
        "defaults for a workload, sized to this machine: aiml-training, aiml-serving or aiml-checkpointing; "
        "any setting given wins over it (see docs/ml.md)", None, parse_profile, metavar="NAME")
    # -- where and how to connect
    endpoint: str = setting(
        "Storage gRPC endpoint, HOST:PORT or google-c2p:///HOST (TLS unless --anonymous)",
        "storage.googleapis.com:443", parse_endpoint, metavar="HOST:PORT")
    anonymous: bool = switch(
        "no credentials; a plaintext channel unless --ca-file (for an emulator; needs --endpoint)")
    key_file: str | None = setting(
        "service-account key (JSON) to authenticate with (default: Application Default Credentials)",
        None, str, metavar="PATH")
    billing_project: str | None = setting(
        "project billed for requests to requester-pays buckets (sent as x-goog-user-project on every call)",
        None, parse_project, metavar="PROJECT")
    directpath: bool = switch(
        "reach storage over DirectPath (google-c2p) from a GCP VM or GKE node with DirectPath networking")
    ca_file: str | None = setting(
        "PEM root certificates that sign the endpoint's TLS certificate (default: the system's roots)",
        None, str, metavar="PATH")
    bucket_type: str = setting(
        "auto (detect with GetStorageLayout), zonal or regional", "auto", parse_bucket_type, metavar="TYPE")
    emulator: bool = switch(
        "start the embedded emulator, create BUCKET if missing, and mount it (--endpoint, --anonymous, "
        "--ca-file and --directpath are then ignored)")
    emulator_dir: str | None = setting(
        "persist the embedded emulator's objects in DIR (default: in memory)", None, str, metavar="DIR")
    foreground: bool = switch("stay in the foreground (default: daemonize once the mount is live)")
    # -- what the mount looks like
    uid: int | None = setting("owner of every file and directory (default: the mounting user)", None, parse_id)
    gid: int | None = setting("group of every file and directory (default: the mounting group)", None, parse_id)
    file_mode: int = setting("permission bits of files, octal", 0o644, parse_mode, metavar="MODE")
    dir_mode: int = setting("permission bits of directories, octal", 0o755, parse_mode, metavar="MODE")
    preserve_mode: bool = switch(
        "keep chmod's permission bits of files in object metadata (key 'mode', as rclone writes it) and show "
        "them instead of --file-mode")
    only_dir: str = setting("mount only this prefix of the bucket (default: the whole bucket)", "", str,
                            metavar="PREFIX")
    no_permission_checks: bool = switch(
        "UNSAFE: with -o allow_other, let every user who reaches the mount read and change every file whatever "
        "its mode, owner and group (default: the kernel checks them)")
    # -- data cache and readahead
    cache_size: int = setting(
        "size of the shared-memory arena that holds the bytes the FUSE process and the workers pass each other: "
        "the block cache (blocks read, read ahead or scanned ahead, and fetches in flight) plus --transfer-buffer "
        "(direct reads, growing tails, appends not yet confirmed)", 256 * MiB, parse_size, metavar="BYTES")
    cache_block_size: int = setting(
        f"size of one cached block, {MIN_CACHE_BLOCK >> 10}KiB to {MAX_CACHE_BLOCK >> 20}MiB; cached reads fetch "
        "whole aligned blocks (2MiB is one gRPC chunk, so a block usually arrives without a copy)",
        2 * MiB, parse_size, metavar="BYTES")
    readahead_initial: int = setting(
        "first readahead window of a sequential reader; 0 turns readahead off", 4 * MiB, parse_size,
        metavar="BYTES")
    readahead_max: int = setting(
        "the readahead window doubles up to this size per file handle", 64 * MiB, parse_size, metavar="BYTES")
    readahead_step: int = setting(
        "readahead fetches blocks in steps of up to this many bytes (at most half the window), each step one "
        "call to a data-plane worker; 0 or the block size makes every block a call of its own", 8 * MiB, parse_size,
        metavar="BYTES", internal=True)
    small_file_size: int = setting(
        "finalized objects up to this size are fetched whole when opened, in the stream's first round trip; "
        "0 turns it off", 2 * MiB, parse_size, metavar="BYTES")
    read_streams: int = setting(
        "zonal buckets: at most N read streams per open file, the first opened at the first read, another "
        "whenever every open one has 2 ranges or 8 MiB in flight and the range starts at least 32 MiB further "
        "into the object per open stream, so a file under 32 MiB is read on one stream, in order "
        f"(1 to {MAX_READ_STREAMS})",
        4, parse_read_streams, metavar="N")
    prefetch_files: int = setting(
        "when files are opened in listing order (or in the order of an earlier pass), fetch the next N files' "
        "first block before they are opened; 0 turns it off", 32, parse_non_negative_int, metavar="N")
    prefetch_streams: int = setting(
        "files fetched ahead of a scan at once, each over its own stream (with --compose-prefetch, a quarter "
        "as many batches at once)", 16, parse_positive_int, metavar="N")
    compose_prefetch: bool = switch(
        "non-zonal buckets: fetch small files ahead of a scan up to 32 at a time, composed into a temporary "
        "object that is read once and deleted (needs write access)")
    kernel_read_ahead_kb: int = setting(
        "set the mount's kernel read_ahead_kb after mounting (root); 0 leaves it", 1024, parse_non_negative_int,
        metavar="KB")
    max_request_size: int = setting(
        f"the largest READ and WRITE the kernel sends the mount, {MIN_REQUEST >> 20}MiB to {MAX_REQUEST >> 20}MiB "
        "in whole pages, asked for in the INIT reply (1MiB with --pyfuse3-requests); above 1MiB the kernel-wide "
        "fs.fuse.max_pages_limit must allow it: the daemon raises that limit when it runs as root (never lowers it), else requests stay within it",
        4 * MiB, parse_size, metavar="BYTES")
    page_store_buffer: int = setting(
        "bytes each data-plane worker may hold while it stores read-ahead blocks straight into the kernel's "
        "page cache, so buffered reads and mmap of them never reach the FUSE process (the stored pages are "
        "charged to the workers' memory cgroup); 0 turns the stores off", 64 * MiB, parse_size, metavar="BYTES", internal=True)
    write_pipes: int = setting(
        "pipes a large WRITE (512KiB or more) is spliced into from /dev/fuse, so that its bytes are read by "
        "the data-plane worker appending the file, not by the FUSE process; each holds one WRITE's pages "
        "(about 2x --max-request-size of address space, no memory of its own) and fs.pipe-max-size must allow "
        "it, unless the daemon has CAP_SYS_RESOURCE: else it raises that limit when it runs as root (never "
        "lowers it); 0 reads every WRITE's bytes "
        f"in the FUSE process (at most {MAX_WRITE_PIPES})", 4, parse_non_negative_int, metavar="N", internal=True)
    no_direct_writes: bool = switch(
        "write-only opens write through the kernel's page cache, as other opens do (default: a write-only "
        "open bypasses it while no open of its file uses it, and every open of the file does until it is "
        "closed: the kernel then copies no written byte into pages that the next open would drop)", internal=True)
    no_worker_replies: bool = switch(
        "the FUSE process answers every READ itself (default: a data-plane worker writes the reply of a READ "
        "of at least 128 KiB from the shared memory the bytes are in, so that copy leaves the FUSE process)", internal=True)
    pyfuse3_requests: bool = switch(
        "serve every request through pyfuse3's and libfuse's loop, the reference the mount's own FUSE layer is "
        "tested against (default: the mount speaks the kernel's FUSE protocol itself); slower, and with no "
        "page-cache stores, no READ replies written by workers and no WRITE bytes left where the kernel put them", internal=True)
    max_background: int | None = setting(
        "the FUSE connection's max_background (requests the kernel keeps in flight, e.g. async readahead), "
        "asked for in the INIT reply (through fusectl after mounting with --pyfuse3-requests, as root); unset: min(max(12, 2 x CPUs), 192), as gcsfuse on zonal "
        "buckets; 0 leaves the kernel's default", None, parse_fuse_limit, metavar="N", internal=True)
    congestion_threshold: int | None = setting(
        "the FUSE connection's congestion_threshold, set as max_background is; unset: 3/4 of "
        "--max-background; 0 leaves the kernel's default", None, parse_fuse_limit, metavar="N", internal=True)
    # -- local cache
    cache_dir: str | None = setting(
        "keep whole objects read through the mount in DIR (on local disk, 0700, one mount at a time) and serve "
        "later opens of the same generation from there, read by the kernel itself through FUSE passthrough "
        "where it allows (Linux 6.9+, CAP_SYS_ADMIN), else by the mount; it survives remounts "
        "(default: off)", None, str, metavar="DIR")
    cache_dir_size: int | None = setting(
        "bytes --cache-dir may hold; the least recently used objects are evicted past it; unset: 90% of what "
        "its file system has free at mount, with what the cache holds already", None, parse_size,
        metavar="BYTES")
    cache_dir_fill_size: int = setting(
        "objects up to this size are copied whole into --cache-dir at their first read-only open, and that "
        "open reads from the copy as it is written; larger objects always come from the bucket",
        1 * GiB, parse_size, metavar="BYTES")
    no_passthrough: bool = switch(
        "the mount answers every read from --cache-dir itself (default: the kernel reads the cached file "
        "directly through FUSE passthrough where it allows)", internal=True)
    # -- data plane
    workers: int | None = setting(
        f"data-plane worker processes that make every gRPC call and receive the bytes (1 to {MAX_WORKERS}); "
        "unset: half the CPUs, at least 2 (1 on a single CPU) and at most 16", None, parse_workers, metavar="N")
    transfer_buffer: int | None = setting(
        "the part of --cache-size the block cache leaves to bytes on their way between the FUSE process and "
        "the workers: reads being received and appends the bucket has not confirmed yet (when the arena is "
        "full, bytes cross the workers' sockets instead); unset: a quarter of --cache-size",
        None, parse_size, metavar="BYTES", internal=True)
    worker_memory_limit: int = setting(
        "a data-plane worker whose private memory (its heap and anonymous maps, not the shared memory) passes "
        "this is replaced: a fresh worker takes its place, and the old one gets no new work and stops once its "
        "calls are done; this bounds what hours of heavy traffic fragment in a worker's heap; 0 turns it off "
        f"(else at least {MIN_WORKER_MEMORY_LIMIT >> 20}MiB)", 1 * GiB, parse_size, metavar="BYTES")
    worker_allocator: str = setting(
        "the data-plane workers' malloc: glibc, jemalloc (preloaded; it keeps sizes apart and gives idle pages "
        "back on its own, for about 15% more worker CPU on sequential reads), or auto: jemalloc when "
        "libjemalloc.so.2 is installed, else glibc", "glibc", parse_worker_allocator, metavar="NAME", internal=True)
    # -- writes
    write_buffer: int = setting(
        "bytes of one file being written kept until the bucket confirms them; write() waits past it",
        32 * MiB, parse_size, metavar="BYTES")
    temp_dir: str | None = setting(
        "where writes that cannot stream (random writes, truncation) are staged (default: the system's "
        "temporary directory)", None, str, metavar="DIR")
    finalize_on_close: bool = switch(
        "finalize objects written on zonal buckets when their last writer closes them (default: leave them "
        "appendable)")
    rename_dir_limit: int = setting(
        "on buckets without folders, rename a directory of at most this many objects, one by one (not "
        "atomic); 0 refuses", 0, parse_non_negative_int, metavar="N")
    # -- metadata cache
    metadata_ttl: float = setting(
        "seconds a file's attributes are trusted; -1 = forever (immutable data)", 60.0, parse_seconds,
        metavar="SECONDS")
    negative_ttl: float = setting(
        "seconds a 'does not exist' answer is trusted, a listing's silence included (names other clients "
        "create show within it)", 5.0, parse_seconds, metavar="SECONDS")
    listing_ttl: float | None = setting(
        "seconds a directory listing is trusted for readdir and the names it holds (default: --metadata-ttl)",
        None, parse_seconds, metavar="SECONDS")
    metadata_cache_size: int = setting(
        "byte budget (estimated) of the metadata cache: attributes, 'does not exist' answers and listings",
        64 * MiB, parse_size, metavar="BYTES")
    prefetch_metadata: bool = switch(
        "at mount time, list the whole mounted tree in the background, in parallel, and fill the metadata "
        "cache (stops if it does not fit in --metadata-cache-size)")
    prefetch_metadata_workers: int = setting(
        f"concurrent ListObjects calls of --prefetch-metadata (1 to {MAX_LISTING_CALLS})",
        8, parse_prefetch_metadata_workers, metavar="N")
    # -- reliability
    connect_timeout: float = setting(
        "seconds to wait at mount time for the endpoint, and for the first access token, before giving up",
        15.0, parse_positive_seconds, metavar="SECONDS")
    retry_deadline: float = setting(
        "seconds to keep retrying a failing request, counted from its last progress, before EIO",
        30.0, parse_positive_seconds, metavar="SECONDS")
    stall_timeout: float = setting(
        "seconds without progress before a read stream is considered broken; a data-plane worker that does not "
        "answer its heartbeat for this long (at most 10 s) is killed and replaced", 60.0, parse_positive_seconds,
        metavar="SECONDS")
    # -- logs
    log_level: str = setting("debug, info, warning or error", "info", parse_log_level, metavar="LEVEL")
    log_file: str | None = setting(
        "append logs to PATH (default: stderr in the foreground, nowhere as a daemon); SIGHUP reopens it",
        None, str, metavar="PATH")
    log_format: str = setting("text, or json (one JSON object per line)", "text", parse_log_format,
                              metavar="FORMAT")
    # -- metrics
    prometheus_port: int = setting(
        "serve Prometheus metrics at http://ADDRESS:PORT/metrics; 0 = off", 0, parse_port, metavar="PORT")
    prometheus_address: str = setting(
        "address the metrics endpoint listens on", "127.0.0.1", parse_listen_address, metavar="ADDRESS")

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


@dataclass(frozen=True)
class Flag:
    """One command-line flag: ``--name`` sets the field ``<dest>`` of :class:`Settings`."""

    name: str
    help: str
    default: object = None
    parse: Callable[[str], object] | None = None  # raises ValueError with a clear message
    is_switch: bool = False
    metavar: str | None = None
    internal: bool = False  # hidden from --help; documented under "Internal flags"

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


FLAGS: tuple[Flag, ...] = tuple(
    Flag("--" + each.name.replace("_", "-"), each.metadata["help"], each.default, each.metadata["parse"],
         each.metadata["parse"] is None, each.metadata["metavar"], each.metadata["internal"])
    for each in fields(Settings))

FLAG_BY_DEST = {flag.dest: flag for flag in FLAGS}

# -o options understood (besides flags spelled as key=value).
MOUNT_OPTIONS = ("ro", "rw", "allow_other", "default_permissions")


class MountConfig(Settings):
    """One mount: its bucket and mount point, the mount switches, and its settings (:class:`Settings`).

    The settings stay frozen to everyone else: :meth:`give` is how the
    command line, ``-o``, the config file and ``--profile`` set one, and it
    records where the value came from.
    """

    # A mount's configuration is one object that changes as it is built, not a value to compare.
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __init__(self, bucket: str, mountpoint: str, read_only: bool = False, allow_other: bool = False,
                 default_permissions: bool = False, values: dict[str, Any] | None = None,
                 sources: dict[str, str] | None = None) -> None:
        values = {} if values is None else values
        super().__init__(**values)
        self.bucket = bucket
        self.mountpoint = mountpoint
        self.read_only = read_only
        self.allow_other = allow_other
        self.default_permissions = default_permissions
        #: the settings given (the rest are defaults), by field name
        self.values = values
        #: where each setting given came from (``profile NAME``, ``config file PATH``, ``flag``, ``-o``)
        self.sources: dict[str, str] = {} if sources is None else sources

    def __repr__(self) -> str:
        return f"MountConfig({self.bucket!r}, {self.mountpoint!r}, values={self.values!r})"

    def give(self, dest: str, value: object, source: str) -> None:
        """Set the setting ``dest`` to ``value`` (already parsed), given by ``source``."""
        if dest not in FLAG_BY_DEST:
            raise KeyError(f"no such setting: {dest!r}")
        self.values[dest] = value
        self.sources[dest] = source
        object.__setattr__(self, dest, value)  # the frozen dataclass's own way to set a field

    def source_of(self, dest: str) -> str:
        return self.sources.get(dest, "default")

    @property
    def permission_checks(self) -> bool:
        """Whether the kernel checks modes, owner and group (FUSE's default_permissions).

        With allow_other, other users reach the mount with its credentials:
        the modes are then the only thing that keeps them out, so the checks
        are on unless explicitly turned off."""
        return self.default_permissions or (self.allow_other and not self.no_permission_checks)


class ConfigError(ValueError):
    """A bad flag or option value; the message names it."""


def apply_mount_options(config: MountConfig, options: list[str], source: str = "-o") -> None:
    """Apply ``-o a,b=c`` options (mount(8) style) to ``config``."""
    for group in options:
        for item in filter(None, (part.strip() for part in group.split(","))):
            key, sep, value = item.partition("=")
            if key == "ro" and not sep:
                config.read_only, config.sources["read_only"] = True, source
            elif key == "rw" and not sep:
                config.read_only, config.sources["read_only"] = False, source
            elif key == "allow_other" and not sep:
                config.allow_other, config.sources["allow_other"] = True, source
            elif key == "default_permissions" and not sep:
                config.default_permissions, config.sources["default_permissions"] = True, source
            else:
                dest = key.replace("-", "_")
                flag = FLAG_BY_DEST.get(dest)
                if flag is None:
                    raise ConfigError(f"unknown mount option: {key!r}")
                config.give(dest, _parse_flag(flag, value if sep else None), source)


def _parse_flag(flag: Flag, value: str | None) -> object:
    if flag.is_switch:
        if value in (None, "", "true", "1", "yes"):
            return True
        if value in ("false", "0", "no"):
            return False
        raise ConfigError(f"{flag.name}: expected true or false, got {value!r}")
    if value is None:
        raise ConfigError(f"{flag.name} needs a value")
    try:
        return flag.parse(value) if callable(flag.parse) else value
    except ValueError as err:
        raise ConfigError(f"{flag.name}: {err}") from None


def add_flags(parser: argparse.ArgumentParser) -> None:
    for flag in FLAGS:
        help_text = argparse.SUPPRESS if flag.internal else flag.help.replace("%", "%%")  # argparse formats with %
        if flag.is_switch:
            parser.add_argument(flag.name, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag.name, default=None, metavar=flag.metavar, help=help_text)


def load_config_file(path: str) -> dict[str, Any]:
    """Flag values from a TOML file: every flag has a key of the same name.

    Keys are flag names without ``--`` (``cache-size``); ``cache_size`` is
    accepted too, as in ``-o``, but not both for one flag. ``options`` takes a
    list (or a string) of ``-o`` options. An unknown key or a bad value is an
    error naming the key.
    """
    import tomllib

    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"--config-file: cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config-file: {path} is not valid TOML: {err}") from None
    values: dict[str, Any] = {}
    for key, value in document.items():
        dest = key.replace("-", "_")
        if dest in values:
            raise ConfigError(f"{path}: key {key!r} is given twice (with - and with _)")
        if dest == "options":
            values["options"] = [value] if isinstance(value, str) else [str(v) for v in value]
            continue
        flag = FLAG_BY_DEST.get(dest)
        if flag is None or isinstance(value, dict):
            raise ConfigError(f"{path}: unknown key {key!r}")
        if flag.is_switch:
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: key {key!r} must be true or false")
            values[dest] = value
        else:
            try:
                values[dest] = flag.parse(str(value)) if callable(flag.parse) else str(value)
            except ValueError as err:
                raise ConfigError(f"{path}: key {key!r}: {err}") from None
    return values


def apply_profile(config: MountConfig, machine: Machine | None = None) -> None:
    """Fill the settings nobody gave with the profile's (``config.profile``)."""
    if config.profile is None:
        return
    source = f"profile {config.profile}"
    for dest, value in profile_settings(config.profile, machine or this_machine()).items():
        if dest not in config.sources:
            config.give(dest, value, source)
    if config.source_of("readahead_initial") == source and config.readahead_initial > config.readahead_max:
        config.give("readahead_initial", config.readahead_max, source)  # the user's smaller --readahead-max wins


def config_from_args(args: argparse.Namespace) -> MountConfig:
    config = MountConfig(bucket=args.bucket, mountpoint=args.mountpoint)
    if getattr(args, "config_file", None):
        from_file = load_config_file(args.config_file)
        source = f"config file {args.config_file}"
        apply_mount_options(config, from_file.pop("options", []), source)
        for dest, value in from_file.items():
            config.give(dest, value, source)
    for flag in FLAGS:
        raw = getattr(args, flag.dest)
        if raw is None:
            continue
        config.give(flag.dest, True if flag.is_switch else _parse_flag(flag, raw), "flag")
    apply_mount_options(config, args.options or [])
    apply_profile(config)
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


# -- the effective configuration, as TOML (--print-config) -------------------------------------------

_MOUNT_SWITCHES = (("read_only", "ro"), ("allow_other", "allow_other"), ("default_permissions", "default_permissions"))


def _toml_value(flag: Flag, value: object) -> str:
    """``value`` as the config file takes it back (modes as octal strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if flag.parse is parse_mode:
        return f'"{value:04o}"'
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


def effective_toml(config: MountConfig) -> str:
    """Every setting in force, as a TOML config file that ``--config-file``
    takes back, each line saying where its value came from."""
    lines = [f"# rapidmount {config.bucket} {config.mountpoint}: the settings in force, and where each came from"]
    options = [option for dest, option in _MOUNT_SWITCHES if getattr(config, dest)]
    option_sources = sorted({config.source_of(dest) for dest, _ in _MOUNT_SWITCHES if getattr(config, dest)})
    lines.append(f"options = {json.dumps(options)}  # {', '.join(option_sources) or 'default'}")
    for flag in FLAGS:
        value = getattr(config, flag.dest)
        key = flag.name.lstrip("-")
        source = config.source_of(flag.dest)
        if value is None:
            lines.append(f"# {key} is unset  # {source}")
        else:
            lines.append(f"{key} = {_toml_value(flag, value)}  # {source}")
    return "\n".join(lines) + "\n"
