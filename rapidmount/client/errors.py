"""What a gRPC failure means to the mount: retry it, or which errno to return."""

from __future__ import annotations

import errno
import random
import time
from dataclasses import dataclass

import grpc

from rapidmount import wire

# Transient failures: the call may succeed if repeated (with backoff).
RETRYABLE_CODES = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNKNOWN,
})

_ERRNO_BY_CODE = {
    grpc.StatusCode.NOT_FOUND: errno.ENOENT,
    grpc.StatusCode.ALREADY_EXISTS: errno.EEXIST,
    grpc.StatusCode.PERMISSION_DENIED: errno.EACCES,
    grpc.StatusCode.UNAUTHENTICATED: errno.EACCES,
    grpc.StatusCode.FAILED_PRECONDITION: errno.ESTALE,
    grpc.StatusCode.OUT_OF_RANGE: errno.EINVAL,
    grpc.StatusCode.INVALID_ARGUMENT: errno.EINVAL,
    grpc.StatusCode.UNIMPLEMENTED: errno.ENOTSUP,
    grpc.StatusCode.CANCELLED: errno.EINTR,
}


class StorageError(Exception):
    """A storage operation failed for good; ``errno`` is what FUSE returns."""

    def __init__(self, message: str, *, errno_: int = errno.EIO,
                 code: grpc.StatusCode | None = None, object_name: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        self.code = code
        self.object_name = object_name

    @classmethod
    def from_rpc(cls, err: grpc.aio.AioRpcError | grpc.RpcError, what: str, *,
                 object_name: str | None = None) -> "StorageError":
        code = err.code()
        detail = " ".join((err.details() or "").split())  # one line, whatever the server sent
        return cls(f"{what}: {code.name}: {detail}".rstrip(": "),
                   errno_=_ERRNO_BY_CODE.get(code, errno.EIO), code=code, object_name=object_name)

    def log_fields(self) -> dict:
        """Structured log fields: the object, the gRPC status code, the errno."""
        return {"object": self.object_name, "grpc_code": self.code.name if self.code else None,
                "errno": errno.errorcode.get(self.errno, self.errno)}


def describe(err: BaseException) -> str:
    """One line naming a failure (an AioRpcError's own str spans several lines)."""
    if isinstance(err, grpc.aio.AioRpcError):
        return f"{err.code().name}: {' '.join((err.details() or '').split())}".rstrip(": ")
    text = " ".join(str(err).split())
    return text or type(err).__name__


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


@dataclass
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a deadline.

    The deadline runs from the first failure of a streak; progress resets it.
    """

    deadline: float = 30.0
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    multiplier: float = 2.0

    def start(self) -> "RetryBudget":
        return RetryBudget(self)


class RetryBudget:
    def __init__(self, policy: RetryPolicy) -> None:
        self._policy = policy
        self._started: float | None = None
        self._backoff = policy.initial_backoff
        self.attempts = 0

    def reset(self) -> None:
        """Progress was made: the next failure starts a fresh streak."""
        self._started = None
        self._backoff = self._policy.initial_backoff

    def next_delay(self) -> float | None:
        """Seconds to wait before retrying, or None once the deadline has passed."""
        now = time.monotonic()
        if self._started is None:
            self._started = now
        remaining = self._started + self._policy.deadline - now
        if remaining <= 0:
            return None
        self.attempts += 1
        delay = random.uniform(0, self._backoff)
        self._backoff = min(self._backoff * self._policy.multiplier, self._policy.max_backoff)
        return min(delay, remaining)
