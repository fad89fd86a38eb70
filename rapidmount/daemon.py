"""Run one mount: connect, check the bucket, mount, serve until a signal.

Structured as trio wants it: one nursery owns the FUSE main loop, the
signal watcher, the post-mount tuning and every background fetch; leaving it
cancels them all before the mount is closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import subprocess
from collections.abc import Callable

import grpc
import pyfuse3
import trio

from rapidmount import logs
from rapidmount.bridge import GrpcBridge
from rapidmount.client import auth
from rapidmount.client.channel import make_channel, plan_channel
from rapidmount.client.storage import StorageClient
from rapidmount.config import MountConfig
from rapidmount.core import Filesystem
from rapidmount.exits import MountError
from rapidmount.fuse_adapter import FuseOperations
from rapidmount.notify import notify
from rapidmount.storage.errors import StorageError
from rapidmount.storage.grpc_store import GrpcStore
from rapidmount.storage.model import BucketLayout
from rapidmount.storage.retry import RetryPolicy

log = logging.getLogger("rapidmount")

FUSE_MAX_TASKS = 128
FUSECTL_ROOT = "/sys/fs/fuse/connections"
FUSECTL_MOUNT_TIMEOUT = 10.0


async def _connect(config: MountConfig, endpoint: str, anonymous: bool) -> tuple[StorageClient, BucketLayout]:
    """Open the channel and check the bucket (runs on the gRPC thread)."""
    # The embedded emulator is plaintext and anonymous, whatever the flags say.
    ca_file = None if config.emulator else config.ca_file
    try:
        plan = plan_channel(endpoint, anonymous=anonymous, directpath=config.directpath and not config.emulator,
                            ca_file=ca_file is not None)
    except ValueError as err:
        raise MountError(str(err)) from None
    root_certificates = _read_ca_file(ca_file) if ca_file is not None else None
    call_credentials = None
    if plan.tokens:
        # google-auth blocks (files, HTTP): keep it off the event loop.
        tokens = await asyncio.to_thread(_first_token, config)
        call_credentials = auth.call_credentials(tokens)
    log.info("connecting to %s", plan.describe())
    channel = make_channel(plan, call_credentials=call_credentials, root_certificates=root_certificates)
    billing = (("x-goog-user-project", config.billing_project),) if config.billing_project else ()
    client = StorageClient(channel, config.bucket, retry=RetryPolicy(deadline=min(config.retry_deadline, 10)),
                           extra_metadata=billing)
    try:
        await client.wait_ready(config.connect_timeout)
    except StorageError:
        reason = await _why_unreachable(channel)
        await channel.close()
        raise MountError(f"cannot reach the storage endpoint {endpoint}{reason}") from None
    try:
        layout = await client.get_layout()
    except StorageError as err:
        forced = _forced_layout(config, err)
        if forced is None:
            await channel.close()
            raise MountError(_bucket_error(config, err)) from None
        layout = forced
    if config.bucket_type != "auto":
        layout = dataclasses.replace(layout, forced_type=config.bucket_type)
    client.retry = RetryPolicy(deadline=config.retry_deadline)
    return client, layout


async def _why_unreachable(channel: grpc.aio.Channel) -> str:
    """What the channel's last connection attempt said (e.g. a TLS certificate error), if anything."""
    probe = channel.unary_unary("/google.storage.v2.Storage/GetBucket")
    try:
        await probe(b"", timeout=2)
    except grpc.aio.AioRpcError as err:
        detail = (err.details() or "").rpartition("last error: ")[2].strip().removesuffix(": OK")
        if err.code() == grpc.StatusCode.UNAVAILABLE and detail and "deadline" not in detail.lower():
            return ": " + (detail if len(detail) <= 300 else detail[:297] + "...")
    except Exception:  # only a hint: the mount fails either way
        pass
    return ""


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


def _forced_layout(config: MountConfig, err: StorageError) -> BucketLayout | None:
    """With --bucket-type, an endpoint without GetStorageLayout is not fatal."""
    if config.bucket_type == "auto" or err.code != grpc.StatusCode.UNIMPLEMENTED:
        return None
    log.info("the endpoint does not implement GetStorageLayout; trusting --bucket-type %s",
             config.bucket_type)
    # Zonal buckets always have folders; for regional ones assume a flat namespace.
    return BucketLayout(name=config.bucket, location="", location_type="",
                        hierarchical_namespace=config.bucket_type == "zonal")


def _bucket_error(config: MountConfig, err: StorageError) -> str:
    """The one line that says why the bucket cannot be opened."""
    detail = str(err)
    if err.code == grpc.StatusCode.NOT_FOUND:
        return f"bucket {config.bucket!r} does not exist"
    if "requester pays" in detail.lower():
        return (f"bucket {config.bucket!r} is a requester-pays bucket: give --billing-project PROJECT "
                "(the project to bill)" if not config.billing_project else
                f"bucket {config.bucket!r} is requester-pays and refused --billing-project "
                f"{config.billing_project}: {detail}")
    if err.code == grpc.StatusCode.UNAUTHENTICATED:
        return f"the storage endpoint rejected the credentials: {detail}"
    if err.code == grpc.StatusCode.PERMISSION_DENIED:
        return f"access to bucket {config.bucket!r} is denied"
    if "Getting metadata from plugin failed" in detail:
        return detail.split("with error: ", 1)[-1]
    return f"cannot open bucket {config.bucket!r}: {detail}"


def _fuse_options(config: MountConfig) -> set[str]:
    options = {f"fsname=rapidmount:{config.bucket}", "subtype=rapidmount", "noatime", "auto_unmount"}
    if config.read_only:
        options.add("ro")
    if config.allow_other:
        options.add("allow_other")
    if config.default_permissions:
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
                 on_ready: Callable[[], None]) -> None:
    async with trio.open_nursery() as nursery:
        fs.attach(nursery)
        nursery.start_soon(operations.kernel.run)

        async def handle_signals() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        logs.reopen()  # logrotate moved the file away
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

        nursery.start_soon(handle_signals)
        nursery.start_soon(when_live)
        await pyfuse3.main(min_tasks=4, max_tasks=FUSE_MAX_TASKS)
        with trio.CancelScope(shield=True):
            await fs.close_all()
        log.info("unmounting; statistics: %s; cache: %s", fs.stats, fs.cache.stats)
        nursery.cancel_scope.cancel()


def run_mount(config: MountConfig, on_ready: Callable[[], None]) -> None:
    from rapidmount.allocator import retain_large_buffers

    retain_large_buffers()
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

    bridge = GrpcBridge()
    bridge.start()
    mounted = False
    client = None
    metrics_server = None
    try:
        client, layout = bridge.run_blocking(_connect, config, endpoint, anonymous)
        log.info("bucket %s: %s, location %s (%s), hierarchical namespace %s", config.bucket,
                 layout.describe_type(), layout.location or "unknown", layout.location_type or "unknown",
                 "on" if layout.hierarchical_namespace else "off")
        store = GrpcStore(bridge, client, layout, retry=RetryPolicy(deadline=config.retry_deadline),
                          stall_timeout=config.stall_timeout, write_buffer=config.write_buffer,
                          read_streams=config.read_streams)
        fs = Filesystem(config, store, uid=config.uid if config.uid is not None else os.getuid(),
                        gid=config.gid if config.gid is not None else os.getgid())
        operations = FuseOperations(fs)
        if config.prometheus_port:
            metrics_server = _serve_metrics(config, fs, operations)
        try:
            pyfuse3.init(operations, config.mountpoint, _fuse_options(config))
        except RuntimeError as err:
            raise MountError(f"cannot mount on {config.mountpoint}: {err}") from None
        mounted = True
        trio.run(_serve, fs, operations, config, on_ready)
    finally:
        if mounted:
            pyfuse3.close(unmount=True)
        if metrics_server is not None:
            metrics_server.stop()
        try:
            bridge.run_blocking(_close_channel_of, client, timeout=5)
        except Exception:
            pass
        bridge.stop()
        if emulator is not None:
            emulator.stop()


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


async def _close_channel_of(client: StorageClient | None) -> None:
    if client is not None:
        await client.channel.close(grace=1.0)
