"""Run one mount: connect, check the bucket, mount, serve until a signal.

Structured as trio wants it: one nursery owns the FUSE main loop, the
signal watcher, the post-mount tuning and every background fetch; leaving it
cancels them all before the mount is closed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from typing import Any

import pyfuse3
import trio

from rapidmount.shared import allocator, logs
from rapidmount.shared.sysctl import raise_limit
from rapidmount.shared import auth
from rapidmount.shared.channel_plan import plan_channel
from rapidmount.daemon.config import MountConfig
from rapidmount.daemon.core_settings import core_settings
from rapidmount.core import Filesystem
from rapidmount.shared.arena import Arena
from rapidmount.dataplane.pool import WorkerPool
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.dataplane.store import WorkerStore
from rapidmount.dataplane.token_pusher import TokenPusher
from rapidmount.fuse.write_pipes import WritePipes, open_write_pipes
from rapidmount.shared.exits import MountError
from rapidmount.shared import fuse_abi as abi
from rapidmount.shared.fuse_abi import FUSECTL_ROOT
from rapidmount.fuse import loop as fuse_loop
from rapidmount.fuse import mount as fuse_mount
from rapidmount.fuse.channel import Channel
from rapidmount.fuse.init import ProtocolTooOld, Wants
from rapidmount.fuse.invalidate import KernelNotifier, over_channel
from rapidmount.fuse.loop import RequestLoop, handshake
from rapidmount.fuse.operations import Operations
from rapidmount.fuse.passthrough import DeviceBackingFiles
from rapidmount.fuse.reference import FuseOperations
from rapidmount.localcache.cache import LocalCache
from rapidmount.localcache.directory import CacheDirError, CacheDirectory
from rapidmount.fuse.stats import OperationStats
from rapidmount.daemon.notify import notify

log = logging.getLogger("rapidmount")

FUSE_MIN_TASKS = 4  # tasks left waiting for requests
FUSE_MAX_TASKS = 128
FUSECTL_MOUNT_TIMEOUT = 10.0
MAX_PAGES_LIMIT = "/proc/sys/fs/fuse/max_pages_limit"  # the kernel-wide cap of a FUSE request, in pages


def _first_token(config: MountConfig) -> auth.TokenSource:
    """Load the credentials and get a first token (blocking; one-line errors)."""
    try:
        credentials = auth.load_credentials(config.key_file)
        log.info("credentials: %s", auth.credentials_kind(credentials))
        tokens = auth.TokenSource(credentials)
        tokens.fetch(config.connect_timeout)
    except auth.CredentialsError as err:
        raise MountError(str(err)) from None
    return tokens


def _read_ca_file(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            pem = f.read()
    except OSError as err:
        raise MountError(f"--ca-file: cannot read {path}: {err.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise MountError(f"--ca-file: {path} holds no PEM certificate")
    return pem


def worker_settings(config: MountConfig, endpoint: str, anonymous: bool) -> WorkerSettings:
    # The embedded emulator is plaintext and anonymous, whatever the flags say.
    ca_file = None if config.emulator else config.ca_file
    directpath = config.directpath and not config.emulator
    try:
        plan = plan_channel(endpoint, anonymous=anonymous, directpath=directpath, ca_file=ca_file is not None)
    except ValueError as err:
        raise MountError(str(err)) from None
    log.info("connecting to %s", plan.describe())
    return WorkerSettings(
        bucket=config.bucket, endpoint=endpoint, anonymous=anonymous, directpath=directpath,
        ca_pem=_read_ca_file(ca_file) if ca_file is not None else None, billing_project=config.billing_project,
        bucket_type=config.bucket_type, tokens=plan.tokens, connect_timeout=config.connect_timeout,
        retry_deadline=config.retry_deadline, stall_timeout=config.stall_timeout, write_buffer=config.write_buffer,
        arena_size=0, log_level=config.log_level, log_file=config.log_file, log_format=config.log_format,
        log_to_stderr=config.foreground, memory_limit=config.worker_memory_limit,
        page_store_buffer=config.page_store_buffer, allocator=_worker_allocator(config.worker_allocator))


def _worker_allocator(choice: str) -> str:
    try:
        resolved = allocator.resolve_worker_allocator(choice)
    except ValueError as err:
        raise MountError(f"--worker-allocator jemalloc: {err}") from None
    if resolved == "glibc" and choice == "auto":
        log.info("--worker-allocator auto: libjemalloc.so.2 is not installed; the workers use glibc's malloc")
    return resolved


def _mount_options(config: MountConfig) -> fuse_mount.MountOptions:
    return fuse_mount.MountOptions(fsname=f"rapidmount:{config.bucket}", subtype="rapidmount",
                                   read_only=config.read_only, allow_other=config.allow_other,
                                   default_permissions=config.permission_checks, auto_unmount=True)


def _pyfuse3_options(options: fuse_mount.MountOptions) -> set[str]:
    """The same options, as pyfuse3 (libfuse) takes them."""
    chosen = {f"fsname={options.fsname}", f"subtype={options.subtype}", "noatime", "auto_unmount"}
    for name, wanted in (("ro", options.read_only), ("allow_other", options.allow_other),
                         ("default_permissions", options.default_permissions)):
        if wanted:
            chosen.add(name)
    return chosen


def _bdi_of(mountpoint: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """``major:minor`` of the mount, from /proc (no FUSE round trip)."""
    found = None
    with open(mountinfo, encoding="utf-8", errors="replace") as info:
        for line in info:
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == mountpoint:
                found = fields[2]  # the last match is the mount on top
    return found


def kernel_request_size(wanted: int, knob: str = MAX_PAGES_LIMIT) -> int:
    """The largest FUSE request, at most ``wanted`` bytes, the kernel will
    allow a mount made now: it takes its cap from the kernel-wide
    ``fs.fuse.max_pages_limit`` when the mount is made. A lower limit is
    raised to ``wanted`` (root only); it is never lowered."""
    page, smallest = fuse_loop.PAGE, fuse_loop.MAX_WRITE
    limit, refused = raise_limit(knob, wanted // page, f"pages, for FUSE requests of {wanted >> 10} KiB")
    if limit is None:
        return smallest  # a kernel without the knob: 256 pages, fixed
    if refused is not None:
        log.info("FUSE requests stay within %d KiB: fs.fuse.max_pages_limit is %d pages and could not be "
                 "raised (%s)", max(limit * page, smallest) >> 10, limit, refused.strerror)
    return max(smallest, min(wanted, limit * page))


def set_kernel_read_ahead(mountpoint: str, kb: int) -> None:
    """Let buffered reads reach us as large requests (needs root; per mount)."""
    bdi = _bdi_of(mountpoint)
    if bdi is None:
        return
    try:
        with open(f"/sys/class/bdi/{bdi}/read_ahead_kb", "w") as knob:
            knob.write(str(kb))
        log.info("kernel read_ahead_kb set to %d for %s", kb, mountpoint)
    except OSError as err:
        log.info("could not set read_ahead_kb (%s); buffered reads stay at 128 KiB", err.strerror)


def fuse_connection_id(bdi: str) -> int:
    """The fusectl directory name of a FUSE mount whose ``st_dev`` is ``major:minor``.

    The kernel names it after the superblock's ``dev_t`` in its own encoding,
    ``major << 20 | minor``; a FUSE mount's device is anonymous (major 0), so
    this is the minor number.
    """
    major, sep, minor = bdi.partition(":")
    if not sep or not major.isdigit() or not minor.isdigit():
        raise ValueError(f"not major:minor: {bdi!r}")
    return int(major) << 20 | int(minor)


def ensure_fusectl(root: str = FUSECTL_ROOT) -> str | None:
    """Mount the FUSE control file system on ``root`` unless it is there.

    Returns None once it is mounted, else why not (no root, no ``mount``...).
    """
    if os.path.ismount(root):
        return None
    if not os.path.isdir(root):
        return f"{root} does not exist"
    try:
        done = subprocess.run(["mount", "-t", "fusectl", "fusectl", root], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=FUSECTL_MOUNT_TIMEOUT)
    except FileNotFoundError:
        reason = fuse_mount.mount_fusectl(root)  # no mount(8) here: ask the kernel directly
    except subprocess.TimeoutExpired:
        reason = f"mount -t fusectl did not finish within {FUSECTL_MOUNT_TIMEOUT:.0f}s"
    else:
        reason = None if done.returncode == 0 else (
            " ".join(done.stderr.split()) or f"mount exited with {done.returncode}")
    if os.path.ismount(root):  # ours, or another daemon's that won the race
        log.debug("mounted fusectl on %s", root)
        return None
    return reason or f"{root} is still not a mount point"


def set_fuse_limits(mountpoint: str, max_background: int, congestion_threshold: int,
                    root: str = FUSECTL_ROOT) -> None:
    """Set the FUSE connection's ``max_background`` and ``congestion_threshold``
    through fusectl, mounting it if needed (needs root; 0 leaves a knob alone).

    Never fails the mount: a refusal is one info line.
    """
    bdi = _bdi_of(mountpoint)
    if bdi is None or not (max_background or congestion_threshold):
        return
    connection = fuse_connection_id(bdi)
    why = ensure_fusectl(root)
    if why is not None:
        log.info("could not mount fusectl on %s (%s); FUSE max_background and congestion_threshold "
                 "stay the kernel's", root, why)
        return
    directory = os.path.join(root, str(connection))
    for name, value in (("max_background", max_background), ("congestion_threshold", congestion_threshold)):
        if not value:
            continue
        try:
            with open(os.path.join(directory, name), "w") as knob:
                knob.write(str(value))
        except OSError as err:
            log.info("could not set FUSE %s to %d for %s (%s); it stays the kernel's", name, value,
                     mountpoint, err.strerror)
            return
    now = [_read_knob(directory, "max_background"), _read_knob(directory, "congestion_threshold")]
    log.info("FUSE max_background %s, congestion_threshold %s for %s (fusectl connection %d)",
             now[0], now[1], mountpoint, connection)


def _read_knob(directory: str, name: str) -> str:
    try:
        with open(os.path.join(directory, name)) as knob:
            return knob.read().strip()
    except OSError as err:
        return f"unknown ({err.strerror})"


class _OwnLoop:
    """The mount's own FUSE layer: it opens ``/dev/fuse`` and mounts with it,
    answers INIT, and serves every request (:mod:`rapidmount.fuse`)."""

    name = "rapidmount"

    def __init__(self, config: MountConfig, operations: Operations, pool: WorkerPool, arena: Arena,
                 pipes: WritePipes | None, request_size: int, shares_descriptor: bool) -> None:
        self._config = config
        self._operations = operations
        self._pool = pool
        self._arena = arena
        self._pipes = pipes
        self._request_size = request_size
        self.shares_descriptor = shares_descriptor
        self._mounted: fuse_mount.Mounted | None = None
        self._channel: Channel | None = None
        self._loop: RequestLoop | None = None
        self._scope = trio.CancelScope()
        self.notifier: KernelNotifier | None = None

    async def mount(self) -> None:
        try:
            # It may wait on fusermount3: off the event loop, which serves the workers meanwhile.
            self._mounted = await trio.to_thread.run_sync(fuse_mount.open_and_mount, self._config.mountpoint,
                                                          _mount_options(self._config))
        except fuse_mount.MountFailed as err:
            raise MountError(str(err)) from None
        except OSError as err:  # fusermount3's socket failed in a way of its own
            raise MountError(f"cannot mount on {self._config.mountpoint}: {err.strerror or err}") from None
        self._channel = Channel(self._mounted.fd)
        self.notifier = over_channel(self._channel)
        self._operations.fs.kernel = self.notifier
        if self.shares_descriptor:
            bdi = _bdi_of(self._config.mountpoint)
            self._pool.share_fuse_fd(self._mounted.fd, fuse_connection_id(bdi) if bdi is not None else None)

    async def serve(self) -> None:
        channel = self._channel
        assert channel is not None, "serve() before mount()"
        background, congestion = self._config.effective_fuse_limits
        fs = self._operations.fs
        wants = Wants(max_write=self._request_size, max_readahead=self._request_size,
                      max_background=background, congestion_threshold=congestion,
                      passthrough=fs.local is not None and not self._config.no_passthrough)
        with self._scope:
            try:
                negotiated = await handshake(channel, wants)
            except ProtocolTooOld as err:
                raise MountError(str(err)) from None
            except OSError as err:
                raise MountError(f"the kernel's FUSE INIT never came: {err.strerror or err}") from None
            log.info("%s", negotiated.describe())
            if negotiated.max_background or negotiated.congestion_threshold:
                log.info("FUSE max_background %d, congestion_threshold %d for %s (in the INIT reply)",
                         negotiated.max_background, negotiated.congestion_threshold, self._config.mountpoint)
            if wants.passthrough:
                if negotiated.granted & abi.PASSTHROUGH:
                    fs.backing = DeviceBackingFiles(channel.fd)
                else:
                    log.info("FUSE passthrough: this kernel does not offer it (Linux 6.9+ with "
                             "CONFIG_FUSE_PASSTHROUGH); the mount serves the local cache's reads itself")
            self._loop = RequestLoop(channel, self._operations, self._operations.stats.requests,
                                     max_write=negotiated.max_write, allocate=self._arena.allocate,
                                     pipes=self._pipes, from_page_cache=fs.writes_from_page_cache,
                                     min_tasks=FUSE_MIN_TASKS, max_tasks=FUSE_MAX_TASKS)
            await self._loop.run()

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.stop()
        else:
            self._scope.cancel()  # not serving yet: INIT never came

    def close(self) -> None:
        if self._mounted is not None:
            fuse_mount.unmount(self._config.mountpoint, self._mounted)
            self._mounted = None


class _Pyfuse3Loop:
    """The reference loop (``--pyfuse3-requests``): pyfuse3's public API only."""

    name = "pyfuse3"

    def __init__(self, config: MountConfig, operations: FuseOperations) -> None:
        self._config = config
        self._operations = operations
        self.notifier: KernelNotifier | None = operations.kernel
        self.mounted = False

    async def mount(self) -> None:
        try:
            pyfuse3.init(self._operations, self._config.mountpoint,
                         _pyfuse3_options(_mount_options(self._config)))
        except RuntimeError as err:
            raise MountError(f"cannot mount on {self._config.mountpoint}: {err}") from None
        self.mounted = True

    async def serve(self) -> None:
        await pyfuse3.main(min_tasks=FUSE_MIN_TASKS, max_tasks=FUSE_MAX_TASKS)

    def stop(self) -> None:
        pyfuse3.terminate()

    def close(self) -> None:
        if self.mounted:
            pyfuse3.close(unmount=True)
            self.mounted = False


_Frontend = _OwnLoop | _Pyfuse3Loop


async def _serve(fs: Filesystem, frontend: _Frontend, config: MountConfig, on_ready: Callable[[], None],
                 pool: WorkerPool, signals: AsyncIterator[int]) -> None:
    try:
        await _serve_in_nursery(fs, frontend, config, on_ready, pool, signals)
    finally:
        if fs.local is not None:  # its fills are over: the index is saved as it stands
            with trio.CancelScope(shield=True):
                await fs.local.close()


async def _serve_in_nursery(fs: Filesystem, frontend: _Frontend, config: MountConfig, on_ready: Callable[[], None],
                            pool: WorkerPool, signals: AsyncIterator[int]) -> None:
    async with trio.open_nursery() as nursery:
        fs.attach(nursery)
        if frontend.notifier is not None:
            nursery.start_soon(frontend.notifier.run)

        async def handle_signals() -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    logs.reopen()  # logrotate moved the file away
                    await pool.broadcast("reopen_logs", None)
                    log.info("received SIGHUP, log file reopened")
                    continue
                log.info("received %s, unmounting", signal.Signals(signum).name)
                notify("STOPPING=1")
                frontend.stop()
                return

        async def when_live() -> None:
            # stat() through the kernel proves the mount answers.
            # Abandoned at a stop: a stop before the loop read its GETATTR leaves the stat waiting.
            await trio.to_thread.run_sync(os.stat, config.mountpoint, abandon_on_cancel=True)
            if config.kernel_read_ahead_kb > 0:
                await trio.to_thread.run_sync(set_kernel_read_ahead, config.mountpoint,
                                              config.kernel_read_ahead_kb)
            background, congestion = config.effective_fuse_limits
            if isinstance(frontend, _Pyfuse3Loop) and (background or congestion):
                # The own loop asks for them in its INIT reply; libfuse's cannot.
                await trio.to_thread.run_sync(set_fuse_limits, config.mountpoint, background, congestion)
            elif isinstance(frontend, _OwnLoop) and frontend.shares_descriptor:
                # A worker whose store waits on a page of a READ nobody will answer
                # (this process died) aborts the connection through fusectl.
                why = await trio.to_thread.run_sync(ensure_fusectl)
                if why is not None:
                    log.info("could not mount fusectl on %s (%s); a worker stuck in a page-cache store after this "
                             "process died cannot abort the connection", FUSECTL_ROOT, why)
            log.info("mounted gs://%s%s on %s (%s bucket; %s request loop)", config.bucket,
                     "/" + fs.root_prefix if fs.root_prefix else "", config.mountpoint,
                     "zonal" if fs.layout.zonal else "regional", frontend.name)
            notify(f"READY=1\nSTATUS=serving gs://{config.bucket} on {config.mountpoint}")
            on_ready()

        async def release_free_memory() -> None:
            while await trio.to_thread.run_sync(allocator.release_free_memory):  # off the FUSE loop
                await trio.sleep(allocator.TRIM_INTERVAL_S)

        nursery.start_soon(handle_signals)
        nursery.start_soon(when_live)
        nursery.start_soon(release_free_memory)
        await frontend.serve()
        with trio.CancelScope(shield=True):
            await fs.close_all()
        log.info("unmounting; statistics: %s; cache: %s%s", fs.stats, fs.cache.stats,
                 f"; local cache: {fs.local.stats}" if fs.local is not None else "")
        nursery.cancel_scope.cancel()


def run_mount(config: MountConfig, on_ready: Callable[[], None]) -> None:
    allocator.share_one_arena()  # before any thread starts
    allocator.retain_large_buffers()
    emulator = None
    endpoint, anonymous = config.endpoint, config.anonymous
    if config.emulator:
        from rapidmount.emulator import Emulator

        # The embedded emulator's per-request logs are noise in the mount's log.
        logging.getLogger("rapidmount.emulator").setLevel(logging.WARNING)
        emulator = Emulator(buckets={}, data_dir=config.emulator_dir)
        emulator.start()
        if not emulator.has_bucket(config.bucket):
            emulator.create_bucket(config.bucket, "zonal")
        endpoint, anonymous = emulator.endpoint, True
        log.info("embedded emulator serving on %s", endpoint)
    state: dict[str, Any] = {"frontend": None, "metrics": None}
    try:
        trio.run(_run, config, endpoint, anonymous, on_ready, state)
    except BaseExceptionGroup as group:
        raise _unwrap(group) from None
    finally:
        try:
            if state["frontend"] is not None:
                state["frontend"].close()
        finally:
            if state["metrics"] is not None:
                state["metrics"].stop()
            if emulator is not None:
                emulator.stop()


def _unwrap(group: BaseException) -> BaseException:
    """The one exception a nursery wrapped (a MountError says why the mount failed)."""
    while isinstance(group, BaseExceptionGroup) and len(group.exceptions) == 1:
        group = group.exceptions[0]
    if isinstance(group, BaseExceptionGroup):
        mount_errors = group.subgroup(MountError)
        if mount_errors is not None:
            return _unwrap(mount_errors)
    return group


async def _run(config: MountConfig, endpoint: str, anonymous: bool, on_ready: Callable[[], None],
               state: dict[str, Any]) -> None:
    settings = worker_settings(config, endpoint, anonymous)
    if config.pyfuse3_requests:
        # pyfuse3 keeps /dev/fuse to itself: no worker stores pages or writes replies.
        settings = dataclasses.replace(settings, page_store_buffer=0)
    tokens = await trio.to_thread.run_sync(_first_token, config) if settings.tokens else None
    arena = Arena(config.cache_size)  # the page cache and the transfer buffer share it
    settings = dataclasses.replace(settings, arena_size=arena.size)
    workers = config.effective_workers
    pipes, why = ((None, "") if config.pyfuse3_requests
                  else open_write_pipes(config.write_pipes, config.max_request_size))
    if why:
        log.info("large WRITEs' bytes are read in the FUSE process: %s", why)
    pool = WorkerPool(settings, workers, arena, pipes)
    pusher = TokenPusher(tokens, pool) if tokens is not None else None
    try:
        with contextlib.ExitStack() as exits:
            async with trio.open_nursery() as nursery:
                if pusher is not None:
                    # Before the first worker: it may need a fresh token to open the bucket.
                    nursery.start_soon(pusher.run)
                layout = await nursery.start(pool.run)
                log.info("bucket %s: %s, location %s (%s), hierarchical namespace %s; %d data-plane worker%s, "
                         "%d MiB of shared memory", config.bucket, layout.describe_type(), layout.location or "unknown",
                         layout.location_type or "unknown", "on" if layout.hierarchical_namespace else "off", workers,
                         "s" if workers != 1 else "", arena.size >> 20)
                if config.profile is not None:
                    chosen = [f"{dest.replace('_', '-')}={config.values[dest]}" for dest in sorted(config.values)
                              if config.source_of(dest) == f"profile {config.profile}"]
                    log.info("profile %s: %s", config.profile, ", ".join(chosen) or "every setting given explicitly")
                store = WorkerStore(pool, layout, read_streams=config.read_streams)
                local = await _open_local_cache(config, store)
                fs = Filesystem(core_settings(config), store, uid=config.uid if config.uid is not None else os.getuid(),
                                gid=config.gid if config.gid is not None else os.getgid(), local=local)
                stats = OperationStats()
                frontend = _frontend(config, fs, stats, store, pool, arena, pipes, settings.page_store_buffer > 0)
                if config.prometheus_port:
                    state["metrics"] = _serve_metrics(config, fs, stats)
                if config.allow_other and not config.permission_checks:
                    log.warning("--no-permission-checks: every user who reaches %s reads and changes every file "
                                "with this mount's credentials, whatever the modes say", config.mountpoint)
                # From the moment the mount exists, a SIGTERM or SIGINT unmounts it:
                # taken before it is made, a signal waits until the mount serves.
                signals = exits.enter_context(
                    trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
                state["frontend"] = frontend
                await frontend.mount()
                await _serve(fs, frontend, config, on_ready, pool, signals)
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await pool.stop()
        if pipes is not None:
            pipes.close()


async def _open_local_cache(config: MountConfig, store: WorkerStore) -> LocalCache | None:
    """The local cache of --cache-dir, its directory taken (locked) and its index loaded."""
    if config.cache_dir is None:
        return None
    directory = CacheDirectory(config.cache_dir, config.cache_dir_size)
    try:
        await trio.to_thread.run_sync(directory.open)
    except CacheDirError as err:
        raise MountError(str(err)) from None
    index = directory.index
    log.info("local cache in %s: %d objects, %d of %d MiB; objects up to %d MiB are copied there",
             config.cache_dir, len(index), index.used >> 20, index.budget >> 20, config.cache_dir_fill_size >> 20)
    return LocalCache(directory, store, bucket=config.bucket, fill_size=config.cache_dir_fill_size)


def _frontend(config: MountConfig, fs: Filesystem, stats: OperationStats, store: WorkerStore, pool: WorkerPool,
              arena: Arena, pipes: WritePipes | None, stores_pages: bool) -> _Frontend:
    """The FUSE side of the mount: the own loop, or with ``--pyfuse3-requests`` the reference loop."""
    if config.pyfuse3_requests:
        log.info("every request goes through pyfuse3's loop (--pyfuse3-requests)")
        return _Pyfuse3Loop(config, FuseOperations(fs, stats))
    by_worker = not config.no_worker_replies
    operations = Operations(fs, stats, worker_reply_soon=store.answer_read_soon if by_worker else None,
                            worker_reply_now=store.answer_read_now if by_worker else None)
    # The kernel caps a connection's requests when the mount is made.
    request_size = (kernel_request_size(config.max_request_size)
                    if config.max_request_size > fuse_loop.MAX_WRITE else fuse_loop.MAX_WRITE)
    return _OwnLoop(config, operations, pool, arena, pipes, request_size,
                    shares_descriptor=stores_pages or by_worker or pipes is not None)


def _serve_metrics(config: MountConfig, fs: Filesystem, stats: OperationStats) -> Any:
    from rapidmount.daemon.metrics import MetricsServer

    address, port = config.prometheus_address, config.prometheus_port
    try:
        server = MetricsServer(address, port, fs, stats)
    except OSError as err:
        raise MountError(f"cannot serve metrics on {address}:{port}: {err.strerror or err}") from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics",
             f"[{address}]" if ":" in address else address, port)
    return server
