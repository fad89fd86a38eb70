"""Who may call the emulator: bearer tokens, and requester-pays buckets.

By default every call is welcome, as with the anonymous emulator. With a
token check (``--require-token`` or a validator function), a call without an
``authorization: Bearer TOKEN`` header, or with a token the check refuses,
fails with UNAUTHENTICATED before it does anything. A revoked token
(:meth:`AccessControl.revoke`) is refused before its expiry, and ends the
open streams that carry it at their next message. A requester-pays bucket
refuses calls that name no billing project in ``x-goog-user-project``.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable, Iterable

TokenValidator = Callable[[str], bool]

USER_PROJECT_HEADER = "x-goog-user-project"

#: A call's invocation metadata: (key, value) pairs, binary values as bytes; None if it has none.
Metadata = Iterable[tuple[str, str | bytes]] | None


def exact_token(expected: str) -> TokenValidator:
    """A validator accepting exactly ``expected`` (compared in constant time)."""
    wanted = expected.encode()
    return lambda token: hmac.compare_digest(token.encode(), wanted)


_REVOKED = "Invalid Credentials: the access token has been revoked"


def _header(metadata: Metadata, key: str) -> str | None:
    for name, value in metadata or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class AccessControl:
    """The token check and the requester-pays buckets; counts what it saw.

    ``validator`` runs on the emulator's event loop for every call: it must
    be quick and must not block.
    """

    def __init__(self, validator: TokenValidator | None = None, requester_pays: Iterable[str] = ()) -> None:
        self._validator = validator
        self._requester_pays = set(requester_pays)
        self._lock = threading.Lock()
        self._counts = {"accepted": 0, "missing": 0, "rejected": 0, "revoked": 0, "billed": 0}
        self.billed_projects: set[str] = set()
        self._revoked: frozenset[str] = frozenset()  # replaced whole: streams read it without the lock

    def set_validator(self, validator: TokenValidator | None) -> None:
        self._validator = validator

    def revoke(self, token: str) -> None:
        """Refuse ``token`` from now on, whatever the validator says, and end
        the open streams that carry it (UNAUTHENTICATED at their next message)."""
        with self._lock:
            self._revoked = self._revoked | {token}

    @property
    def revocations(self) -> bool:
        """Whether any token was revoked (streams check their own only then)."""
        return bool(self._revoked)

    def stream_problem(self, metadata: Metadata) -> str | None:
        """Why a call or an open stream must end now (its token was revoked), or None."""
        if not self._revoked:
            return None  # the usual case: one check per message
        if self._bearer(metadata) in self._revoked:
            self._bump("revoked")
            return _REVOKED
        return None

    @staticmethod
    def _bearer(metadata: Metadata) -> str | None:
        header = _header(metadata, "authorization")
        if header is None:
            return None
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def set_requester_pays(self, bucket: str, enabled: bool = True) -> None:
        with self._lock:
            (self._requester_pays.add if enabled else self._requester_pays.discard)(bucket)

    def is_requester_pays(self, bucket: str) -> bool:
        with self._lock:
            return bucket in self._requester_pays

    def _bump(self, key: str) -> None:
        with self._lock:
            self._counts[key] += 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def token_problem(self, metadata: Metadata) -> str | None:
        """Why the call's token is refused (UNAUTHENTICATED), or None."""
        if self.stream_problem(metadata) is not None:
            return _REVOKED
        validator = self._validator
        if validator is None:
            return None
        if _header(metadata, "authorization") is None:
            self._bump("missing")
            return ("Request is missing required authentication credential: "
                    "expected an OAuth 2 access token (authorization: Bearer TOKEN)")
        token = self._bearer(metadata)
        try:
            valid = token is not None and bool(token) and validator(token)
        except Exception:  # a validator that fails refuses
            valid = False
        if not valid:
            self._bump("rejected")
            return "Invalid Credentials: the access token is expired or not valid"
        self._bump("accepted")
        return None

    def billing_problem(self, bucket: str, metadata: Metadata) -> str | None:
        """Why a call on ``bucket`` is refused for billing (INVALID_ARGUMENT), or None."""
        if not self.is_requester_pays(bucket):
            return None
        project = _header(metadata, USER_PROJECT_HEADER)
        if not project:
            return f"Bucket {bucket} is a requester pays bucket but no user project provided."
        with self._lock:
            self._counts["billed"] += 1
            self.billed_projects.add(project)
        return None
