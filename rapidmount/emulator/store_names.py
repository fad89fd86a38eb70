"""Object and folder names: the service's limits on them, and the folders they imply."""

from __future__ import annotations

from .store_errors import InvalidArgument

MAX_OBJECT_NAME_BYTES = 1024
MAX_FOLDER_NAME_BYTES = 512
MAX_FOLDER_DEPTH = 50


def validate_object_name(name: str) -> None:
    if not name:
        raise InvalidArgument("object name must not be empty")
    encoded = _utf8(name, "object name")
    if len(encoded) > MAX_OBJECT_NAME_BYTES:
        raise InvalidArgument(f"object name is {len(encoded)} bytes; the limit is {MAX_OBJECT_NAME_BYTES}")
    if "\r" in name or "\n" in name:
        raise InvalidArgument("object names must not contain carriage returns or line feeds")
    if name in (".", ".."):
        raise InvalidArgument(f"object name {name!r} is not allowed")


def validate_folder_name(name: str) -> None:
    if not name or not name.endswith("/"):
        raise InvalidArgument(f"folder name {name!r} must be non-empty and end with '/'")
    encoded = _utf8(name, "folder name")
    if len(encoded) > MAX_FOLDER_NAME_BYTES:
        raise InvalidArgument(f"folder name is {len(encoded)} bytes; the limit is {MAX_FOLDER_NAME_BYTES}")
    if name.count("/") > MAX_FOLDER_DEPTH:
        raise InvalidArgument(f"folder {name!r} is deeper than {MAX_FOLDER_DEPTH} levels")
    if "\r" in name or "\n" in name:
        raise InvalidArgument("folder names must not contain carriage returns or line feeds")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid UTF-8") from exc


def folder_name(folder_id: str, what: str = "folder id") -> str:
    """The folder a folder id names: ids may leave out the trailing '/'."""
    if not folder_id:
        raise InvalidArgument(f"{what} is required")
    return folder_id if folder_id.endswith("/") else folder_id + "/"


def parent_folders(object_name: str) -> list[str]:
    """Folders an object lives under: every prefix ending in '/' (``a/`` for ``a/``)."""
    return [object_name[:i + 1] for i, char in enumerate(object_name) if char == "/"]


def parent_folder(folder: str) -> str:
    """The folder containing ``folder`` ('' is the bucket root)."""
    cut = folder[:-1].rfind("/")
    return folder[:cut + 1]


def check_folder_limits(object_name: str) -> None:
    if object_name.count("/") > MAX_FOLDER_DEPTH:
        raise InvalidArgument(
            f"object name has more than {MAX_FOLDER_DEPTH} '/' (the folder depth limit)")
    folders = parent_folders(object_name)
    if folders and len(folders[-1].encode()) > MAX_FOLDER_NAME_BYTES:
        raise InvalidArgument(
            f"object name implies a folder longer than {MAX_FOLDER_NAME_BYTES} bytes")
