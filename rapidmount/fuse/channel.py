"""One ``/dev/fuse`` descriptor, as the request loop writes to it.

The kernel finds a reply's request in the queue of the descriptor that read
it, so a request read from a descriptor (the mount's, or a clone of it) is
answered on the same one: each loop holds its own :class:`Channel`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Sequence
from typing import Any

log = logging.getLogger("rapidmount.fuse")


class Channel:
    """Writes replies and notifications to descriptor ``fd``."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def reply(self, message: bytes) -> bool:
        """Write one whole message. False when the kernel refused it: ENOENT
        (its request was interrupted, or the connection aborted) is expected
        and dropped quietly; anything else is logged."""
        try:
            os.write(self.fd, message)
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.warning("a FUSE reply was refused: %s", err.strerror)
            return False
        return True

    def reply_vector(self, buffers: Sequence[Any]) -> bool:
        """Write one message made of ``buffers`` (a header, then views of the
        bytes where they are). False as for :meth:`reply`; a refusal other
        than ENOENT is logged and the caller answers the request with an error."""
        try:
            os.writev(self.fd, buffers)
        except OSError as err:
            if err.errno != errno.ENOENT:
                log.info("a FUSE reply was refused (%s)", err.strerror)
                return False
            return True  # nobody waits for it any more: nothing more to answer
        return True
