"""A worker's calls answered with one result: the unary Storage v2 calls of
:class:`~rapidmount.workers.client.storage.StorageClient`, and whole uploads
of a staged file.
"""

from __future__ import annotations

from typing import Any

from rapidmount.shared.messages import Message
from rapidmount.storage.errors import StorageError
from rapidmount.workers.descriptors import staged_bytes
from rapidmount.workers.state import WorkerState

#: The unary calls a worker makes for the FUSE process (``StorageClient`` methods).
CLIENT_CALLS = frozenset({
    "get_object", "stat_name", "list_page", "list_folders_page", "list_child_folders", "list_directory", "delete_object",
    "move_object", "update_metadata", "create_folder", "delete_folder", "rename_folder"})


class UnaryCalls(WorkerState):
    """The ``client`` and ``write_object`` calls."""

    async def op_client(self, method: str, args: Message, kwargs: dict[str, Any]) -> Any:
        if method not in CLIENT_CALLS:
            raise StorageError(f"unknown call {method!r}")
        return await getattr(self.client, method)(*args, **kwargs)

    async def op_write_object(self, name: str, size: int, kwargs: dict[str, Any], *, fd: int | None = None) -> Any:
        """A whole upload of the staged file ``fd`` (the call passed it), or of nothing."""
        source = staged_bytes(fd) if fd is not None else (lambda offset, n: b"")
        return await self.client.write_object(name, source, size, **kwargs)
