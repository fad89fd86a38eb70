"""Which gRPC channel reaches the storage endpoint: target and security (pure).

The FUSE process checks the flags with :func:`plan_channel` before it
mounts; each worker builds the channel the plan describes
(``rapidmount.workers.client.channel``).

- ``plaintext``: no TLS, no token (``--anonymous``, for an emulator);
- ``tls``: TLS with the system roots (or ``--ca-file``), a token per call
  unless anonymous;
- ``directpath``: the ``google-c2p:///`` target, with Compute Engine channel
  credentials (ALTS on DirectPath, TLS when gRPC falls back) carrying the
  same per-call token, as Google's own clients do on GCP.
"""

from __future__ import annotations

from dataclasses import dataclass

DIRECTPATH_SCHEME = "google-c2p:///"
PLAINTEXT, TLS, DIRECTPATH = "plaintext", "tls", "directpath"


@dataclass(frozen=True)
class ChannelPlan:
    target: str
    security: str  # PLAINTEXT, TLS or DIRECTPATH
    tokens: bool  # attach an access token to every call

    def describe(self) -> str:
        auth = "access tokens" if self.tokens else "no credentials"
        return f"{self.target} ({self.security}, {auth})"


def directpath_target(endpoint: str) -> str:
    """``google-c2p:///HOST`` for ``HOST:PORT`` (DirectPath always uses 443)."""
    if endpoint.startswith(DIRECTPATH_SCHEME):
        return endpoint
    host = endpoint.rpartition(":")[0] if ":" in endpoint else endpoint
    return DIRECTPATH_SCHEME + host.strip("[]")


def plan_channel(endpoint: str, *, anonymous: bool, directpath: bool, ca_file: bool) -> ChannelPlan:
    """How to reach ``endpoint``; raises ValueError for combinations that cannot work."""
    if endpoint.startswith(DIRECTPATH_SCHEME):
        directpath = True
    if directpath:
        if anonymous:
            raise ValueError("--directpath needs credentials: it cannot be combined with --anonymous")
        if ca_file:
            raise ValueError("--directpath uses Google's own certificates: drop --ca-file")
        return ChannelPlan(directpath_target(endpoint), DIRECTPATH, tokens=True)
    if anonymous:
        return ChannelPlan(endpoint, TLS if ca_file else PLAINTEXT, tokens=False)
    return ChannelPlan(endpoint, TLS, tokens=True)
