"""The requests the emulator's store refuses, one class per gRPC status."""

from __future__ import annotations


class StoreError(Exception):
    """A request the store refuses; ``code`` names the gRPC status."""

    code = "INTERNAL"


class NotFound(StoreError):
    code = "NOT_FOUND"


class FailedPrecondition(StoreError):
    code = "FAILED_PRECONDITION"


class InvalidArgument(StoreError):
    code = "INVALID_ARGUMENT"


class OutOfRange(StoreError):
    code = "OUT_OF_RANGE"


class AlreadyExists(StoreError):
    code = "ALREADY_EXISTS"
