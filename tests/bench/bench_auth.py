"""Benchmark: what TLS and per-call access tokens cost through the mount.

One emulator process, the same objects, three mounts in one run:

- ``plaintext``: ``--anonymous``, no TLS (how every other benchmark runs);
- ``tls``: ``--anonymous --ca-file``: TLS, no tokens;
- ``tls+token``: ``--key-file --ca-file`` against ``--require-token``: TLS
  and an access token on every call (gRPC runs the token plugin on a thread
  of its own for each call).

Scenarios: sequential read of one object (``dd bs=1M``, MB/s, page cache
dropped), and ``stat`` + read of many small uncached files (each is a few
unary calls and one read stream, so per-call costs show), in files/s.
Ratios are against plaintext, from the same run.

Then the cost of the token on one unary call (``GetStorageLayout`` against
the TLS emulator, grpc.aio, one after another and 64 at a time, batches
interleaved): no token, the token as plain request metadata, and the token
through rapidmount's call credentials (``TokenPlugin``).

    .venv/bin/python tests/bench/bench_auth.py [--size-mib 512] [--files 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.authutil import LocalAuthServer, make_service_account_key, make_tls_pair  # noqa: E402
from tests.bench.common import (  # noqa: E402
    MiB, emulator_process, median, mount_process, print_table, save_results, timed_dd_read)

BUCKET = "bench-bucket"
BIG = "seq/big.bin"
SMALL_DIR = "small/"
TOKEN = "bench-access-token"


def seed(data_dir: str, size: int, files: int) -> None:
    from rapidmount.emulator import Emulator

    with Emulator(buckets={BUCKET: "zonal"}, data_dir=data_dir) as emulator:
        emulator.seed(BUCKET, BIG, os.urandom(size))
        emulator.seed_many(BUCKET, {f"{SMALL_DIR}f-{i:05d}": os.urandom(4096) for i in range(files)})


def sequential(mount, size: int) -> float:
    return timed_dd_read(mount, BIG, size)[0]


def small_files(mount, files: int) -> float:
    started = time.perf_counter()
    for i in range(files):
        path = mount.path / SMALL_DIR / f"f-{i:05d}"
        os.stat(path)
        with open(path, "rb") as f:
            assert len(f.read()) == 4096
    return files / (time.perf_counter() - started)


def unary_costs(endpoint: str, cert: bytes, source, batches: int = 15) -> dict[str, dict[str, float]]:
    """Microseconds per call, median of batches: {mode: {"serial": us, "concurrent": us}}."""
    import asyncio

    import grpc

    from rapidmount.shared import wire
    from rapidmount.shared import auth

    method = wire.CONTROL_METHODS["GetStorageLayout"]
    request = wire.control.GetStorageLayoutRequest(name=f"projects/_/buckets/{BUCKET}/storageLayout")
    header = source.header()

    async def run() -> dict[str, dict[str, float]]:
        tls = grpc.ssl_channel_credentials(cert)
        channels = {
            "no token (server check off)": (grpc.aio.secure_channel(endpoint, tls), ()),
            "token as request metadata": (grpc.aio.secure_channel(endpoint, tls), (("authorization", header),)),
            "token via call credentials": (grpc.aio.secure_channel(endpoint, grpc.composite_channel_credentials(
                tls, auth.call_credentials(source))), ()),
            "gRPC's static-token call credentials": (grpc.aio.secure_channel(
                endpoint, grpc.composite_channel_credentials(
                    tls, grpc.access_token_call_credentials(header.split(" ", 1)[1]))), ()),
        }
        calls = {mode: channel.unary_unary(method.path, request_serializer=method.request.SerializeToString,
                                           response_deserializer=method.response.FromString)
                 for mode, (channel, _) in channels.items()}
        samples: dict[str, dict[str, list[float]]] = {mode: {"serial": [], "concurrent": []} for mode in channels}
        for mode, call in calls.items():
            for _ in range(20):
                await call(request, metadata=channels[mode][1])
        for _ in range(batches):
            for mode, call in calls.items():
                metadata = channels[mode][1]
                started = time.perf_counter()
                for _ in range(50):
                    await call(request, metadata=metadata)
                samples[mode]["serial"].append((time.perf_counter() - started) / 50 * 1e6)
                started = time.perf_counter()
                await asyncio.gather(*(call(request, metadata=metadata) for _ in range(64)))
                samples[mode]["concurrent"].append((time.perf_counter() - started) / 64 * 1e6)
        for channel, _ in channels.values():
            await channel.close()
        return {mode: {kind: median(values) for kind, values in kinds.items()} for mode, kinds in samples.items()}

    return asyncio.run(run())


def mount_scenarios(args, work: str, ca_file: str, results: dict) -> None:
    size = args.size_mib * MiB
    seed(os.path.join(work, "data"), size, args.files)
    with LocalAuthServer(fixed_token=TOKEN) as token_server:
        service_account = make_service_account_key(token_server.token_uri)
        token_server.trust_key(service_account)
        key_file = service_account.write(os.path.join(work, "sa.json"))
        tls = ["--tls-cert", ca_file, "--tls-key", os.path.join(work, "key.pem")]
        # mode: (emulator flags, mount flags, anonymous mount)
        emulators = {
            "plaintext": ([], [], True),
            "tls": (tls, ["--ca-file", ca_file], True),
            "tls+token": ([*tls, "--require-token", TOKEN], ["--key-file", key_file, "--ca-file", ca_file], False),
        }
        for mode, (server_flags, mount_flags, anonymous) in emulators.items():
            figures = results.setdefault(mode, {"sequential": [], "small": []})
            with emulator_process(*server_flags, data_dir=os.path.join(work, "data")) as (endpoint, _):
                for _ in range(args.rounds):
                    # --metadata-ttl 0: every stat and open asks the bucket.
                    with mount_process(endpoint, BUCKET, *mount_flags, "--metadata-ttl", "0",
                                       anonymous=anonymous) as mount:
                        figures["sequential"].append(sequential(mount, size))
                        figures["small"].append(small_files(mount, args.files))
    rows = []
    for scenario, unit in (("sequential", "MB/s"), ("small", "files/s")):
        base = median(results["plaintext"][scenario])
        for mode in emulators:
            value = median(results[mode][scenario])
            rows.append([f"{scenario} ({unit})", mode, f"{value:.0f}", f"{min(results[mode][scenario]):.0f}",
                         f"{max(results[mode][scenario]):.0f}", f"{value / base:.2f}"])
    print_table(f"TLS and tokens, {args.size_mib} MiB sequential, {args.files} small files, {args.rounds} rounds",
                ["scenario", "mount", "median", "min", "max", "vs plaintext"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=512)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--unary-only", action="store_true", help="only the per-call token costs")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="rapidmount-bench-auth-")
    cert, key = make_tls_pair()
    for name, pem in (("cert.pem", cert), ("key.pem", key)):
        with open(os.path.join(work, name), "wb") as f:
            f.write(pem)
    ca_file = os.path.join(work, "cert.pem")
    results: dict[str, dict] = {}
    if not args.unary_only:
        mount_scenarios(args, work, ca_file, results)
    with LocalAuthServer(fixed_token=TOKEN) as token_server:
        from rapidmount.shared import auth

        service_account = make_service_account_key(token_server.token_uri)
        token_server.trust_key(service_account)
        source = auth.TokenSource(auth.load_credentials(service_account.write(os.path.join(work, "sa2.json"))))
        with emulator_process("--tls-cert", ca_file, "--tls-key", os.path.join(work, "key.pem"), "--bucket",
                              BUCKET) as (endpoint, _):
            costs = unary_costs(endpoint, cert, source)
    base = costs["no token (server check off)"]
    print_table("One unary call over TLS, microseconds (median of 15 batches)",
                ["token", "one at a time", "64 at a time", "vs no token"],
                [[mode, f"{c['serial']:.0f}", f"{c['concurrent']:.0f}",
                  f"{c['serial'] / base['serial']:.2f} / {c['concurrent'] / base['concurrent']:.2f}"]
                 for mode, c in costs.items()])
    results["unary_us"] = costs
    print(f"\nresults: {save_results('auth', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
