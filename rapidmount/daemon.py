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

import pyfuse3
import trio

from rapidmount import allocator, logs, read_replies, request_loop
from rapidmount.sysctl import raise_limit
from rapidmount.client import auth
from rapidmount.client.channel import plan_channel
from rapidmount.config import MountConfig
from rapidmount.core import Filesystem
from rapidmount.dataplane.arena import Arena
from rapidmount.dataplane.pool import WorkerPool
from rapidmount.dataplane.pagestore import FUSECTL_ROOT
from rapidmount.dataplane.settings import WorkerSettings
from rapidmount.dataplane.store import WorkerStore
from rapidmount.dataplane.token_pusher import TokenPusher
from rapidmount.dataplane.write_pipes import WritePipes, open_write_pipes
from rapidmount.exits import MountError
from rapidmount.fuse_adapter import FuseOperations
from rapidmount.notify import notify
from rapidmount.read_replies import ReadReplies, WorkerReply, WorkerReplyNow, WorkerReplySoon
from rapidmount.request_loop import Allocate, RequestLoop

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


def _fuse_options(config: MountConfig) -> set[str]:
    options = {f"fsname=rapidmount:{config.bucket}", "subtype=rapidmount", "noatime", "auto_unmount"}
    if config.read_only:
        options.add("ro")
    if config.allow_other:
        options.add("allow_other")
    if config.permission_checks:
        options.add("default_permissions")
    return options


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
    pages = wanted // request_loop.PAGE
    limit, refused = raise_limit(knob, pages, f"pages, for FUSE requests of {wanted >> 10} KiB")
    if limit is None:
        return request_loop.MAX_WRITE  # a kernel without the knob: 256 pages, fixed
    if refused is not None:
        log.info("FUSE requests stay within %d KiB: fs.fuse.max_pages_limit is %d pages and could not be "
                 "raised (%s)", max(limit * request_loop.PAGE, request_loop.MAX_WRITE) >> 10, limit, refused.strerror)
    return max(request_loop.MAX_WRITE, min(wanted, limit * request_loop.PAGE))


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
        reason = _mount_fusectl_syscall(root)  # no mount(8) here: ask the kernel directly
    except subprocess.TimeoutExpired:
        reason = f"mount -t fusectl did not finish within {FUSECTL_MOUNT_TIMEOUT:.0f}s"
    else:
        reason = None if done.returncode == 0 else (
            " ".join(done.stderr.split()) or f"mount exited with {done.returncode}")
    if os.path.ismount(root):  # ours, or another daemon's that won the race
        log.debug("mounted fusectl on %s", root)
        return None
    return reason or f"{root} is still not a mount point"


def _mount_fusectl_syscall(root: str) -> str | None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"fusectl", os.fsencode(root), b"fusectl", 0, None) != 0:
        return os.strerror(ctypes.get_errno())
    return None


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


async def _serve(fs: Filesystem, operations: FuseOperations, config: MountConfig,
                 on_ready: Callable[[], None], pool: WorkerPool, requests: RequestLoop | None,
                 signals: AsyncIterator[int]) -> None:
    async with trio.open_nursery() as nursery:
        fs.attach(nursery)
        nursery.start_soon(operations.kernel.run)

        async def handle_signals() -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    logs.reopen()  # logrotate moved the file away
                    await pool.broadcast("reopen_logs", None)
                    log.info("received SIGHUP, log file reopened")
                    continue
                log.info("received %s, unmounting", signal.Signals(signum).name)
                notify("STOPPING=1")
                pyfuse3.terminate()
                return

        async def when_live() -> None:
            # stat() through the kernel proves the mount answers.
            await trio.to_thread.run_sync(os.stat, config.mountpoint)
            if config.kernel_read_ahead_kb > 0:
                await trio.to_thread.run_sync(set_kernel_read_ahead, config.mountpoint,
                                              config.kernel_read_ahead_kb)
            background, congestion = config.effective_fuse_limits
            if background or congestion:
                await trio.to_thread.run_sync(set_fuse_limits, config.mountpoint, background, congestion)
            log.info("mounted gs://%s%s on %s (%s bucket)", config.bucket,
                     "/" + fs.root_prefix if fs.root_prefix else "", config.mountpoint,
                     "zonal" if fs.layout.zonal else "regional")
            notify(f"READY=1\nSTATUS=serving gs://{config.bucket} on {config.mountpoint}")
            on_ready()

        async def release_free_memory() -> None:
            while await trio.to_thread.run_sync(allocator.release_free_memory):  # off the FUSE loop
                await trio.sleep(allocator.TRIM_INTERVAL_S)

        nursery.start_soon(handle_signals)
        nursery.start_soon(when_live)
        nursery.start_soon(release_free_memory)
        if requests is not None:
            await requests.run()
        else:
            await pyfuse3.main(min_tasks=FUSE_MIN_TASKS, max_tasks=FUSE_MAX_TASKS)
        with trio.CancelScope(shield=True):
            await fs.close_all()
        log.info("unmounting; statistics: %s; cache: %s", fs.stats, fs.cache.stats)
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
    state: dict = {"mounted": False, "metrics": None}
    try:
        trio.run(_run, config, endpoint, anonymous, on_ready, state)
    except BaseExceptionGroup as group:
        raise _unwrap(group) from None
    finally:
        if state["mounted"]:
            pyfuse3.close(unmount=True)
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
               state: dict) -> None:
    settings = worker_settings(config, endpoint, anonymous)
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
                fs = Filesystem(config, store, uid=config.uid if config.uid is not None else os.getuid(),
                                gid=config.gid if config.gid is not None else os.getgid())
                operations = FuseOperations(fs)
                if config.prometheus_port:
                    state["metrics"] = _serve_metrics(config, fs, operations)
                if config.allow_other and not config.permission_checks:
                    log.warning("--no-permission-checks: every user who reaches %s reads and changes every file "
                                "with this mount's credentials, whatever the modes say", config.mountpoint)
                # From the moment the mount exists, a SIGTERM or SIGINT unmounts it:
                # taken before it is made, a signal waits until the mount serves.
                signals = exits.enter_context(
                    trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
                # The kernel caps a connection's requests when the mount is made.
                request_size = (kernel_request_size(config.max_request_size)
                                if not config.pyfuse3_requests and config.max_request_size > request_loop.MAX_WRITE
                                else request_loop.MAX_WRITE)
                try:
                    pyfuse3.init(operations, config.mountpoint, _fuse_options(config))
                except RuntimeError as err:
                    raise MountError(f"cannot mount on {config.mountpoint}: {err}") from None
                state["mounted"] = True
                device = fuse_fd()
                requests = None
                if device is None:
                    log.info("found no /dev/fuse descriptor; every request goes through pyfuse3")
                else:
                    if settings.page_store_buffer or not config.no_worker_replies or pipes is not None:
                        bdi = _bdi_of(config.mountpoint)
                        pool.share_fuse_fd(device, fuse_connection_id(bdi) if bdi is not None else None)
                    if not config.pyfuse3_requests:
                        by_worker = not config.no_worker_replies
                        requests = _request_loop(operations, device, store.answer_read_soon if by_worker else None,
                                                 arena.allocate, request_size, pipes,
                                                 store.answer_read_now if by_worker else None)
                    operations.replies = (requests[1] if requests is not None else _read_replies(
                        operations, device, None if config.no_worker_replies else store.answer_read))
                try:
                    await _serve(fs, operations, config, on_ready, pool,
                                 requests[0] if requests is not None else None, signals)
                finally:
                    if operations.replies is not None:
                        operations.replies.uninstall()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await pool.stop()
        if pipes is not None:
            pipes.close()


def _request_loop(operations: FuseOperations, device: int, worker_reply: WorkerReplySoon | None,
                  allocate: Allocate, request_size: int, pipes: WritePipes | None = None,
                  worker_reply_now: WorkerReplyNow | None = None) -> tuple[RequestLoop, ReadReplies] | None:
    """The mount's own request loop for READ and WRITE, and the READ replies
    it writes; None where pyfuse3's session cannot be found. Requests of up
    to ``request_size`` bytes are asked for, before libfuse answers INIT."""
    libfuse, session, refusal = request_loop.probe(device)
    if libfuse is None:
        log.info("every request goes through pyfuse3's loop: %s", refusal)
        return None
    max_write, why = request_loop.raise_request_size(session, request_size, libfuse.version)
    if why:
        log.info("FUSE requests stay at %d KiB: %s", max_write >> 10, why)
    elif max_write > request_loop.MAX_WRITE:
        log.info("FUSE READ and WRITE requests of up to %d KiB", max_write >> 10)
    stats = operations.operation_stats
    replies = ReadReplies(None, operations.read, device, None, stats.read_replies, worker_reply_soon=worker_reply,
                          worker_reply_now=worker_reply_now, read_now=operations.read_now)
    loop = RequestLoop(libfuse, session, device, replies.answer, operations.write, stats.requests,
                       allocate=allocate, answering=replies.answering, min_tasks=FUSE_MIN_TASKS,
                       max_tasks=FUSE_MAX_TASKS, max_write=max_write, operations=operations, pipes=pipes,
                       write_now=operations.write_now, read_now=replies.answer_now,
                       from_page_cache=operations.fs.writes_from_page_cache)
    log.info("READ and WRITE requests are read from /dev/fuse and answered by rapidmount; the others go "
             "through libfuse and pyfuse3")
    return loop, replies


def _read_replies(operations: FuseOperations, device: int, worker_reply: WorkerReply | None) -> ReadReplies | None:
    """READ replies by the workers, or by this process without pyfuse3's copy;
    None where pyfuse3's or libfuse's layouts are not the ones expected."""
    libfuse, refusal = read_replies.probe()
    if libfuse is None:
        log.info("READ replies stay with pyfuse3: %s", refusal)
        return None
    replies = ReadReplies(libfuse, operations.read, device, worker_reply, operations.operation_stats.read_replies)
    operations.read = replies.checked_read  # type: ignore[method-assign]  # pyfuse3 calls it while offsets are checked
    replies.install()
    return replies


def fuse_fd() -> int | None:
    """The descriptor of /dev/fuse this process opened (pyfuse3 keeps exactly one)."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                return int(name)
        except OSError:
            continue
    return None


def _serve_metrics(config: MountConfig, fs: Filesystem, operations: FuseOperations):
    from rapidmount.metrics import MetricsServer

    address, port = config.prometheus_address, config.prometheus_port
    try:
        server = MetricsServer(address, port, fs, operations.operation_stats)
    except OSError as err:
        raise MountError(f"cannot serve metrics on {address}:{port}: {err.strerror or err}") from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics",
             f"[{address}]" if ":" in address else address, port)
    return server
