"""How the filesystem core fails: :class:`FSError` carries the errno FUSE returns."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from rapidmount.storage.errors import StorageError

log = logging.getLogger("rapidmount.fs")


class FSError(Exception):
    def __init__(self, errno_: int, message: str = "") -> None:
        super().__init__(message or os.strerror(errno_))
        self.errno = errno_


class NoSuchName(FSError):
    """ENOENT from a lookup, with the seconds the kernel may cache the answer
    (no longer than the mount itself trusts it)."""

    def __init__(self, cache_for: float) -> None:
        super().__init__(errno.ENOENT)
        self.cache_for = cache_for


#: Answers a program meets in ordinary use (mkdir of an existing name, a
#: race with another client): worth a line, not an error.
_LEVELS = {errno.ENOENT: logging.INFO, errno.EEXIST: logging.INFO, errno.ENOTEMPTY: logging.INFO,
           errno.ESTALE: logging.WARNING, errno.ENOSPC: logging.WARNING, errno.EDQUOT: logging.WARNING}

#: Failures of the local staged copy (``--temp-dir``) the kernel sees as they
#: are, as on a local file system: no room. Any other is EIO.
_LOCAL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class RetryRefused(FSError):
    """ESTALE for the kernel's retry of a change that was just refused."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.ESTALE, f"{path!r} was changed by another client")


def log_failure(err: StorageError, context: str = "") -> None:
    """One line per failed storage call, with the object and status code as fields."""
    log.log(_LEVELS.get(err.errno, logging.ERROR), "%s%s", context, err, extra=err.log_fields())


def fs_error(err: StorageError, context: str = "") -> FSError:
    """The storage failure, logged once, as the error the kernel sees."""
    log_failure(err, context)
    return FSError(err.errno, str(err))


def local_error(err: OSError, context: str) -> FSError:
    """A failure of a staged copy in ``--temp-dir``, logged as one line."""
    code = err.errno if err.errno in _LOCAL_ERRNOS else errno.EIO
    reason = os.strerror(err.errno) if err.errno else str(err)
    log.log(_LEVELS.get(code, logging.ERROR), "%s: %s", context, reason,
            extra={"errno": errno.errorcode.get(code, code)})
    return FSError(code, f"{context}: {reason}")


_P = ParamSpec("_P")
_R = TypeVar("_R")


async def storage_call(fn: Callable[_P, Awaitable[_R]], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``await fn(...)`` on the store; a StorageError leaves as FSError, logged once."""
    try:
        return await fn(*args, **kwargs)
    except StorageError as err:
        raise fs_error(err) from None
