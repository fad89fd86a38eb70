"""The grpc.aio channel a worker opens to the storage endpoint, as its plan says.

The plan (target and security) is decided in ``rapidmount.shared.channel_plan``.
"""

from __future__ import annotations

import asyncio

import grpc

from rapidmount.shared import wire
from rapidmount.shared.channel_plan import DIRECTPATH, PLAINTEXT, ChannelPlan


# grpc waits up to 120 s (1 s, growing 1.6 times) between attempts to
# reconnect, and fails calls at once meanwhile: after a long outage the
# service would come back long before the channel looked, past
# --retry-deadline. Attempts at most a second apart bound that wait.
RECONNECT_BACKOFF_MAX_MS = 1000
CHANNEL_OPTIONS = (*wire.GRPC_MESSAGE_OPTIONS,
                   ("grpc.keepalive_time_ms", 30_000),
                   ("grpc.keepalive_timeout_ms", 10_000),
                   ("grpc.http2.max_pings_without_data", 0),
                   ("grpc.initial_reconnect_backoff_ms", 250),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS))


def channel_credentials(plan: ChannelPlan, *, call_credentials: grpc.CallCredentials | None = None,
                        root_certificates: bytes | None = None) -> grpc.ChannelCredentials | None:
    """The channel credentials ``plan`` asks for (None: plaintext)."""
    if plan.tokens and call_credentials is None:
        raise ValueError(f"a {plan.security} channel with tokens needs call credentials")
    if plan.security == PLAINTEXT:
        return None
    if plan.security == DIRECTPATH:
        return grpc.compute_engine_channel_credentials(call_credentials)
    tls = grpc.ssl_channel_credentials(root_certificates=root_certificates)
    if call_credentials is not None and plan.tokens:
        return grpc.composite_channel_credentials(tls, call_credentials)
    return tls


def make_channel(plan: ChannelPlan, *, call_credentials: grpc.CallCredentials | None = None,
                 root_certificates: bytes | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel as ``plan`` says (call on the asyncio thread)."""
    credentials = channel_credentials(plan, call_credentials=call_credentials,
                                      root_certificates=root_certificates)
    if credentials is None:
        return grpc.aio.insecure_channel(plan.target, options=list(CHANNEL_OPTIONS))
    return grpc.aio.secure_channel(plan.target, credentials, options=list(CHANNEL_OPTIONS))


async def reconnected(channel: grpc.aio.Channel, timeout: float) -> bool:
    """False at once while ``channel`` is connected. Else True, once it is
    connected again or ``timeout`` seconds have passed (the retry policy's
    ``reconnected``: a retry then goes out as soon as the service is back)."""
    ready = grpc.ChannelConnectivity.READY
    state = channel.get_state(try_to_connect=True)
    if state == ready:
        return False
    try:
        async with asyncio.timeout(timeout):
            while state != ready:
                await channel.wait_for_state_change(state)
                state = channel.get_state(try_to_connect=True)
    except TimeoutError:
        pass
    return True
