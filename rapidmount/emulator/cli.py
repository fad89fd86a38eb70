"""``rapidmount-emulator``: serve the emulator until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sqlite3
import sys
from typing import NoReturn, Sequence

from rapidmount.shared.allocator import retain_large_buffers
from .access import AccessControl, exact_token
from .faults import FaultSpecError, Faults, __doc__ as _FAULTS_DOC
from .pacing import parse_bandwidth
from .rpc import RpcCounters
from .server import EmulatorServer
from .store import BUCKET_KINDS, Store, StoreError

_PROG = "rapidmount-emulator"


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr, exit status 2, no traceback."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _bucket_spec(text: str) -> tuple[str, str]:
    name, _, kind = text.partition(":")
    kind = kind or "zonal"
    if not name:
        raise argparse.ArgumentTypeError(f"bucket {text!r} has no name")
    if kind not in BUCKET_KINDS:
        raise argparse.ArgumentTypeError(
            f"bucket kind {kind!r} in {text!r} is not one of {', '.join(BUCKET_KINDS)}")
    return name, kind


def _latency(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if value < 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"latency must be a finite, non-negative number, not {text}")
    return value


def _bandwidth(text: str) -> int | None:
    try:
        return parse_bandwidth(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is outside 0-65535")
    return value


def build_parser() -> argparse.ArgumentParser:
    fault_help = _FAULTS_DOC.split("Grammar", 1)[1] if _FAULTS_DOC else ""
    parser = _OneLineParser(
        prog=_PROG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A local Google Cloud Storage v2 gRPC service with Rapid (zonal) bucket semantics.\n"
                    "Prints 'listening on HOST:PORT' once serving; SIGINT/SIGTERM stop it.",
        epilog="Fault grammar" + fault_help)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=0, help="port to bind; 0 picks a free one (default)")
    parser.add_argument("--data-dir", help="keep objects and metadata in this directory across restarts "
                                           "(default: in memory)")
    parser.add_argument("--bucket", dest="buckets", action="append", type=_bucket_spec, default=[],
                        metavar="NAME[:zonal|:hns|:flat]", help="create a bucket (repeatable; kind defaults to zonal)")
    parser.add_argument("--latency", type=_latency, default=0.0, metavar="MS",
                        help="modelled round-trip time added to replies, in milliseconds")
    # The default goes through _bandwidth too: args.stream_bandwidth is None.
    parser.add_argument("--stream-bandwidth", type=_bandwidth, default="off", metavar="BYTES_PER_SECOND",
                        help="cap each read stream (BidiReadObject, ReadObject) at this rate, e.g. 100MiB "
                             "(binary units; each stream gets the whole cap; writes are not capped) "
                             "(default: off)")
    parser.add_argument("--fault", dest="faults", action="append", default=[], metavar="SPEC",
                        help="inject a fault (repeatable); grammar below")
    parser.add_argument("--seed", type=int, default=0, help="seed for randomized faults (default: 0)")
    parser.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (chain), PEM; "
                                                          "needs --tls-key (default: plaintext)")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert, PEM")
    parser.add_argument("--require-token", metavar="TOKEN",
                        help="refuse calls without 'authorization: Bearer TOKEN' (UNAUTHENTICATED)")
    parser.add_argument("--requester-pays", dest="requester_pays", action="append", default=[],
                        metavar="BUCKET", help="make BUCKET refuse calls without x-goog-user-project "
                                               "(repeatable)")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error", "critical"],
                        help="server log level (default: warning)")
    return parser


def load_tls(cert_path: str, key_path: str) -> tuple[bytes, bytes]:
    """The PEM certificate chain and key, checked to belong together; ValueError says why not."""
    import ssl

    pems = []
    for flag, path in (("--tls-cert", cert_path), ("--tls-key", key_path)):
        try:
            with open(path, "rb") as f:
                pems.append(f.read())
        except OSError as exc:
            raise ValueError(f"{flag}: cannot read {path}: {exc.strerror}") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_path, key_path)
    except ssl.SSLError as exc:
        raise ValueError(f"--tls-cert/--tls-key: not a PEM certificate and its key ({exc.reason or exc})") from None
    return pems[0], pems[1]


def store_has_bucket(store: Store, name: str) -> bool:
    try:
        store.get_bucket(name)
    except StoreError:
        return False
    return True


def _bind_problem(host: str, port: int) -> str | None:
    """Why grpc could not listen on host:port, found before grpc tries (and
    logs its own error lines); None if the address is usable."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve --host {host!r}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As grpc does: connections of a stopped emulator left in TIME_WAIT
        # must not keep it from starting again on its port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None


async def _serve(store: Store, faults: Faults, host: str, port: int, tls: tuple[bytes, bytes] | None,
                 access: AccessControl) -> None:
    server = EmulatorServer(store, faults, RpcCounters(), host, port, tls=tls, access=access)
    bound = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    _install_profiler(loop)
    shown_host = f"[{host}]" if ":" in host else host
    print(f"listening on {shown_host}:{bound}", flush=True)
    try:
        await stop.wait()
    finally:
        await server.stop()


def _install_profiler(loop: asyncio.AbstractEventLoop) -> None:
    """With RAPIDMOUNT_EMULATOR_PROFILE=PATH set, SIGUSR1 starts cProfile on
    the serving thread and SIGUSR2 stops it and writes the stats to PATH
    (``pstats`` format). Used by tests/bench/bench_emulator.py --profile."""
    path = os.environ.get("RAPIDMOUNT_EMULATOR_PROFILE")
    if not path:
        return
    import cProfile

    profiler: list[cProfile.Profile] = []

    def start() -> None:
        profiler[:] = [cProfile.Profile()]
        profiler[0].enable()

    def stop() -> None:
        if profiler:
            profiler[0].disable()
            profiler.pop().dump_stats(path + ".tmp")
            os.replace(path + ".tmp", path)  # readers see whole files only

    loop.add_signal_handler(signal.SIGUSR1, start)
    loop.add_signal_handler(signal.SIGUSR2, stop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    retain_large_buffers()
    faults = Faults(seed=args.seed, latency_ms=args.latency, stream_bandwidth=args.stream_bandwidth)
    try:
        for spec in args.faults:
            faults.add(spec)
    except FaultSpecError as exc:
        parser.error(f"--fault: {exc}")
    tls = None
    if (args.tls_cert is None) != (args.tls_key is None):
        parser.error("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        try:
            tls = load_tls(args.tls_cert, args.tls_key)
        except ValueError as exc:
            parser.error(str(exc))
    if args.require_token is not None and not args.require_token.strip():
        parser.error("--require-token: the token is empty")
    access = AccessControl(exact_token(args.require_token) if args.require_token is not None else None,
                           args.requester_pays)
    problem = _bind_problem(args.host, args.port)
    if problem:
        parser.error(problem)
    try:
        store = Store(args.data_dir)
    except (OSError, ValueError, sqlite3.Error) as exc:
        parser.error(f"cannot use --data-dir {args.data_dir!r}: {exc}")
    try:
        for name, kind in args.buckets:
            store.create_bucket(name, kind)
        for name in args.requester_pays:
            if not store_has_bucket(store, name):
                parser.error(f"--requester-pays: there is no bucket {name!r} (create it with --bucket)")
        asyncio.run(_serve(store, faults, args.host, args.port, tls, access))
    except StoreError as exc:
        parser.error(f"--bucket: {exc}")
    except OSError as exc:
        parser.exit(1, f"{_PROG}: cannot serve on {args.host}:{args.port}: {exc}\n")
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
