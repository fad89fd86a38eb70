"""Evaluation: ComposeObject batching for small files, as Dataflux does it.

Dataflux composes many small objects into one temporary object, reads that
with one stream, splits it, and deletes it. This measures the idea on the
emulator at a realistic round trip, against reading each object on its own,
with the same 16-way concurrency, in one run:

- **per object**: one read per object (``ReadObject`` on a regional bucket,
  a lean ``BidiReadObject`` on a zonal one);
- **composed**: batches of 32 sources: ``ComposeObject`` into a temporary
  object, one read of it, ``DeleteObject``; each part's CRC32C checked
  against its source's.

It also records what a zonal (Rapid) bucket answers to ``ComposeObject``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.bench.common import emulator_process, median, print_table, save_results  # noqa: E402

REGIONAL, ZONAL = "bench-compose-regional", "bench-compose-zonal"
BATCH = 32


def seed(data_dir: str, count: int, size: int) -> list[str]:
    from rapidmount.emulator import Emulator

    names = [f"small/obj-{i:06d}" for i in range(count)]
    with Emulator(buckets={REGIONAL: "flat", ZONAL: "zonal"}, data_dir=data_dir) as emulator:
        for start in range(0, count, 1000):
            batch = {name: os.urandom(size) for name in names[start:start + 1000]}
            emulator.seed_many(REGIONAL, batch)
            emulator.seed_many(ZONAL, batch)
    return names


async def run(endpoint: str, names: list[str], size: int, concurrency: int) -> dict:
    import grpc

    from rapidmount.shared import wire
    from rapidmount.workers.client.errors import RetryPolicy, StorageError
    from rapidmount.workers.scan_batches import read_objects_whole, read_once
    from rapidmount.shared.channel_plan import plan_channel
    from rapidmount.workers.client.channel import make_channel
    from rapidmount.workers.client.storage import StorageClient

    channel = make_channel(plan_channel(endpoint, anonymous=True, directpath=False, ca_file=False))
    regional = StorageClient(channel, REGIONAL)
    zonal = StorageClient(channel, ZONAL)
    retry = RetryPolicy(deadline=30)
    metas = {name: await regional.get_object(name) for name in names}
    figures: dict = {}

    limit = asyncio.Semaphore(concurrency)

    async def each_alone(client: StorageClient, is_zonal: bool) -> float:
        async def one(name: str) -> None:
            async with limit:
                data = await read_once(client, name, 0, 0, size, zonal=is_zonal, retry=retry)
                assert len(data) == size

        started = time.perf_counter()
        if is_zonal:
            answers = await read_objects_whole(client, [(name, 0, size) for name in names], zonal=True,
                                               concurrency=concurrency, retry=retry)
            assert all(not isinstance(a, StorageError) and len(a) == size for a in answers)
        else:
            await asyncio.gather(*(one(name) for name in names))
        return len(names) / (time.perf_counter() - started)

    async def composed(client: StorageClient) -> float:
        compose = client.rpc("ComposeObject")

        async def batch(members: list[str]) -> None:
            async with limit:
                temporary = f".rapidmount-compose/{uuid.uuid4().hex}"
                request = wire.storage.ComposeObjectRequest(
                    destination=wire.storage.Object(bucket=client.bucket_resource, name=temporary),
                    source_objects=[wire.storage.ComposeObjectRequest.SourceObject(
                        name=name, generation=metas[name].generation) for name in members])
                record = await compose(request, metadata=client.metadata())
                try:
                    data = await read_once(client, temporary, record.generation, 0, record.size, zonal=False,
                                           retry=retry)
                finally:
                    await client.delete_object(temporary)
                view = memoryview(data)
                for index, name in enumerate(members):
                    part = view[index * size:(index + 1) * size]
                    if metas[name].crc32c is not None and wire.crc32c(part) != metas[name].crc32c:
                        raise RuntimeError(f"part {name} does not match its source")

        started = time.perf_counter()
        await asyncio.gather(*(batch(names[i:i + BATCH]) for i in range(0, len(names), BATCH)))
        return len(names) / (time.perf_counter() - started)

    figures["regional per object"] = await each_alone(regional, False)
    figures["regional composed"] = await composed(regional)
    figures["zonal per object"] = await each_alone(zonal, True)
    try:
        await composed(zonal)
        figures["zonal compose"] = "accepted"
    except grpc.aio.AioRpcError as err:  # the answer is the finding
        figures["zonal compose"] = err.code().name
    await channel.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--latencies", default="0,2")
    args = parser.parse_args()
    size = args.size_kib * 1024
    rows, results = [], {}
    with tempfile.TemporaryDirectory(prefix="rapidmount-bench-compose-") as data_dir:
        names = seed(data_dir, args.files, size)
        for latency in [float(x) for x in args.latencies.split(",")]:
            runs = []
            with emulator_process("--latency", str(latency), data_dir=data_dir) as (endpoint, _):
                for _ in range(args.rounds):
                    runs.append(asyncio.run(run(endpoint, names, size, args.concurrency)))
            results[str(latency)] = runs
            alone = median([r["regional per object"] for r in runs])
            together = median([r["regional composed"] for r in runs])
            zonal = median([r["zonal per object"] for r in runs])
            rows.append([f"{latency:g} ms", f"{alone:.0f}", f"{together:.0f}", f"{together / alone:.2f}x",
                         f"{zonal:.0f}", runs[0]["zonal compose"]])
    print_table(f"ComposeObject batching, {args.files} objects of {args.size_kib} KiB, {args.concurrency} at a "
                f"time, batches of {BATCH} (objects/s, median of {args.rounds})",
                ["latency", "regional, per object", "regional, composed", "composed/per object",
                 "zonal, per object", "zonal ComposeObject"], rows)
    print(f"\nresults: {save_results('compose', results)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
