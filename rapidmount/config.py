"""Every mount flag, its default and its validation, in one place.

The command line (``cli.py``) is built from :data:`FLAGS`, and
``docs/configuration.md`` is checked against it by a test.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field

from rapidmount.profiles import Machine, affinity_cpus, parse_profile, this_machine
from rapidmount.profiles import default_workers as _default_workers
from rapidmount.profiles import settings as profile_settings
from rapidmount.storage.model import is_bucket_name

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: Below this a worker could pass --worker-memory-limit just by starting.
MIN_WORKER_MEMORY_LIMIT = 32 * MiB

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


def _parse_count_up_to(limit: int):
    """A parser of a whole number from 1 to ``limit``."""
    def parse(text: str) -> int:
        value = parse_positive_int(text)
        if value > limit:
            raise ValueError(f"must be at most {limit}: {text!r}")
        return value
    return parse


#: --prefetch-metadata-workers: concurrent ListObjects calls.
parse_listing_concurrency = _parse_count_up_to(256)
#: --read-streams and --workers.
parse_up_to_64 = _parse_count_up_to(64)


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


@dataclass(frozen=True)
class Flag:
    """One command-line flag: ``--name`` maps to ``MountConfig.<dest>``."""

    name: str
    help: str
    default: object = None
    parse: object = None  # str -> value; raises ValueError with a clear message
    is_switch: bool = False
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


FLAGS: tuple[Flag, ...] = (
    Flag("--profile", "defaults for a workload, sized to this machine: aiml-training, aiml-serving or "
         "aiml-checkpointing; any setting given wins over it (docs/ml.md)", None, parse_profile, metavar="NAME"),
    # -- where and how to connect
    Flag("--endpoint", "Storage gRPC endpoint HOST:PORT (TLS unless --anonymous)",
         "storage.googleapis.com:443", parse_endpoint, metavar="HOST:PORT"),
    Flag("--anonymous", "no credentials; a plaintext channel unless --ca-file (for an emulator; "
         "needs --endpoint)", False, is_switch=True),
    Flag("--key-file", "service-account key (JSON) to authenticate with "
         "(default: Application Default Credentials)", None, str, metavar="PATH"),
    Flag("--billing-project", "project billed for requests to requester-pays buckets "
         "(sent as x-goog-user-project on every call)", None, parse_project, metavar="PROJECT"),
    Flag("--directpath", "reach storage over DirectPath (google-c2p) from a GCP VM or GKE node "
         "with DirectPath networking", False, is_switch=True),
    Flag("--ca-file", "PEM root certificates that sign the endpoint's TLS certificate "
         "(default: the system's roots)", None, str, metavar="PATH"),
    Flag("--bucket-type", "auto (detect with GetStorageLayout), zonal or regional",
         "auto", parse_bucket_type, metavar="TYPE"),
    Flag("--emulator", "start the embedded emulator, create BUCKET if missing, and mount it", False,
         is_switch=True),
    Flag("--emulator-dir", "persist the embedded emulator's objects in DIR (default: in memory)",
         None, str, metavar="DIR"),
    Flag("--foreground", "stay in the foreground (default: daemonize once the mount is live)",
         False, is_switch=True),
    # -- what the mount looks like
    Flag("--uid", "owner of every file and directory (default: the mounting user)", None, parse_id),
    Flag("--gid", "group of every file and directory (default: the mounting group)", None, parse_id),
    Flag("--file-mode", "permission bits of files, octal", 0o644, parse_mode, metavar="MODE"),
    Flag("--dir-mode", "permission bits of directories, octal", 0o755, parse_mode, metavar="MODE"),
    Flag("--preserve-mode", "keep chmod's permission bits of files in object metadata (key 'mode', as "
         "rclone writes it) and show them instead of --file-mode", False, is_switch=True),
    Flag("--only-dir", "mount only this prefix of the bucket", "", str, metavar="PREFIX"),
    Flag("--no-permission-checks", "UNSAFE: with -o allow_other, let every user who reaches the mount read "
         "and change every file whatever its mode, owner and group (default: the kernel checks them)",
         False, is_switch=True),
    # -- data cache and readahead
    Flag("--cache-size", "byte budget of the shared-memory arena where read bytes live: the block cache "
         "(shared by all files) plus --transfer-buffer",
         256 * MiB, parse_size, metavar="BYTES"),
    Flag("--cache-block-size", "size of one cached block; reads are fetched in aligned blocks "
         "(2MiB is one gRPC chunk, so blocks arrive without a copy)",
         2 * MiB, parse_size, metavar="BYTES"),
    Flag("--readahead-initial", "first readahead window of a sequential reader",
         4 * MiB, parse_size, metavar="BYTES"),
    Flag("--readahead-max", "the readahead window doubles up to this size per file handle",
         64 * MiB, parse_size, metavar="BYTES"),
    Flag("--small-file-size", "finalized objects up to this size are fetched whole when opened, in the "
         "stream's first round trip; 0 turns it off", 2 * MiB, parse_size, metavar="BYTES"),
    Flag("--read-streams", "zonal buckets: at most N read streams per open file, the first opened at "
         "the first read, another whenever every open one has 2 ranges or 8 MiB in flight (1 to 64)",
         4, parse_up_to_64, metavar="N"),
    Flag("--prefetch-files", "when files are opened in listing order (or in the order of an earlier "
         "pass), fetch the next N files' first block before they are opened; 0 turns it off",
         32, parse_non_negative_int, metavar="N"),
    Flag("--prefetch-streams", "streams fetching files ahead of a scan at once",
         16, parse_positive_int, metavar="N"),
    Flag("--compose-prefetch", "non-zonal buckets: fetch small files ahead of a scan 32 at a time, "
         "composed into a temporary object that is read once and deleted (needs write access)",
         False, is_switch=True),
    Flag("--kernel-read-ahead-kb", "set the mount's kernel read_ahead_kb after mounting (root); 0 leaves it",
         1024, parse_non_negative_int, metavar="KB"),
    Flag("--page-store-buffer", "bytes each data-plane worker may hold while it stores read-ahead blocks "
         "straight into the kernel's page cache, so buffered reads and mmap of them never reach the FUSE "
         "process (the stored pages are charged to the workers' memory cgroup); 0 turns the stores off",
         64 * MiB, parse_size, metavar="BYTES"),
    Flag("--max-background", "after mounting, set the FUSE connection's max_background (requests the "
         "kernel keeps in flight, e.g. async readahead) through fusectl (root); unset: "
         "min(max(12, 2 x CPUs), 192), as gcsfuse on zonal buckets; 0 leaves the kernel's default",
         None, parse_fuse_limit, metavar="N"),
    Flag("--congestion-threshold", "after mounting, set the FUSE connection's congestion_threshold "
         "(root); unset: 3/4 of --max-background; 0 leaves the kernel's default",
         None, parse_fuse_limit, metavar="N"),
    # -- data plane
    Flag("--workers", "data-plane worker processes that make every gRPC call and receive the bytes (1 to 64); "
         "unset: half the CPUs, at least 1 and at most 16", None, parse_up_to_64, metavar="N"),
    Flag("--transfer-buffer", "the part of --cache-size kept for bytes between the FUSE process and the "
         "workers: reads being received and appends the bucket has not confirmed yet (past it, bytes cross "
         "the workers' sockets instead); the page cache holds the rest; unset: a quarter of --cache-size",
         None, parse_size, metavar="BYTES"),
    Flag("--worker-memory-limit", "a data-plane worker whose private memory (its heap and anonymous maps, "
         "not the shared memory) passes this is replaced, as after a crash: reads and appends go on on "
         "another worker, and calls in flight are made again there; this bounds what hours of heavy traffic "
         "fragment in a worker's heap; "
         "0 turns it off (else at least 32MiB)", 1 * GiB, parse_size, metavar="BYTES"),
    # -- writes
    Flag("--write-buffer", "bytes of one file being written kept until the bucket confirms them; "
         "write() waits past it", 32 * MiB, parse_size, metavar="BYTES"),
    Flag("--temp-dir", "where writes that cannot stream (random writes, truncation) are staged",
         None, str, metavar="DIR"),
    Flag("--finalize-on-close", "finalize objects written on zonal buckets when the file is closed "
         "(default: leave them appendable)", False, is_switch=True),
    Flag("--rename-dir-limit", "on buckets without folders, rename a directory of at most this many "
         "objects, one by one (not atomic); 0 refuses", 0, parse_non_negative_int, metavar="N"),
    # -- metadata cache
    Flag("--metadata-ttl", "seconds a file's attributes are trusted; -1 = forever (immutable data)",
         60.0, parse_seconds, metavar="SECONDS"),
    Flag("--negative-ttl", "seconds a 'does not exist' answer is trusted, a listing's silence included "
         "(names other clients create show within it)", 5.0, parse_seconds,
         metavar="SECONDS"),
    Flag("--listing-ttl", "seconds a directory listing is trusted for readdir and the names it holds "
         "(default: --metadata-ttl)",
         None, parse_seconds, metavar="SECONDS"),
    Flag("--metadata-cache-size", "byte budget of the metadata and directory-entry cache",
         64 * MiB, parse_size, metavar="BYTES"),
    Flag("--prefetch-metadata", "at mount time, list the whole mounted tree in the background, in "
         "parallel, and fill the metadata cache (stops if it does not fit in --metadata-cache-size)",
         False, is_switch=True),
    Flag("--prefetch-metadata-workers", "concurrent ListObjects calls of --prefetch-metadata (1 to 256)",
         8, parse_listing_concurrency, metavar="N"),
    # -- reliability
    Flag("--connect-timeout", "seconds to wait for the endpoint at mount time before giving up", 15.0,
         parse_positive_seconds, metavar="SECONDS"),
    Flag("--retry-deadline", "seconds to keep retrying a failing request before EIO", 30.0,
         parse_positive_seconds, metavar="SECONDS"),
    Flag("--stall-timeout", "seconds without progress before a stream is considered broken", 60.0,
         parse_positive_seconds, metavar="SECONDS"),
    # -- logs
    Flag("--log-level", "debug, info, warning or error", "info", parse_log_level, metavar="LEVEL"),
    Flag("--log-file", "append logs to PATH (default: stderr in the foreground, nowhere as a daemon); "
         "SIGHUP reopens it", None, str, metavar="PATH"),
    Flag("--log-format", "text, or json (one JSON object per line)", "text", parse_log_format,
         metavar="FORMAT"),
    # -- metrics
    Flag("--prometheus-port", "serve Prometheus metrics at http://ADDRESS:PORT/metrics; 0 = off",
         0, parse_port, metavar="PORT"),
    Flag("--prometheus-address", "address the metrics endpoint listens on", "127.0.0.1",
         parse_listen_address, metavar="ADDRESS"),
)

FLAG_BY_DEST = {flag.dest: flag for flag in FLAGS}

# -o options understood (besides flags spelled as key=value).
MOUNT_OPTIONS = ("ro", "rw", "allow_other", "default_permissions")


@dataclass
class MountConfig:
    bucket: str
    mountpoint: str
    read_only: bool = False
    allow_other: bool = False
    default_permissions: bool = False
    values: dict = field(default_factory=dict)
    #: where each setting given came from (``profile NAME``, ``config file PATH``, ``flag``, ``-o``);
    #: the rest are defaults
    sources: dict = field(default_factory=dict)

    def source_of(self, dest: str) -> str:
        return self.sources.get(dest, "default")

    def __getattr__(self, name: str):
        values = self.__dict__.get("values", {})
        if name in values:
            return values[name]
        if name in FLAG_BY_DEST:
            return FLAG_BY_DEST[name].default
        raise AttributeError(name)

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
                config.values[dest] = _parse_flag(flag, value if sep else None)
                config.sources[dest] = source


def _parse_flag(flag: Flag, value: str | None):
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
        if flag.is_switch:
            parser.add_argument(flag.name, action="store_true", default=None, help=flag.help)
        else:
            parser.add_argument(flag.name, default=None, metavar=flag.metavar, help=flag.help)


def load_config_file(path: str) -> dict:
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
    values: dict = {}
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
            config.values[dest] = value
            config.sources[dest] = source
    if config.source_of("readahead_initial") == source and config.readahead_initial > config.readahead_max:
        config.values["readahead_initial"] = config.readahead_max  # the user's smaller --readahead-max wins


def config_from_args(args: argparse.Namespace) -> MountConfig:
    config = MountConfig(bucket=args.bucket, mountpoint=args.mountpoint)
    if getattr(args, "config_file", None):
        from_file = load_config_file(args.config_file)
        source = f"config file {args.config_file}"
        apply_mount_options(config, from_file.pop("options", []), source)
        config.values.update(from_file)
        config.sources.update(dict.fromkeys(from_file, source))
    for flag in FLAGS:
        raw = getattr(args, flag.dest)
        if raw is None:
            continue
        config.values[flag.dest] = True if flag.is_switch else _parse_flag(flag, raw)
        config.sources[flag.dest] = "flag"
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
    if config.cache_block_size < 4 * KiB or config.cache_block_size > 64 * MiB:
        raise ConfigError("--cache-block-size: must be between 4KiB and 64MiB")
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
    if config.readahead_initial > config.readahead_max:
        raise ConfigError("--readahead-initial: must not exceed --readahead-max")
    if config.only_dir and (config.only_dir.startswith("/") or "//" in config.only_dir):
        raise ConfigError(f"--only-dir: not a valid prefix: {config.only_dir!r}")


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
