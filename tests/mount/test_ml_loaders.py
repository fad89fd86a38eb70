"""PyTorch through a real mount: DataLoader workers and checkpoints."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import random

import pytest

from rapidmount.emulator import Emulator
from tests.conftest import make_official_client
from tests.mountutil import HangGuard

torch = pytest.importorskip("torch") if not os.environ.get("CI") else __import__("torch")

BUCKET = "ml-data"
guard = HangGuard(240)
hang_guard = guard.autouse_fixture()


@pytest.fixture
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        yield emulator


def test_dataloader_with_four_workers_reads_every_sample_exactly(emu):
    from torch.utils.data import DataLoader

    from tests.mlsamples import FileSamples

    rng = random.Random(11)
    samples = {f"train/{i:05d}.bin": rng.randbytes(rng.randrange(1, 12_000)) for i in range(2000)}
    emu.seed_many(BUCKET, samples)
    with guard.mount(emu, BUCKET, "--metadata-ttl", "-1") as mount:
        dataset = FileSamples(str(mount.path / "train"))
        loader = DataLoader(dataset, batch_size=None, num_workers=4, multiprocessing_context="spawn",
                            shuffle=True, generator=torch.Generator().manual_seed(3))
        seen = {}
        for name, tensor in loader:
            seen[name] = hashlib.sha256(bytes(tensor.tolist())).hexdigest()
    assert len(seen) == len(samples)
    for name, digest in seen.items():
        assert digest == hashlib.sha256(samples["train/" + name]).hexdigest(), name


def test_iterable_dataset_over_sharded_json_lines(emu):
    from torch.utils.data import DataLoader

    from tests.mlsamples import ShardedLines

    shards = {f"lines/shard-{s:03d}.jsonl": "".join(f'{{"shard": {s}, "row": {r}}}\n' for r in range(300)).encode()
              for s in range(8)}
    emu.seed_many(BUCKET, shards)
    with guard.mount(emu, BUCKET) as mount:
        loader = DataLoader(ShardedLines(str(mount.path / "lines")), batch_size=None, num_workers=4,
                            multiprocessing_context="spawn")
        rows = sorted(loader)
    expected = sorted(line for blob in shards.values() for line in blob.decode().splitlines())
    assert rows == expected


def official_read(endpoint: str, name: str) -> bytes:
    async def scenario() -> bytes:
        from google.cloud.storage.asyncio.async_multi_range_downloader import AsyncMultiRangeDownloader

        mrd = await AsyncMultiRangeDownloader.create_mrd(make_official_client(endpoint), BUCKET, name)
        buffer = io.BytesIO()
        await mrd.download_ranges([(0, 0, buffer)])
        await mrd.close()
        return buffer.getvalue()

    return asyncio.run(scenario())


def test_checkpoint_saved_through_the_mount_loads_back_everywhere():
    # torch.save opens its file holding the GIL: an emulator in this process
    # would stall behind it, so this one runs in a process of its own.
    from tests.bench.common import emulator_process

    with emulator_process("--bucket", f"{BUCKET}:zonal") as (endpoint, _):
        save_and_load_checkpoint(endpoint)


def save_and_load_checkpoint(endpoint: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1}
    with guard.mount(endpoint, BUCKET) as mount:
        (mount.path / "checkpoints").mkdir()
        path = mount.path / "checkpoints" / "step-1.pt"
        torch.save(state, path)
        from_mount = torch.load(path, weights_only=True)
        with open(path, "rb") as through_mount:
            assert official_read(endpoint, "checkpoints/step-1.pt") == through_mount.read()
    stored = official_read(endpoint, "checkpoints/step-1.pt")
    from_bucket = torch.load(io.BytesIO(stored), weights_only=True)
    for loaded in (from_mount, from_bucket):
        assert loaded["step"] == 1
        for key, tensor in state["model"].items():
            assert torch.equal(loaded["model"][key], tensor), key
        assert loaded["optimizer"]["state"].keys() == state["optimizer"]["state"].keys()
