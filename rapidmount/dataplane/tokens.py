"""Access tokens: refreshed in the FUSE process only, pushed to every worker.

google-auth runs in one place (:class:`~rapidmount.client.auth.TokenSource`
in the FUSE process, on a thread of its own). :class:`TokenPusher` pushes
each fresh token, with a serial number, to every worker; a worker whose
token is due asks for one (``token_wanted``). A worker whose token the
service refused before its expiry (revoked) reports its serial
(``token_refused``): the pusher refreshes once for the first report of that
token, and the others of the burst wait for that refresh. The token crosses
only the workers' sockets, never a log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from rapidmount.client.auth import REFRESH_WAIT_S, RETRY_MAX_S, CredentialsError, TokenSource
from rapidmount.client.errors import is_token_refused
from rapidmount.storage.retry import Reauth

log = logging.getLogger("rapidmount.auth")

#: How long before a pushed token's end a worker asks for the next one.
ASK_AHEAD_S = 60.0
#: Refreshes for refused tokens come at most this often: a service that
#: refuses every token must not make the mount hammer the token endpoint
#: (a refusal meanwhile waits for the next one).
RENEW_INTERVAL_S = 1.0

class PushedTokens:
    """A worker's token, as pushed by the FUSE process (thread-safe: gRPC's
    plugin threads read it while the worker's loop stores pushes).

    ``push``, ``push_failure`` and ``renew`` run on the worker's event loop.
    """

    def __init__(self, ask: Callable[[], None], report_refused: Callable[[int], None] = lambda serial: None, *,
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
        self._renewals: list[asyncio.Future] = []  # calls waiting for a token later than a refused one

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
        future = asyncio.get_running_loop().create_future()
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


class TokenPusher:
    """The FUSE process's side: the token source, and every worker kept supplied.

    ``pool`` is the :class:`~rapidmount.dataplane.pool.WorkerPool`; its
    workers' ``token_wanted`` and ``token_refused`` notices come here.
    """

    def __init__(self, source: TokenSource, pool) -> None:
        import trio  # here only: workers run asyncio and never load trio

        self._trio = trio
        self._source = source
        self._pool = pool
        self._serial = 0
        self._header: str | None = None
        self._usable_until = 0.0
        self._wake = trio.Event()
        self._refused = 0  # the latest serial a worker reported refused (0: none since last looked)
        self._renewed_at = float("-inf")
        #: Refreshes made because the service refused a token.
        self.renewals = 0
        pool.add_notice_handler(self._notice)
        pool.started_notices.append(self.hello)

    def _notice(self, kind: str, value: object) -> None:
        if kind == "token_refused":
            self._refused = max(self._refused, int(value))
            self._wake.set()
        elif kind == "token_wanted":
            self._wake.set()

    def _message(self) -> tuple[int, str, float]:
        return self._serial, self._header, self._usable_until - self._trio.current_time()

    async def hello(self, connection) -> None:
        """A starting worker gets the current token before anything else."""
        if self._header is None:
            header, usable_for, _ = await self._trio.to_thread.run_sync(self._source.current)
            if self._header is None:
                self._publish(header, usable_for)
        await connection.notify("token", self._message())

    def _publish(self, header: str, usable_for: float) -> None:
        self._serial += 1
        self._header = header
        self._usable_until = self._trio.current_time() + usable_for

    async def run(self) -> None:
        """Refresh ahead of expiry and after refusals; push each token to every worker."""
        trio = self._trio
        while True:
            self._wake = trio.Event()  # a notice from now on wakes the wait below
            refused, self._refused = self._refused, 0
            if refused and refused >= self._serial:
                refresh_in = await self._renew()
            else:
                refresh_in = await self._keep_fresh(resend=bool(refused))
            with trio.move_on_after(max(1.0, refresh_in)):
                await self._wake.wait()

    async def _keep_fresh(self, *, resend: bool) -> float:
        """The token source's current token, pushed if new (or ``resend``: a
        worker reported an older token refused, so it may have missed one)."""
        try:
            header, usable_for, refresh_in = await self._trio.to_thread.run_sync(self._source.current)
        except CredentialsError as err:
            # Logged by the token source. Workers keep a token that still works;
            # calls without one fail with this line instead of waiting.
            await self._pool.broadcast("token_failed", str(err))
            return RETRY_MAX_S
        if self._header is None or header != self._header:
            self._publish(header, usable_for)
            resend = True
        if resend:
            await self._pool.broadcast("token", self._message())
        return refresh_in

    async def _renew(self) -> float:
        """The service refused the current token: one refresh, pushed even if
        the endpoint gave the same token (the calls waiting for it then fail)."""
        trio = self._trio
        await trio.sleep_until(self._renewed_at + RENEW_INTERVAL_S)
        self._renewed_at = trio.current_time()
        self.renewals += 1
        log.info("the storage service refused the access token before its expiry; refreshing it")
        try:
            header, usable_for, refresh_in = await trio.to_thread.run_sync(self._source.renew, self._header)
        except CredentialsError as err:
            await self._pool.broadcast("token_failed", str(err))
            return RETRY_MAX_S
        self._publish(header, usable_for)
        await self._pool.broadcast("token", self._message())
        return refresh_in
