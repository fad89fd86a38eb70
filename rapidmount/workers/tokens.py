"""Access tokens, a worker's side (asyncio): the token the FUSE process pushed.

google-auth runs in the FUSE process only
(:mod:`rapidmount.dataplane.token_pusher`). A worker keeps the token pushed
last, with its serial number, for gRPC's plugin threads; asks for the next
one when it is due (``token_wanted``); and reports a token the service
refused before its expiry (``token_refused``), once for all the calls that
then wait for a fresh one. The token never reaches a log.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from rapidmount.shared.auth import REFRESH_WAIT_S, CredentialsError
from rapidmount.workers.client.errors import is_token_refused
from rapidmount.workers.retry import Reauth

#: How long before a pushed token's end a worker asks for the next one.
ASK_AHEAD_S = 60.0


class PushedTokens:
    """A worker's token, as pushed by the FUSE process (thread-safe: gRPC's
    plugin threads read it while the worker's loop stores pushes).

    ``push``, ``push_failure`` and ``renew`` run on the worker's event loop.
    """

    def __init__(self, ask: Callable[[], object], report_refused: Callable[[int], None] = lambda serial: None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ask = ask
        self._report_refused = report_refused
        self._clock = clock
        self._cond = threading.Condition()
        self._header: str | None = None
        self._serial = 0
        self._usable_until = 0.0
        self._asked = False
        self._failure: str | None = None
        self._renewals: list[asyncio.Future[str | None]] = []  # calls waiting for a token later than a refused one

    def push(self, serial: int, header: str, usable_for: float) -> None:
        with self._cond:
            self._header = header
            self._serial = max(self._serial, serial)
            self._usable_until = self._clock() + usable_for
            self._asked = False
            self._failure = None
            self._cond.notify_all()
        self._settle(None)

    def push_failure(self, message: str) -> None:
        """The FUSE process could not refresh: calls without a usable token fail with ``message``."""
        with self._cond:
            self._failure = message
            self._asked = False  # the next call asks again (the refresh backs off on its own)
            self._cond.notify_all()
        self._settle(message)

    def in_use(self) -> int:
        """The serial of the token a call made now carries."""
        return self._serial

    async def renew(self, refused: int, timeout: float) -> str | None:
        """The service refused token ``refused``: None once a later one is
        here, else why none came within ``timeout`` seconds. One report to
        the FUSE process for all the calls that wait for the same token."""
        if self._serial > refused:
            return None
        future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if not self._renewals:
            self._report_refused(refused)
        self._renewals.append(future)
        try:
            return await asyncio.wait_for(future, max(0.0, timeout))
        except asyncio.TimeoutError:
            return f"the mount sent none within {timeout:.1f}s"
        finally:
            if future in self._renewals:
                self._renewals.remove(future)

    def reauth(self) -> Reauth:
        """The retry policy's way to a fresh token after a refusal."""
        return Reauth(refused=is_token_refused, in_use=self.in_use, renew=self.renew)

    def _settle(self, failure: str | None) -> None:
        waiting, self._renewals = self._renewals, []
        for future in waiting:
            if not future.done():
                future.set_result(failure)

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
