"""The in-memory bucket's pieces: objects, their bytes, faults, and the
emulator rules MemoryStore shares (preconditions, page sizes, refusals)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import google_crc32c
import grpc

from rapidmount.emulator import listing
from rapidmount.emulator import store as emu
from rapidmount.storage.model import MTIME_METADATA_KEY, ObjectMeta, parse_mtime

CHUNK = 2 * 1024 * 1024  # an appender persists whole chunks as it goes, the rest at flush

# Seam method -> the RPC it stands for, under which rpc_errors counts its failures ("" = the read RPC).
RPC_OF = {
    "get_object": "GetObject", "stat_name": "GetObject", "list_page": "ListObjects",
    "list_directory": "ListObjects", "list_folders_page": "ListFolders", "write_object": "WriteObject",
    "delete_object": "DeleteObject", "move_object": "MoveObject", "update_metadata": "UpdateObject",
    "create_folder": "CreateFolder", "delete_folder": "DeleteFolder", "rename_folder": "RenameFolder",
    "read_objects_whole": "", "read_objects_composed": "ComposeObject", "reader.read": "",
    **{f"appender.{op}": "BidiWriteObject" for op in ("create", "takeover", "append", "flush", "finalize", "close")},
}


def refusal(code: grpc.StatusCode, message: str) -> emu.StoreError:
    """A refusal with any status, in the emulator's exception family."""
    error = emu.StoreError(message)
    error.code = code.name
    return error


class Blob:
    """An object's bytes: shared by the generations that keep them (moves,
    folder renames) and by open readers, which outlive deletes as the emulator's do."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = bytearray(data)
        self.crc = google_crc32c.value(bytes(data))

    def append(self, data: bytes) -> None:
        self.data += data
        self.crc = google_crc32c.extend(self.crc, bytes(data))


@dataclass(frozen=True)
class StoredObject:
    name: str
    generation: int
    metageneration: int
    blob: Blob
    finalized: bool
    create_ns: int
    update_ns: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    writer_epoch: int = 1


@dataclass
class Fault:
    method: str
    code: grpc.StatusCode
    times: int
    match: Callable[[str], bool] | None


def meta_of(obj: StoredObject) -> ObjectMeta:
    mtime_ns = obj.update_ns
    if MTIME_METADATA_KEY in obj.metadata:  # gcsfuse's mtime wins, as in the client's record_from_object
        mtime_ns = parse_mtime(obj.metadata[MTIME_METADATA_KEY]) or mtime_ns
    return ObjectMeta(name=obj.name, generation=obj.generation, metageneration=obj.metageneration,
                      size=len(obj.blob.data), mtime_ns=mtime_ns, ctime_ns=obj.create_ns,
                      finalized=obj.finalized, crc32c=obj.blob.crc if obj.finalized else None,
                      metadata=obj.metadata)


def folder_id(prefix: str) -> str:
    return prefix if prefix.endswith("/") else prefix + "/"


def check_preconditions(obj: StoredObject | None, if_generation_match: int | None = None,
           if_metageneration_match: int | None = None) -> None:
    emu.Preconditions(if_generation_match=if_generation_match,
                      if_metageneration_match=if_metageneration_match).check(obj)  # type: ignore[arg-type]


def page_size_of(page_size: int) -> int:
    try:
        return listing.clamp_page_size(page_size)
    except ValueError as exc:
        raise emu.InvalidArgument(str(exc)) from None


