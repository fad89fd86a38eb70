"""Datasets the ML tests load through the mount in DataLoader worker processes.

They live in a module of their own so that ``spawn`` workers can import them.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class FileSamples(Dataset):
    """Map-style: one file per sample, in listing order, as raw bytes."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.names = sorted(os.listdir(root))

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int):
        with open(os.path.join(self.root, self.names[index]), "rb") as sample:
            data = sample.read()
        return self.names[index], torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ShardedLines(IterableDataset):
    """Iterable: JSON-lines shards split between workers, one record per line."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.shards = sorted(os.listdir(root))

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for shard in self.shards[worker::workers]:
            with open(os.path.join(self.root, shard), encoding="utf-8") as lines:
                for line in lines:
                    yield line.rstrip("\n")
