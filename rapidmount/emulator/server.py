"""Starting and stopping the emulator: on the current asyncio loop
(``EmulatorServer``, used by the CLI) or in a background thread with its own
loop (``Emulator``, for sync, asyncio and trio code alike)."""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable, Mapping

import grpc

from rapidmount.shared import wire

from .access import AccessControl, TokenValidator, exact_token
from .faults import Faults
from .rpc import Environment, RpcCounters
from .service import build_handlers
from .store import NotFound, Store

_STOP_GRACE_S = 0.5
_START_TIMEOUT_S = 30.0


class EmulatorServer:
    """The gRPC server for a store, on the running asyncio loop."""

    def __init__(self, store: Store, faults: Faults, counters: RpcCounters,
                 host: str = "127.0.0.1", port: int = 0, *, tls: tuple[bytes, bytes] | None = None,
                 access: AccessControl | None = None) -> None:
        self._env = Environment(store, faults, counters, access)
        self._tls = tls  # (certificate chain PEM, private key PEM)
        self._host = host
        self._requested_port = port
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        # grpc sets SO_REUSEPORT by default: a second emulator would then
        # silently share a busy port instead of failing.
        server = grpc.aio.server(options=[*wire.GRPC_MESSAGE_OPTIONS, ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers(build_handlers(self._env))
        address = f"[{self._host}]" if ":" in self._host else self._host
        port: int
        try:
            if self._tls is None:
                port = server.add_insecure_port(f"{address}:{self._requested_port}")
            else:
                chain, key = self._tls
                port = server.add_secure_port(f"{address}:{self._requested_port}",
                                              grpc.ssl_server_credentials([(key, chain)]))
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot listen on {self._host}:{self._requested_port}: {exc}") from None
        if port == 0:
            raise OSError(f"cannot listen on {self._host}:{self._requested_port}")
        await server.start()
        self._server, self.port = server, port
        return port

    async def stop(self, grace: float = _STOP_GRACE_S) -> None:
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
            # grpc's tasks of the calls it cancelled at the stop end a moment
            # later; a loop closed before then cancels them, and grpc prints
            # each as an unhandled error with a traceback.
            others = asyncio.all_tasks() - {asyncio.current_task()}
            if others:
                await asyncio.wait(others, timeout=_STOP_GRACE_S)


class Emulator:
    """A rapidmount emulator in a background thread; see the package docstring."""

    def __init__(self, buckets: Mapping[str, str] | None = None, data_dir: str | None = None,
                 latency_ms: float = 0.0, faults: Iterable[str] = (), seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, *,
                 tls_cert: bytes | None = None, tls_key: bytes | None = None,
                 require_token: str | None = None, token_validator: TokenValidator | None = None,
                 requester_pays: Iterable[str] = (), stream_bandwidth: float | None = None) -> None:
        """``tls_cert``/``tls_key``: PEM bytes to serve TLS instead of plaintext.
        ``require_token`` or ``token_validator(token) -> bool``: refuse calls
        without an accepted ``authorization: Bearer`` token (UNAUTHENTICATED).
        ``requester_pays``: buckets that refuse calls without x-goog-user-project.
        ``stream_bandwidth``: cap each read stream at this many bytes per
        second (``--stream-bandwidth``); None, the default, caps nothing."""
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("TLS needs both tls_cert and tls_key")
        if require_token is not None and token_validator is not None:
            raise ValueError("give require_token or token_validator, not both")
        self._tls = (tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
        self.access = AccessControl(exact_token(require_token) if require_token is not None else token_validator,
                                    requester_pays)
        self._bucket_kinds = dict(buckets or {})
        self._data_dir = data_dir
        self._host = host
        self._requested_port = port
        self.faults = Faults(seed=seed, latency_ms=latency_ms, stream_bandwidth=stream_bandwidth)
        for spec in faults:
            self.faults.add(spec)  # a bad spec fails here, in the caller's thread
        self.counters = RpcCounters()
        self.store: Store | None = None
        self.port = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested: asyncio.Event | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> "Emulator":
        if self._thread is not None:
            raise RuntimeError("the emulator is already running")
        self.store = Store(self._data_dir)
        try:
            for name, kind in self._bucket_kinds.items():
                self.store.create_bucket(name, kind)
        except BaseException:
            self.store.close()
            raise
        self._ready.clear()
        self._startup_error = None
        self._thread = threading.Thread(target=self._thread_main, name="rapidmount-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT_S):
            raise TimeoutError("the emulator did not start in time")
        if self._startup_error is not None:
            self._thread.join()
            self._thread = None
            self.store.close()
            raise self._startup_error
        return self

    def _thread_main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        assert self.store is not None
        server = EmulatorServer(self.store, self.faults, self.counters, self._host, self._requested_port,
                                tls=self._tls, access=self.access)
        try:
            self.port = await server.start()
        except BaseException as exc:  # reported to start() in the caller's thread
            self._startup_error = exc
            self._ready.set()
            return
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._ready.set()
        try:
            await self._stop_requested.wait()
        finally:
            await server.stop()

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        if self._loop is not None and self._stop_requested is not None:
            self._loop.call_soon_threadsafe(self._stop_requested.set)
        thread.join()
        self._thread = self._loop = self._stop_requested = None
        if self.store is not None:
            self.store.close()
            self.store = None

    def __enter__(self) -> "Emulator":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()

    # ------------------------------------------------------------ inspection and setup

    @property
    def endpoint(self) -> str:
        return f"{self._host}:{self.port}"

    def _running_store(self) -> Store:
        if self.store is None:
            raise RuntimeError("the emulator is not running")
        return self.store

    def create_bucket(self, name: str, kind: str = "zonal") -> None:
        self._running_store().create_bucket(name, kind)

    def has_bucket(self, name: str) -> bool:
        try:
            self._running_store().get_bucket(name)
        except NotFound:
            return False
        return True

    def seed(self, bucket: str, name: str, data: bytes, finalize: bool = True,
             metadata: Mapping[str, str] | None = None) -> int:
        """Create (or replace) an object; returns its generation."""
        return self._running_store().put_object(bucket, name, data, finalize=finalize,
                                                metadata=metadata).generation

    def seed_many(self, bucket: str, objects: Mapping[str, bytes]) -> list[int]:
        """Create many finalized objects in one transaction; returns their generations."""
        return [record.generation for record in self._running_store().put_many(bucket, objects)]

    def read_object(self, bucket: str, name: str) -> bytes:
        """The persisted bytes of the live generation."""
        return self._running_store().read_all(bucket, name)

    def object_info(self, bucket: str, name: str) -> dict[str, Any] | None:
        record = self._running_store().find_object(bucket, name)
        if record is None:
            return None
        return {"name": record.name, "generation": record.generation,
                "metageneration": record.metageneration, "size": record.size,
                "finalized": record.finalized, "crc32c": record.crc32c,
                "metadata": dict(record.metadata)}

    def set_requester_pays(self, bucket: str, enabled: bool = True) -> None:
        """Make ``bucket`` refuse calls that name no billing project."""
        self.access.set_requester_pays(bucket, enabled)

    def set_token_validator(self, validator: TokenValidator | None) -> None:
        """Replace the token check (None: accept every call)."""
        self.access.set_validator(validator)

    def revoke_token(self, token: str) -> None:
        """Refuse ``token`` from now on (UNAUTHENTICATED), before its expiry;
        the open streams that carry it end at their next message."""
        self.access.revoke(token)

    @property
    def auth_counts(self) -> dict[str, int]:
        """Calls whose token was accepted, missing, rejected or revoked; calls billed."""
        return self.access.counts()

    def set_latency(self, latency_ms: float) -> None:
        self.faults.latency_ms = latency_ms

    def set_stream_bandwidth(self, bytes_per_second: float | None) -> None:
        """Cap each read stream (BidiReadObject, ReadObject) at this many bytes
        per second, or lift the cap with None. Open streams follow from their
        next chunk; each stream gets the whole cap."""
        self.faults.stream_bandwidth = bytes_per_second

    @property
    def stream_bandwidth(self) -> float | None:
        return self.faults.stream_bandwidth

    def add_fault(self, spec: str) -> None:
        self.faults.add(spec)

    def clear_faults(self) -> None:
        self.faults.clear()

    @property
    def rpc_counts(self) -> dict[str, int]:
        return self.counters.snapshot()

    def reset_rpc_counts(self) -> None:
        self.counters.reset()

    @property
    def running_calls(self) -> dict[str, int]:
        """Calls in progress by RPC name: the streams clients hold open now."""
        return self.counters.running_now()


async def _in_worker_thread(function: Any) -> Any:
    """Run a blocking call off the event loop, under trio or asyncio."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return await trio.to_thread.run_sync(function)
    return await asyncio.to_thread(function)


@asynccontextmanager
async def emulator_running(**options: Any) -> AsyncIterator[Emulator]:
    """``async with emulator_running(buckets={...}) as emu:`` (trio or asyncio)."""
    emulator = Emulator(**options)
    await _in_worker_thread(emulator.start)
    try:
        yield emulator
    finally:
        await _in_worker_thread(emulator.stop)
