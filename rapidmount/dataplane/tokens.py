"""Access tokens: refreshed in the FUSE process only, pushed to every worker.

google-auth runs in one place (:class:`~rapidmount.client.auth.TokenSource`
in the FUSE process, on a thread of its own). The FUSE process pushes each
fresh token to every worker; a worker whose token is due asks for one. The
token crosses only the workers' sockets, never a log.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rapidmount.client.auth import REFRESH_WAIT_S, CredentialsError

#: How long before a pushed token's end a worker asks for the next one.
ASK_AHEAD_S = 60.0


class PushedTokens:
    """A worker's token, as pushed by the FUSE process (thread-safe: gRPC's
    plugin threads read it while the worker's loop stores pushes)."""

    def __init__(self, ask: Callable[[], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._ask = ask
        self._clock = clock
        self._cond = threading.Condition()
        self._header: str | None = None
        self._usable_until = 0.0
        self._asked = False
        self._failure: str | None = None

    def push(self, header: str, usable_for: float) -> None:
        with self._cond:
            self._header = header
            self._usable_until = self._clock() + usable_for
            self._asked = False
            self._failure = None
            self._cond.notify_all()

    def push_failure(self, message: str) -> None:
        """The FUSE process could not refresh: calls without a usable token fail with ``message``."""
        with self._cond:
            self._failure = message
            self._asked = False  # the next call asks again (the refresh backs off on its own)
            self._cond.notify_all()

    def header(self) -> str:
        """The ``authorization`` header for the next call; waits for a push if the token is spent."""
        with self._cond:
            give_up = self._clock() + REFRESH_WAIT_S
            while True:
                now = self._clock()
                if self._header is not None and now < self._usable_until:
                    if now >= self._usable_until - ASK_AHEAD_S:
                        self._ask_once()
                    return self._header
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    self._ask_once()  # the mount tries again when its backoff allows
                    raise CredentialsError(failure)
                self._ask_once()
                if now >= give_up:
                    raise CredentialsError("cannot get an access token: the mount sent none in time")
                self._cond.wait(min(1.0, give_up - now))

    def _ask_once(self) -> None:
        if not self._asked:
            self._asked = True
            self._ask()
