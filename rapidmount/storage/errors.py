"""The one place that says which errno a storage failure becomes.

Both storage implementations (over the data-plane workers, and in memory)
raise :class:`StorageError` carrying a :class:`StorageCode`, the seam's own
name for why the call failed; the client maps the wire's status to it once
(``rapidmount.workers.client.errors``). The filesystem core returns the error's
``errno`` to the kernel unchanged.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable

__all__ = ["StorageCode", "StorageError", "errno_for"]


class StorageCode(enum.Enum):
    """Why a storage call failed: the service's canonical status codes, named
    as the service documents them (and as logs and metrics show them)."""

    CANCELLED = enum.auto()
    UNKNOWN = enum.auto()
    INVALID_ARGUMENT = enum.auto()
    DEADLINE_EXCEEDED = enum.auto()
    NOT_FOUND = enum.auto()
    ALREADY_EXISTS = enum.auto()
    PERMISSION_DENIED = enum.auto()
    RESOURCE_EXHAUSTED = enum.auto()
    #: A generation precondition failed, or another writer took the object over.
    FAILED_PRECONDITION = enum.auto()
    ABORTED = enum.auto()
    OUT_OF_RANGE = enum.auto()
    UNIMPLEMENTED = enum.auto()
    INTERNAL = enum.auto()
    UNAVAILABLE = enum.auto()
    DATA_LOSS = enum.auto()
    #: The credentials were refused (only final once a fresh token was refused too).
    UNAUTHENTICATED = enum.auto()


_ERRNO_BY_CODE: dict[StorageCode | None, int] = {
    StorageCode.NOT_FOUND: errno.ENOENT,
    StorageCode.ALREADY_EXISTS: errno.EEXIST,
    StorageCode.PERMISSION_DENIED: errno.EACCES,
    StorageCode.UNAUTHENTICATED: errno.EACCES,
    StorageCode.FAILED_PRECONDITION: errno.ESTALE,
    StorageCode.OUT_OF_RANGE: errno.EINVAL,
    StorageCode.INVALID_ARGUMENT: errno.EINVAL,
    StorageCode.UNIMPLEMENTED: errno.ENOTSUP,
    StorageCode.CANCELLED: errno.EINTR,
}


def errno_for(code: StorageCode | None, *, pinned_generation: bool = False) -> int:
    """The errno of a call that ended with ``code``.

    ``pinned_generation``: the call named one generation of the object, so
    NOT_FOUND means that generation was replaced or deleted (ESTALE), not
    that the name is free.
    """
    if code is StorageCode.NOT_FOUND and pinned_generation:
        return errno.ESTALE
    return _ERRNO_BY_CODE.get(code, errno.EIO)


class StorageError(Exception):
    """A storage operation failed for good; ``errno`` is what FUSE returns."""

    def __init__(self, message: str, *, errno_: int | None = None,
                 code: StorageCode | None = None, object_name: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno_ if errno_ is not None else errno_for(code)
        self.code = code
        self.object_name = object_name

    def __reduce__(self) -> tuple[Callable[..., StorageError], tuple[object, ...]]:
        # Crosses to the FUSE process from a worker: keep errno, code and object.
        return _rebuild, (type(self), str(self), self.errno, self.code, self.object_name)

    def log_fields(self) -> dict[str, object]:
        """Structured log fields: the object, the service's status code, the errno."""
        return {"object": self.object_name, "grpc_code": self.code.name if self.code else None,
                "errno": errno.errorcode.get(self.errno, self.errno)}


def _rebuild(kind: type[StorageError], message: str, errno_: int, code: StorageCode | None,
             object_name: str | None) -> StorageError:
    error = kind.__new__(kind)
    StorageError.__init__(error, message, errno_=errno_, code=code, object_name=object_name)
    return error
