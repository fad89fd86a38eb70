"""Store records to wire messages, and request fields to store arguments."""

from __future__ import annotations

from typing import Any

from rapidmount.shared import wire

from . import resources
from .store_preconditions import Preconditions
from .store_records import REGION, ZONE, Bucket, FolderRecord

S = wire.storage
C = wire.control

PROJECT = "projects/0"


timestamp = resources.timestamp
object_proto = resources.object_message  # (record, size=None): the Object resource


def bucket_proto(bucket: Bucket) -> Any:
    message = S.Bucket(
        name=wire.bucket_resource(bucket.name),
        bucket_id=bucket.name,
        etag=f"{bucket.kind}.1",
        project=PROJECT,
        metageneration=1,
        location=REGION.upper(),
        location_type=bucket.location_type,
        storage_class=bucket.storage_class,
        create_time=timestamp(bucket.create_time),
        update_time=timestamp(bucket.create_time),
    )
    if bucket.zonal:
        message.custom_placement_config.data_locations.append(ZONE)
    message.hierarchical_namespace.enabled = bucket.hierarchical
    message.iam_config.uniform_bucket_level_access.enabled = True
    return message


def storage_layout(bucket: Bucket) -> Any:
    layout = C.StorageLayout(
        name=f"{wire.bucket_resource(bucket.name)}/storageLayout",
        location=REGION,
        location_type=bucket.location_type,
    )
    if bucket.zonal:
        layout.custom_placement_config.data_locations.append(ZONE)
    if bucket.hierarchical:
        layout.hierarchical_namespace.enabled = True
    return layout


def folder_resource(bucket: str, folder: str) -> str:
    return f"{wire.bucket_resource(bucket)}/folders/{folder}"


def folder_proto(folder: FolderRecord) -> Any:
    return C.Folder(
        name=folder_resource(folder.bucket, folder.name),
        metageneration=folder.metageneration,
        create_time=timestamp(folder.create_time),
        update_time=timestamp(folder.update_time),
    )


def _optional(message: Any, field: str) -> int | None:
    if field in message.DESCRIPTOR.fields_by_name and message.HasField(field):
        value: int = getattr(message, field)
        return value
    return None


def preconditions(message: Any, infix: str = "") -> Preconditions:
    """``if_[infix]generation_match`` and friends of a request (infix e.g. ``source_``)."""
    return Preconditions(
        if_generation_match=_optional(message, f"if_{infix}generation_match"),
        if_generation_not_match=_optional(message, f"if_{infix}generation_not_match"),
        if_metageneration_match=_optional(message, f"if_{infix}metageneration_match"),
        if_metageneration_not_match=_optional(message, f"if_{infix}metageneration_not_match"),
    )
