"""The one place that says which errno a storage failure becomes.

Both storage implementations (gRPC and in-memory) raise
:class:`StorageError` carrying the gRPC status code of the failure; the
filesystem core returns its ``errno`` to the kernel unchanged.
"""

from __future__ import annotations

import errno

import grpc

__all__ = ["StorageError", "errno_for"]

_ERRNO_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: errno.ENOENT,
    grpc.StatusCode.ALREADY_EXISTS: errno.EEXIST,
    grpc.StatusCode.PERMISSION_DENIED: errno.EACCES,
    grpc.StatusCode.UNAUTHENTICATED: errno.EACCES,
    # A generation precondition failed, or another writer took the object over.
    grpc.StatusCode.FAILED_PRECONDITION: errno.ESTALE,
    grpc.StatusCode.OUT_OF_RANGE: errno.EINVAL,
    grpc.StatusCode.INVALID_ARGUMENT: errno.EINVAL,
    grpc.StatusCode.UNIMPLEMENTED: errno.ENOTSUP,
    grpc.StatusCode.CANCELLED: errno.EINTR,
}


def errno_for(code: grpc.StatusCode | None, *, pinned_generation: bool = False) -> int:
    """The errno of a call that ended with ``code``.

    ``pinned_generation``: the call named one generation of the object, so
    NOT_FOUND means that generation was replaced or deleted (ESTALE), not
    that the name is free.
    """
    if code == grpc.StatusCode.NOT_FOUND and pinned_generation:
        return errno.ESTALE
    return _ERRNO_BY_CODE.get(code, errno.EIO)


class StorageError(Exception):
    """A storage operation failed for good; ``errno`` is what FUSE returns."""

    def __init__(self, message: str, *, errno_: int | None = None,
                 code: grpc.StatusCode | None = None, object_name: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno_ if errno_ is not None else errno_for(code)
        self.code = code
        self.object_name = object_name

    @classmethod
    def from_rpc(cls, err: grpc.aio.AioRpcError | grpc.RpcError, what: str, *,
                 object_name: str | None = None, pinned_generation: bool = False) -> "StorageError":
        code = err.code()
        detail = " ".join((err.details() or "").split())  # one line, whatever the server sent
        return cls(f"{what}: {code.name}: {detail}".rstrip(": "),
                   errno_=errno_for(code, pinned_generation=pinned_generation), code=code,
                   object_name=object_name)

    def __reduce__(self):
        # Crosses to the FUSE process from a worker: keep errno, code and object.
        return _rebuild, (type(self), str(self), self.errno, self.code, self.object_name)

    def log_fields(self) -> dict:
        """Structured log fields: the object, the gRPC status code, the errno."""
        return {"object": self.object_name, "grpc_code": self.code.name if self.code else None,
                "errno": errno.errorcode.get(self.errno, self.errno)}


def _rebuild(kind: type, message: str, errno_: int, code: grpc.StatusCode | None,
             object_name: str | None) -> StorageError:
    error = kind.__new__(kind)
    StorageError.__init__(error, message, errno_=errno_, code=code, object_name=object_name)
    return error
