"""Google credentials for the mount, and an access token on every gRPC call.

Credentials come from ``--key-file`` or from Application Default Credentials
(google-auth). :class:`TokenSource` keeps the current access token and
refreshes it before it expires; :class:`TokenPlugin` hands a token to gRPC
as call credentials. In the mount, the TokenSource lives in the FUSE process
only (refreshed on a thread of trio's) and each token is pushed to the
data-plane workers, whose plugin reads the pushed token
(:mod:`rapidmount.dataplane.token_pusher` pushes,
:mod:`rapidmount.workers.tokens` keeps).

Where the blocking parts run: grpc invokes a metadata plugin on a thread of
its own for each call (never on the event loop), so a wait blocks only the
call that triggered it. Only one thread refreshes at a time. While the old token is still good for a
while ("stale"), other calls keep using it; once it is about to expire every
call waits for the refresh. A failed refresh fails the call with UNAVAILABLE,
which the caller's retry loop retries until its deadline, then ``EIO``.

No token, refresh token or key is ever logged: only what failed, and why.
"""

from __future__ import annotations

import datetime
import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import grpc

if TYPE_CHECKING:  # google-auth is imported where it is used: the workers never load it
    import google.auth.transport

log = logging.getLogger("rapidmount.auth")

STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.full_control"

# One HTTP request to a token endpoint or metadata server (google-auth would wait 120 s).
HTTP_TIMEOUT_S = 10.0
MIN_HTTP_TIMEOUT_S = 0.5
# A token is refreshed ahead of its expiry by a quarter of its lifetime, at
# most 3m45s (google-auth's own threshold); it is no longer sent in its last
# tenth, at most 10 s, so it cannot expire in flight.
STALE_FRACTION, STALE_AHEAD_MAX_S = 0.25, 225.0
SAFETY_FRACTION, SAFETY_MAX_S = 0.1, 10.0
# A call waits at most this long for another call's refresh (google-auth
# itself makes up to three attempts of HTTP_TIMEOUT_S each).
REFRESH_WAIT_S = 3 * HTTP_TIMEOUT_S + 5.0
# After a failed refresh, the next attempt waits (doubling up to the maximum).
RETRY_INITIAL_S, RETRY_MAX_S = 0.5, 30.0
_MESSAGE_LIMIT = 300


class CredentialsError(Exception):
    """Credentials could not be loaded, or a token not obtained (one line)."""


# -- when to refresh (pure) ---------------------------------------------------------------------------


class Freshness(enum.Enum):
    FRESH = "fresh"  # use it
    STALE = "stale"  # use it, and refresh it soon
    EXPIRED = "expired"  # do not send it: refresh first


@dataclass(frozen=True)
class TokenLife:
    """A token's lifetime on the monotonic clock; ``expires`` None = never."""

    obtained: float
    expires: float | None

    @property
    def lifetime(self) -> float:
        return float("inf") if self.expires is None else max(0.0, self.expires - self.obtained)

    @property
    def refresh_due(self) -> float:
        if self.expires is None:
            return float("inf")
        return self.expires - min(STALE_AHEAD_MAX_S, self.lifetime * STALE_FRACTION)

    @property
    def usable_until(self) -> float:
        if self.expires is None:
            return float("inf")
        return self.expires - min(SAFETY_MAX_S, self.lifetime * SAFETY_FRACTION)

    def freshness(self, now: float) -> Freshness:
        if now >= self.usable_until:
            return Freshness.EXPIRED
        if now >= self.refresh_due:
            return Freshness.STALE
        return Freshness.FRESH


def life_from_expiry(obtained: float, expiry: datetime.datetime | None,
                     utcnow: datetime.datetime) -> TokenLife:
    """google-auth's ``expiry`` (a naive UTC datetime) on the monotonic clock."""
    if expiry is None:
        return TokenLife(obtained, None)
    if expiry.tzinfo is not None:
        expiry = expiry.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return TokenLife(obtained, obtained + (expiry - utcnow).total_seconds())


def next_retry_delay(failures: int) -> float:
    """Seconds before the next refresh attempt after ``failures`` in a row."""
    return min(RETRY_MAX_S, RETRY_INITIAL_S * 2.0 ** max(0, failures - 1))


def describe_failure(err: BaseException) -> str:
    """One line saying why google-auth failed, without the response body's bulk."""
    first = err.args[0] if err.args and isinstance(err.args[0], str) else str(err)
    text = " ".join(first.split()) or type(err).__name__
    return text if len(text) <= _MESSAGE_LIMIT else text[:_MESSAGE_LIMIT - 3] + "..."


# -- loading credentials -------------------------------------------------------------------------------


class Credentials(Protocol):
    """What the mount uses of google-auth's credentials (``google.auth.credentials.Credentials``)."""

    @property
    def expiry(self) -> datetime.datetime | None: ...

    def refresh(self, request: google.auth.transport.Request) -> None: ...

    def apply(self, headers: dict[str, str]) -> None: ...


def _google_auth_request() -> google.auth.transport.Request:
    """google-auth's HTTP transport, with every request bounded in time.

    ``request.deadline`` (monotonic), when set, shortens requests further.
    """
    import google.auth.transport.requests

    class BoundedRequest(google.auth.transport.requests.Request):
        deadline: float | None = None

        def __call__(self, url: str, method: str = "GET", body: bytes | None = None,
                     headers: Mapping[str, str] | None = None, timeout: float | None = None,
                     **kwargs: Any) -> google.auth.transport.Response:
            limit = HTTP_TIMEOUT_S
            if self.deadline is not None:
                limit = max(MIN_HTTP_TIMEOUT_S, min(limit, self.deadline - time.monotonic()))
            timeout = limit if timeout is None else min(timeout, limit)
            return super().__call__(  # type: ignore[no-untyped-call, no-any-return]  # unannotated in google-auth
                url, method=method, body=body, headers=headers, timeout=timeout, **kwargs)

    return BoundedRequest()


def load_credentials(key_file: str | None) -> Credentials:
    """google-auth credentials from ``key_file``, or Application Default Credentials.

    Blocking (ADC may ask the metadata server); raises CredentialsError.
    """
    import google.auth
    import google.auth.exceptions

    credentials: Credentials
    if key_file is not None:
        try:
            with open(key_file, "rb"):
                pass
        except OSError as err:
            raise CredentialsError(f"--key-file: cannot read {key_file}: {err.strerror}") from None
        try:
            # google-auth leaves this function unannotated.
            credentials, _ = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
                key_file, scopes=[STORAGE_SCOPE])
        except (google.auth.exceptions.GoogleAuthError, ValueError, TypeError, KeyError) as err:
            reason = describe_failure(err)
            cause = err.args[1] if len(err.args) > 1 and isinstance(err.args[1], BaseException) else None
            if cause is not None:
                reason += f" ({describe_failure(cause)})"
            raise CredentialsError(f"--key-file: {key_file} is not a usable key file: {reason}") from None
        return credentials
    try:
        credentials, _ = google.auth.default(scopes=[STORAGE_SCOPE], request=_google_auth_request())
    except google.auth.exceptions.DefaultCredentialsError as err:
        if any(text in str(err) for text in ("Could not automatically determine credentials",
                                             "default credentials were not found")):
            raise CredentialsError(
                "no Google credentials found: set GOOGLE_APPLICATION_CREDENTIALS or --key-file, "
                "run on GCE/GKE, or use --anonymous with --endpoint") from None
        raise CredentialsError(f"Application Default Credentials: {describe_failure(err)}") from None
    except (google.auth.exceptions.GoogleAuthError, ValueError, TypeError, KeyError) as err:
        raise CredentialsError(f"Application Default Credentials: {describe_failure(err)}") from None
    return credentials


def credentials_kind(credentials: object) -> str:
    """What kind of credentials these are, for the log (never their content)."""
    kind = type(credentials)
    email = getattr(credentials, "service_account_email", None)
    label = f"{kind.__module__.removeprefix('google.')}.{kind.__name__}"
    return f"{label} ({email})" if isinstance(email, str) and "@" in email else label


# -- tokens --------------------------------------------------------------------------------------------


class TokenSource:
    """The current ``authorization`` header value, refreshed before it expires.

    Thread-safe; blocking (call it from a worker or gRPC plugin thread).
    """

    def __init__(self, credentials: Credentials, *, request: google.auth.transport.Request | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 utcnow: Callable[[], datetime.datetime] | None = None) -> None:
        self._credentials = credentials
        self._request = request if request is not None else _google_auth_request()
        self._clock = clock
        self._utcnow = utcnow or (lambda: datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None))
        self._cond = threading.Condition()
        self._header: str | None = None
        self._life: TokenLife | None = None
        self._refreshing = False
        self._failures = 0
        self._failure: str | None = None
        self._next_attempt = 0.0
        self.refreshes = 0

    def header(self) -> str:
        """``Bearer …`` for the next call; refreshes first if it must."""
        with self._cond:
            waited_until = self._clock() + REFRESH_WAIT_S
            while True:
                now = self._clock()
                state = Freshness.EXPIRED if self._life is None else self._life.freshness(now)
                if state is Freshness.FRESH:
                    return self._held()
                if state is Freshness.STALE and (self._refreshing or now < self._next_attempt):
                    return self._held()
                if not self._refreshing:
                    break
                # Expired, and another call is refreshing: wait for its outcome.
                if now >= waited_until:
                    raise CredentialsError("cannot get an access token: the refresh takes too long")
                self._cond.wait(waited_until - now)
                if not self._refreshing and self._failure is not None and self._clock() < self._next_attempt:
                    raise CredentialsError(self._failure)
            if state is Freshness.EXPIRED and self._failure is not None and now < self._next_attempt:
                raise CredentialsError(self._failure)  # fail fast while backing off
            self._refreshing = True
        try:
            return self._refresh()
        except CredentialsError:
            if state is Freshness.STALE:
                with self._cond:
                    if self._life is not None and self._life.freshness(self._clock()) is not Freshness.EXPIRED:
                        return self._held()
            raise

    def _held(self) -> str:
        """The header held; asked for only while ``_life`` is set, which is set with it."""
        assert self._header is not None
        return self._header

    def current(self) -> tuple[str, float, float]:
        """``(header, seconds it stays usable, seconds until a refresh is due)``,
        refreshing first if it must (blocking)."""
        return self._timed(self.header())

    def _timed(self, header: str) -> tuple[str, float, float]:
        with self._cond:
            life = self._life
        now = self._clock()
        if life is None:
            return header, 0.0, 0.0
        return header, life.usable_until - now, max(0.0, life.refresh_due - now)

    def renew(self, refused: str | None) -> tuple[str, float, float]:
        """The service refused ``refused`` before its expiry (revoked): a token
        refreshed since, as :meth:`current` (blocking). A refresh by another
        caller since counts; while backing off after a failed refresh, that
        failure is raised at once."""
        with self._cond:
            give_up = self._clock() + REFRESH_WAIT_S
            while self._refreshing:
                now = self._clock()
                if now >= give_up:
                    raise CredentialsError("cannot get an access token: the refresh takes too long")
                self._cond.wait(give_up - now)
            if self._header is not None and self._header != refused:
                return self._timed(self._header)
            if self._failure is not None and self._clock() < self._next_attempt:
                raise CredentialsError(self._failure)
            self._refreshing = True
        return self._timed(self._refresh())

    def fetch(self, deadline_s: float) -> None:
        """Get a token now, retrying transient failures for ``deadline_s`` (mount time)."""
        give_up = self._clock() + deadline_s
        if hasattr(self._request, "deadline"):
            self._request.deadline = time.monotonic() + deadline_s
        try:
            self._fetch_until(give_up)
        finally:
            if hasattr(self._request, "deadline"):
                self._request.deadline = None

    def _fetch_until(self, give_up: float) -> None:
        while True:
            with self._cond:
                while self._refreshing:
                    self._cond.wait(HTTP_TIMEOUT_S)
                self._refreshing = True
            try:
                self._refresh()
                return
            except _Transient as err:
                delay = next_retry_delay(self._failures)
                if self._clock() + delay > give_up:
                    raise CredentialsError(str(err)) from None
                time.sleep(delay)

    def _refresh(self) -> str:
        """One refresh (the caller set ``_refreshing``); returns the new header."""
        import google.auth.exceptions

        transient = False
        try:
            self._credentials.refresh(self._request)
            headers: dict[str, str] = {}
            self._credentials.apply(headers)
            header = headers.get("authorization")
            if not header:
                raise CredentialsError("the credentials gave no access token")
            life = life_from_expiry(self._clock(), self._credentials.expiry, self._utcnow())
        except Exception as err:  # any failure becomes one line; the token never appears
            if isinstance(err, google.auth.exceptions.TransportError):
                transient = True
            elif isinstance(err, google.auth.exceptions.RefreshError):
                transient = bool(getattr(err, "retryable", False))
            message = f"cannot get an access token: {describe_failure(err)}"
            with self._cond:
                self._refreshing = False
                self._failures += 1
                self._failure = message
                self._next_attempt = self._clock() + next_retry_delay(self._failures)
                first = self._failures == 1
                self._cond.notify_all()
            if first:
                log.warning("%s", message)
            else:
                log.debug("%s (attempt %d)", message, self._failures)
            raise (_Transient if transient else CredentialsError)(message) from None
        with self._cond:
            recovered = self._failures
            self._header, self._life = header, life
            self._refreshing = False
            self._failures, self._failure, self._next_attempt = 0, None, 0.0
            self.refreshes += 1
            self._cond.notify_all()
        if recovered:
            log.info("access token refreshed after %d failed attempt(s)", recovered)
        log.debug("access token refreshed, valid for %.0fs", life.lifetime)
        return header


class _Transient(CredentialsError):
    """A refresh failure worth retrying (network, or a 5xx from the endpoint)."""


class HeaderSource(Protocol):
    """What gives a call its ``authorization`` header: a :class:`TokenSource`,
    or in a worker the tokens the FUSE process pushed."""

    def header(self) -> str: ...


class TokenPlugin(grpc.AuthMetadataPlugin):  # type: ignore[misc]  # grpc ships no type hints
    """gRPC call credentials: the ``authorization`` header of every call."""

    def __init__(self, source: HeaderSource) -> None:
        self._source = source

    def __call__(self, context: grpc.AuthMetadataContext,
                 callback: grpc.AuthMetadataPluginCallback) -> None:
        try:
            header = self._source.header()
        except CredentialsError as err:
            callback((), err)
            return
        except Exception as err:  # never let grpc log a traceback here
            callback((), CredentialsError(f"cannot get an access token: {type(err).__name__}"))
            return
        callback((("authorization", header),), None)


def call_credentials(source: HeaderSource) -> grpc.CallCredentials:
    return grpc.metadata_call_credentials(TokenPlugin(source), name="rapidmount-token")
