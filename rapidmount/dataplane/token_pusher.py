"""Access tokens, the FUSE process's side (trio): refreshed here only, pushed to every worker.

google-auth runs in one place (:class:`~rapidmount.shared.auth.TokenSource`
in the FUSE process, on a thread of its own). :class:`TokenPusher` pushes
each fresh token, with a serial number, to every worker; a worker whose
token is due asks for one (``token_wanted``). A worker whose token the
service refused before its expiry (revoked) reports its serial
(``token_refused``): the pusher refreshes once for the first report of that
token, and the others of the burst wait for that refresh. The token crosses
only the workers' sockets, never a log. A worker's side is
:mod:`rapidmount.workers.tokens`.
"""

from __future__ import annotations

import logging
from typing import cast

import trio

from rapidmount.shared.auth import RETRY_MAX_S, CredentialsError, TokenSource
from rapidmount.dataplane.pool import WorkerConnection, WorkerPool

log = logging.getLogger("rapidmount.auth")

#: Refreshes for refused tokens come at most this often: a service that
#: refuses every token must not make the mount hammer the token endpoint
#: (a refusal meanwhile waits for the next one).
RENEW_INTERVAL_S = 1.0


class TokenPusher:
    """The token source, and every worker of ``pool`` kept supplied; the
    workers' ``token_wanted`` and ``token_refused`` notices come here."""

    def __init__(self, source: TokenSource, pool: WorkerPool) -> None:
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
            self._refused = max(self._refused, int(cast(int, value)))
            self._wake.set()
        elif kind == "token_wanted":
            self._wake.set()

    def _message(self) -> tuple[int, str | None, float]:
        return self._serial, self._header, self._usable_until - trio.current_time()

    async def hello(self, connection: WorkerConnection) -> None:
        """A starting worker gets the current token before anything else."""
        if self._header is None:
            header, usable_for, _ = await trio.to_thread.run_sync(self._source.current)
            if self._header is None:
                self._publish(header, usable_for)
        await connection.notify("token", self._message())

    def _publish(self, header: str, usable_for: float) -> None:
        self._serial += 1
        self._header = header
        self._usable_until = trio.current_time() + usable_for

    async def run(self) -> None:
        """Refresh ahead of expiry and after refusals; push each token to every worker."""
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
            header, usable_for, refresh_in = await trio.to_thread.run_sync(self._source.current)
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
