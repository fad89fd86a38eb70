"""What the emulator's store hands out: buckets, objects, folders and listing pages.

Plain frozen records, no behaviour beyond derived properties; they import
nothing else of the emulator, so every part of it can use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Mapping, TypeVar

BUCKET_KINDS = ("zonal", "hns", "flat")
ZONE = "us-central1-a"
REGION = "us-central1"


@dataclass(frozen=True)
class Bucket:
    name: str
    kind: str
    create_time: float

    @property
    def zonal(self) -> bool:
        return self.kind == "zonal"

    @property
    def hierarchical(self) -> bool:
        return self.kind in ("zonal", "hns")

    @property
    def location_type(self) -> str:
        return "zone" if self.zonal else "region"

    @property
    def storage_class(self) -> str:
        return "RAPID" if self.zonal else "STANDARD"


@dataclass(frozen=True)
class ObjectRecord:
    bucket: str
    name: str
    generation: int
    metageneration: int
    size: int
    crc32c: int
    md5: bytes | None
    finalized: bool
    create_time: float
    update_time: float
    finalize_time: float | None
    content_type: str
    storage_class: str
    component_count: int
    metadata: Mapping[str, str]
    writer_epoch: int
    blob_id: int


@dataclass(frozen=True)
class FolderRecord:
    bucket: str
    name: str
    metageneration: int
    create_time: float
    update_time: float


_Listed = TypeVar("_Listed")


@dataclass
class ObjectListing(Generic[_Listed]):
    objects: list[_Listed]  # records, or their serialized resources
    prefixes: list[str]
    next_page_token: str


@dataclass
class FolderListing:
    folders: list[FolderRecord]
    next_page_token: str
