"""The flag table: every mount setting's flag, type, default, help and parser.

:class:`Settings` declares each setting as a typed field, and :data:`FLAGS`
is built from its fields, in order. The command line (:func:`add_flags`),
``-o``, the config file and ``--print-config`` all work from :data:`FLAGS`,
and a test checks ``docs/configuration.md`` against it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TypeVar

from rapidmount.daemon.flag_values import (
    MAX_CACHE_BLOCK,
    MAX_LISTING_CALLS,
    MAX_READ_STREAMS,
    MAX_REQUEST,
    MAX_WORKERS,
    MAX_WRITE_PIPES,
    MIN_CACHE_BLOCK,
    MIN_REQUEST,
    MIN_WORKER_MEMORY_LIMIT,
    GiB,
    MiB,
    parse_bucket_type,
    parse_endpoint,
    parse_fuse_limit,
    parse_id,
    parse_listen_address,
    parse_log_format,
    parse_log_level,
    parse_mode,
    parse_non_negative_int,
    parse_port,
    parse_positive_int,
    parse_positive_seconds,
    parse_prefetch_metadata_workers,
    parse_project,
    parse_read_streams,
    parse_seconds,
    parse_size,
    parse_worker_allocator,
    parse_workers,
)
from rapidmount.daemon.profiles import parse_profile

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


class ConfigError(ValueError):
    """A bad flag or option value; the message names it."""


def parse_flag_value(flag: Flag, value: str | None) -> object:
    """The value of ``flag`` given as ``value`` (None: named without one, as ``-o`` allows a switch)."""
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
    """Every flag of :data:`FLAGS` on ``parser``; a flag not given is None there."""
    for flag in FLAGS:
        help_text = argparse.SUPPRESS if flag.internal else flag.help.replace("%", "%%")  # argparse formats with %
        if flag.is_switch:
            parser.add_argument(flag.name, action="store_true", default=None, help=help_text)
        else:
            parser.add_argument(flag.name, default=None, metavar=flag.metavar, help=help_text)
