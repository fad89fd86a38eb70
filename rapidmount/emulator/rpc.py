"""Plumbing shared by every emulated RPC: errors, routing, faults, latency.

Each RPC implementation is an ``async def impl(request, context)`` that
raises ``RpcError`` (or a store error) to fail; ``method_handler`` turns it
into a grpc.aio handler that counts the call and converts failures into a
status with rich details (``grpc-status-details-bin``). Nothing a client
sends produces a traceback: only bugs in the emulator are logged at ERROR.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
from typing import Any, Awaitable, Callable, Iterator, Sequence

import grpc
from google.protobuf.message import DecodeError

from rapidmount.shared import wire

from .access import AccessControl
from .faults import Faults
from .store import StoreError, Store

logger = logging.getLogger("rapidmount.emulator")

Code = grpc.StatusCode


class RpcError(Exception):
    """Fail the current RPC with ``code``, ``message`` and status details."""

    def __init__(self, code: grpc.StatusCode, message: str, details: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = list(details)

    @classmethod
    def from_store(cls, error: StoreError) -> "RpcError":
        return cls(grpc.StatusCode[error.code], str(error))


def invalid(message: str) -> RpcError:
    return RpcError(Code.INVALID_ARGUMENT, message)


def _undecodable(error: DecodeError) -> RpcError:
    # The service answers a request it cannot parse (a string field that is
    # not UTF-8, such as an object name) as an invalid argument.
    return invalid(f"malformed request: {error}")


def _as_rpc_error(exc: BaseException) -> RpcError | None:
    if isinstance(exc, RpcError):
        return exc
    if isinstance(exc, StoreError):
        return RpcError.from_store(exc)
    if isinstance(exc, DecodeError):  # a message of a request stream
        return _undecodable(exc)
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _as_rpc_error(inner)
            if found is not None:
                return found
    return None


class RpcCounters:
    """Calls per RPC name, and the calls still running (streams open); read from other threads."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        self._running: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def bump(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    @contextlib.contextmanager
    def running(self, name: str) -> Iterator[None]:
        with self._lock:
            self._counts[name] += 1
            self._running[name] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[name] -= 1

    def running_now(self) -> dict[str, int]:
        with self._lock:
            return {name: count for name, count in self._running.items() if count}

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


class Environment:
    """What every RPC implementation needs: the store, faults, latency, routing."""

    def __init__(self, store: Store, faults: Faults, counters: RpcCounters,
                 access: AccessControl | None = None) -> None:
        self.store = store
        self.faults = faults
        self.counters = counters
        self.access = access or AccessControl()

    def authorize(self, context: grpc.aio.ServicerContext) -> None:
        """Refuse the call now if its bearer token does not pass the check."""
        problem = self.access.token_problem(context.invocation_metadata())
        if problem is not None:
            raise RpcError(Code.UNAUTHENTICATED, problem)

    def check_stream(self, context: grpc.aio.ServicerContext) -> None:
        """End an open stream whose token was revoked since it opened."""
        if not self.access.revocations:
            return  # the usual case: one check per message
        problem = self.access.stream_problem(context.invocation_metadata())
        if problem is not None:
            raise RpcError(Code.UNAUTHENTICATED, problem)

    @staticmethod
    def routing_params(context: grpc.aio.ServicerContext) -> dict[str, str]:
        params: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            if key == "x-goog-request-params":
                params.update(_routing_params(value))
        return params

    def resolve_bucket(self, resource: str, context: grpc.aio.ServicerContext,
                       field: str = "bucket") -> str:
        """The bucket name in ``resource`` (``projects/_/buckets/NAME``), which
        must exist and agree with the routing header when there is one."""
        if not resource:
            raise invalid(f"{field} is required (projects/_/buckets/BUCKET)")
        bucket = wire.bucket_from_resource(resource)
        if bucket is None:
            raise invalid(f"{field} {resource!r} is not of the form projects/_/buckets/BUCKET")
        routed = self.routing_params(context).get("bucket")
        if routed is not None:
            routed_bucket = wire.bucket_from_resource(routed)
            if routed_bucket is None:
                raise invalid(f"x-goog-request-params bucket {routed!r} is not of the form "
                              "projects/_/buckets/BUCKET")
            self.store.get_bucket(routed_bucket)  # the call is routed there: NotFound first
            if routed_bucket != bucket:
                raise invalid(f"x-goog-request-params names bucket {routed_bucket!r} but the request "
                              f"names {bucket!r}")
        self.store.get_bucket(bucket)  # NotFound for an unknown bucket
        problem = self.access.billing_problem(bucket, context.invocation_metadata())
        if problem is not None:
            raise invalid(problem)
        return bucket

    def resolve_object(self, context: grpc.aio.ServicerContext, method: str, bucket_resource: str,
                       object_name: str, where: str = "", name_field: str = "object") -> str:
        """The bucket of a call on one object: checks the bucket (as
        ``resolve_bucket``) and that the object is named, then admits the call.
        ``where`` prefixes field names in errors (e.g. ``read_object_spec.``)."""
        bucket = self.resolve_bucket(bucket_resource, context, f"{where}bucket")
        if not object_name:
            raise invalid(f"{where}{name_field} is required")
        self.admit(method, object_name)
        return bucket

    def admit(self, method: str, object_name: str | None = None) -> None:
        """Fail the call now if an outage/unavailable fault says so."""
        message = self.faults.claim_call_failure(method, object_name)
        if message is not None:
            raise RpcError(Code.UNAVAILABLE, message)

    async def round_trip(self) -> None:
        """The modelled network round trip (``--latency``), before a reply."""
        delay = self.faults.latency_s
        if delay > 0:
            await asyncio.sleep(delay)


@functools.lru_cache(maxsize=4096)
def _routing_params(value: str | bytes) -> dict[str, str]:
    """One ``x-goog-request-params`` value parsed (clients repeat the same few
    values, so each is parsed once). Callers must not change the result."""
    return wire.parse_routing_params([("x-goog-request-params", value)])


Impl = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


async def abort(context: grpc.aio.ServicerContext, error: RpcError) -> None:
    trailer = wire.status_details_trailer(error.code.value[0], error.message, error.details)
    await context.abort(error.code, error.message, trailing_metadata=trailer)


class _Undecodable:
    """A unary request that failed to parse: failing in the deserializer would
    answer UNKNOWN, so the handler fails it as the service does."""

    __slots__ = ("error",)

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _lenient(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError as error:
            return _Undecodable(error)

    return deserialize


def method_handler(method: wire.Method, impl: Impl, env: Environment) -> grpc.RpcMethodHandler:
    async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with env.counters.running(method.name):
            try:
                if type(request) is _Undecodable:
                    raise _undecodable(request.error)
                env.authorize(context)
                return await impl(request, context)
            except asyncio.CancelledError:
                raise  # the client went away; grpc finishes the call
            except Exception as exc:  # converted to a status below
                error = _as_rpc_error(exc)
                if error is None:
                    logger.exception("emulator bug in %s", method.name)
                    error = RpcError(Code.INTERNAL, f"internal emulator error in {method.name}: {exc!r}")
            logger.info("%s failed: %s %s", method.name, error.code.name, error.message)
            await abort(context, error)

    make = {
        "unary_unary": grpc.unary_unary_rpc_method_handler,
        "unary_stream": grpc.unary_stream_rpc_method_handler,
        "stream_unary": grpc.stream_unary_rpc_method_handler,
        "stream_stream": grpc.stream_stream_rpc_method_handler,
    }[method.kind]
    # A message of a request stream that fails to parse raises DecodeError
    # where the implementation reads it, which fails the call as above.
    unary = method.kind.startswith("unary_")
    return make(behaviour, request_deserializer=_lenient(method.request.FromString) if unary
                else method.request.FromString, response_serializer=_serialize)


def _serialize(message: Any) -> bytes:
    # Hot paths hand over responses they encoded themselves (see chunks.py).
    return message if type(message) is bytes else message.SerializeToString()


def generic_handler(service: str, methods: dict[str, wire.Method], impls: dict[str, Impl],
                    env: Environment) -> grpc.GenericRpcHandler:
    missing = set(methods) - set(impls)
    if missing:
        raise RuntimeError(f"{service}: no implementation for {sorted(missing)}")
    return grpc.method_handlers_generic_handler(
        service, {name: method_handler(methods[name], impls[name], env) for name in methods})


async def first_message(requests: Any) -> Any | None:
    """The first request of a stream, or None if the client sent none."""
    return await anext(requests, None)
