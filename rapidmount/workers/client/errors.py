"""Which gRPC failures are worth retrying, and what a final one becomes: a
:class:`StorageError` with the seam's :class:`StorageCode` (mapped from the
gRPC status here, and nowhere else) and the errno of the one map,
``rapidmount.storage.errors``."""

from __future__ import annotations

import errno
from typing import cast

import grpc

from rapidmount.shared import wire
from rapidmount.storage.errors import StorageCode, StorageError, errno_for
from rapidmount.workers.retry import CredentialsRefused, RetryPolicy

__all__ = ["ChecksumMismatch", "RETRYABLE_CODES", "RetryPolicy", "StorageError", "code_name", "describe",
           "final_error", "is_retryable", "is_token_refused", "rpc_error", "storage_code"]

#: Every gRPC status but OK, as the seam names it (the same canonical code).
_STORAGE_CODES = {status: StorageCode[status.name] for status in grpc.StatusCode if status is not grpc.StatusCode.OK}

# Transient failures: the call may succeed if repeated (with backoff).
RETRYABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNKNOWN,
})


def describe(err: BaseException) -> str:
    """One line naming a failure (an AioRpcError's own str spans several lines)."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {' '.join((err.details() or '').split())}".rstrip(": ")
    text = " ".join(str(err).split())
    return text or type(err).__name__


def storage_code(status: grpc.StatusCode | None) -> StorageCode | None:
    """The seam's code for a gRPC status (None for none, or OK)."""
    return _STORAGE_CODES.get(status)


def rpc_error(err: grpc.aio.AioRpcError | grpc.RpcError, what: str, *, object_name: str | None = None,
              pinned_generation: bool = False) -> StorageError:
    """The StorageError of a failed gRPC call, on one line."""
    code = storage_code(err.code())
    detail = " ".join((err.details() or "").split())  # one line, whatever the server sent
    return StorageError(f"{what}: {err.code().name}: {detail}".rstrip(": "),
                        errno_=errno_for(code, pinned_generation=pinned_generation), code=code,
                        object_name=object_name)


def code_name(err: BaseException) -> str | None:
    """The gRPC status code's name, for log fields (None if not a gRPC failure)."""
    return err.code().name if isinstance(err, grpc.aio.AioRpcError) else None


class ChecksumMismatch(Exception):
    """A chunk's CRC32C did not match its content (retried, never returned)."""


def is_retryable(err: BaseException) -> bool:
    if isinstance(err, ChecksumMismatch):
        return True
    if isinstance(err, grpc.aio.AioRpcError):
        code = err.code()
        if code in RETRYABLE_CODES:
            return True
        if code == grpc.StatusCode.ABORTED:
            # ABORTED is a redirect when it carries one; otherwise it's a conflict.
            details = wire.unpack_details(err.trailing_metadata(),
                                          wire.storage.BidiReadObjectRedirectedError,
                                          wire.storage.BidiWriteObjectRedirectedError)
            return bool(details)
    return False


def is_token_refused(err: BaseException) -> bool:
    """The service refused the call's access token (revoked, or expired early):
    a fresh token may cure it (``Reauth.refused``)."""
    return isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.UNAUTHENTICATED


def final_error(err: BaseException, what: str, *, object_name: str | None = None,
                pinned_generation: bool = False, deadline_passed: bool = False) -> StorageError:
    """What a call that failed for good raises (the ``give_up`` of ``retry_call``).

    Past the retry deadline it is EIO, whatever the last transient failure.
    """
    if isinstance(err, StorageError):
        return err
    if isinstance(err, CredentialsRefused):  # its errno is the refusal's (EACCES)
        return rpc_error(err.cause, f"{what} ({err.why})", object_name=object_name,
                         pinned_generation=pinned_generation)
    rpc_failed = isinstance(err, grpc.aio.AioRpcError)
    if deadline_passed:
        return StorageError(f"{what}: retry deadline exceeded ({describe(err)})", errno_=errno.EIO,
                            code=storage_code(cast(grpc.aio.AioRpcError, err).code()) if rpc_failed else None,
                            object_name=object_name)
    if rpc_failed:
        return rpc_error(err, what, object_name=object_name, pinned_generation=pinned_generation)
    return StorageError(f"{what}: {describe(err)}", errno_=errno.EIO, object_name=object_name)
