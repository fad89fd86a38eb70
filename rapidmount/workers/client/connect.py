"""Open the channel to the storage endpoint and check the bucket (asyncio).

Each data-plane worker runs this once at its start; a failure is one line
(:class:`~rapidmount.shared.exits.MountError`) that the mount reports as its own.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import grpc

from rapidmount.shared.channel_plan import plan_channel
from rapidmount.workers.client.channel import make_channel, reconnected
from rapidmount.workers.client.storage import StorageClient
from rapidmount.shared.exits import MountError
from rapidmount.shared.worker_settings import WorkerSettings
from rapidmount.storage.errors import StorageCode, StorageError
from rapidmount.storage.model import BucketLayout
from rapidmount.workers.retry import Reauth, RetryPolicy

log = logging.getLogger("rapidmount.client")


async def connect(settings: WorkerSettings, call_credentials: grpc.CallCredentials | None,
                  reauth: Reauth | None = None) -> tuple[StorageClient, BucketLayout]:
    """A client of ``settings.bucket`` and its layout; ``reauth``: how a call
    whose token the service refused gets a fresh one."""
    try:
        plan = plan_channel(settings.endpoint, anonymous=settings.anonymous, directpath=settings.directpath,
                            ca_file=settings.ca_pem is not None)
    except ValueError as err:
        raise MountError(str(err)) from None
    log.debug("connecting to %s", plan.describe())
    channel = make_channel(plan, call_credentials=call_credentials if plan.tokens else None,
                           root_certificates=settings.ca_pem)
    billing = (("x-goog-user-project", settings.billing_project),) if settings.billing_project else ()
    back = functools.partial(reconnected, channel)
    client = StorageClient(channel, settings.bucket,
                           retry=RetryPolicy(deadline=min(settings.retry_deadline, 10), reauth=reauth,
                                             reconnected=back),
                           extra_metadata=billing)
    try:
        await client.wait_ready(settings.connect_timeout)
    except StorageError:
        reason = await _why_unreachable(channel)
        await channel.close()
        raise MountError(f"cannot reach the storage endpoint {settings.endpoint}{reason}") from None
    try:
        layout = await client.get_layout()
    except StorageError as err:
        forced = _forced_layout(settings, err)
        if forced is None:
            await channel.close()
            raise MountError(_bucket_error(settings, err)) from None
        layout = forced
    if settings.bucket_type != "auto":
        layout = dataclasses.replace(layout, forced_type=settings.bucket_type)
    client.retry = RetryPolicy(deadline=settings.retry_deadline, reauth=reauth, reconnected=back)
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


def _forced_layout(settings: WorkerSettings, err: StorageError) -> BucketLayout | None:
    """With --bucket-type, an endpoint without GetStorageLayout is not fatal."""
    if settings.bucket_type == "auto" or err.code is not StorageCode.UNIMPLEMENTED:
        return None
    log.info("the endpoint does not implement GetStorageLayout; trusting --bucket-type %s",
             settings.bucket_type)
    # Zonal buckets always have folders; for regional ones assume a flat namespace.
    return BucketLayout(name=settings.bucket, location="", location_type="",
                        hierarchical_namespace=settings.bucket_type == "zonal")


def _bucket_error(settings: WorkerSettings, err: StorageError) -> str:
    """The one line that says why the bucket cannot be opened."""
    detail = str(err)
    bucket = settings.bucket
    if err.code is StorageCode.NOT_FOUND:
        return f"bucket {bucket!r} does not exist"
    if "requester pays" in detail.lower():
        return (f"bucket {bucket!r} is a requester-pays bucket: give --billing-project PROJECT "
                "(the project to bill)" if not settings.billing_project else
                f"bucket {bucket!r} is requester-pays and refused --billing-project "
                f"{settings.billing_project}: {detail}")
    if err.code is StorageCode.UNAUTHENTICATED:
        return f"the storage endpoint rejected the credentials: {detail}"
    if err.code is StorageCode.PERMISSION_DENIED:
        return f"access to bucket {bucket!r} is denied"
    if "Getting metadata from plugin failed" in detail:
        return detail.split("with error: ", 1)[-1]
    return f"cannot open bucket {bucket!r}: {detail}"
