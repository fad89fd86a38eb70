"""Fault injection shared by the read and write streams.

``StreamMeter`` counts the data bytes a stream moves and cuts it where a
broken-read or broken-write fault says; ``presented_token`` is the routing
token a client retrying a redirected stream presents.
"""

from __future__ import annotations

from typing import Any

import grpc

from .faults import Faults
from .rpc import Code, Environment, RpcError


class StreamMeter:
    """Data bytes a stream has moved, and the broken-* fault that may cut it."""

    def __init__(self, faults: Faults, kind: str, method: str, object_name: str) -> None:
        self._faults = faults
        self._kind = kind
        self._method = method
        self._object = object_name
        self.moved = 0

    def allowance(self, length: int) -> tuple[int, bool]:
        """How many of the next ``length`` bytes to move, and whether to break after them."""
        cut = self._faults.claim_break(self._kind, self._method, self._object, self.moved, length)
        return (length, False) if cut is None else (cut, True)

    def add(self, count: int) -> None:
        self.moved += count

    def broken(self) -> RpcError:
        return RpcError(Code.UNAVAILABLE, f"injected fault {self._kind}: stream broken after "
                                          f"{self.moved} bytes")


def presented_token(env: Environment, context: grpc.aio.ServicerContext, spec: Any) -> str | None:
    """The routing token of the call's request params, else the one in the spec."""
    token = env.routing_params(context).get("routing_token")
    if token is None and spec.HasField("routing_token"):
        token = spec.routing_token
    return token
