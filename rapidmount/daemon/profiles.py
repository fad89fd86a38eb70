"""Workload profiles: defaults for training, serving and checkpointing, sized to the machine.

A profile only fills settings the user left alone: any flag, ``-o`` option
or config-file key wins over it. The values (docs/ml.md says why, and what
each changed when measured):

* ``aiml-training``: the dataset does not change while it is read. Metadata
  and listings are trusted for good, the tree is listed once at mount, files
  opened in listing order are fetched ahead (scan-ahead), and the block cache
  holds a slice of the machine's memory. With ``--cache-dir``, shards up to
  4 GiB are kept on local disk for the next epoch.
* ``aiml-serving``: large model files read once by many processes, often
  through ``mmap``. Metadata trusted for good, a wide readahead window from
  the first read, eight streams per file, 4 MiB kernel read-ahead, and a
  larger page-store queue so read-ahead lands in the kernel's page cache.
  With ``--cache-dir``, model files up to 64 GiB are kept on local disk for
  the next pod on the node.
* ``aiml-checkpointing``: large sequential writes, then a rename of the
  checkpoint's directory. A larger write buffer, and directory renames on
  buckets without folders up to 200,000 objects, as gcsfuse allows.

Sizes follow the machine: the memory is the smaller of the RAM and the
cgroup's limit (``memory.max``, a GKE container's limit), and the CPUs the
smaller of those the process may run on and the cgroup's quota (``cpu.max``),
so a sidecar is not sized by the node it runs on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

PROFILES = ("aiml-training", "aiml-serving", "aiml-checkpointing")


@dataclass(frozen=True)
class Machine:
    cpus: int
    memory: int  # bytes this mount's processes may use: RAM, or the cgroup's limit if lower


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def _round_mib(value: int) -> int:
    return value // MiB * MiB


def default_workers(cpus: int) -> int:
    """Data-plane workers by default: half the CPUs (the FUSE process, the
    kernel's copies and the application need the rest), at most 16, and at
    least 2 where there are 2 CPUs: one worker's event loop receiving every
    stream of a sequential reader falls behind it, and each READ that then
    reaches the mount costs more copies (benchmarks.md, B9)."""
    return _clamp(cpus // 2, min(2, cpus), 16)


def _workers(machine: Machine) -> int:
    return default_workers(machine.cpus)


def settings(profile: str, machine: Machine) -> dict[str, object]:
    """The settings ``profile`` chooses on ``machine``, by ``MountConfig`` name."""
    if profile == "aiml-training":
        return {
            "metadata_ttl": -1.0, "listing_ttl": -1.0, "negative_ttl": 0.0,
            "prefetch_metadata": True,
            "prefetch_files": 64,
            "prefetch_streams": _clamp(2 * machine.cpus, 16, 64),
            "workers": _workers(machine),
            "cache_size": _round_mib(_clamp(machine.memory // 16, 256 * MiB, 4 * GiB)),
            "cache_dir_fill_size": 4 * GiB,  # dataset shards, with --cache-dir
            "metadata_cache_size": _round_mib(_clamp(machine.memory // 64, 64 * MiB, 1 * GiB)),
        }
    if profile == "aiml-serving":
        return {
            "metadata_ttl": -1.0, "listing_ttl": -1.0, "negative_ttl": 0.0,
            "readahead_initial": 32 * MiB, "readahead_max": 128 * MiB,
            "read_streams": 8,
            "kernel_read_ahead_kb": 4096,
            "workers": _workers(machine),
            "cache_size": _round_mib(_clamp(machine.memory // 8, 512 * MiB, 8 * GiB)),
            "cache_dir_fill_size": 64 * GiB,  # whole model shards, with --cache-dir
            "page_store_buffer": _round_mib(_clamp(machine.memory // 64, 64 * MiB, 256 * MiB)),
        }
    if profile == "aiml-checkpointing":
        return {
            "write_buffer": _round_mib(_clamp(machine.memory // 64, 64 * MiB, 256 * MiB)),
            "rename_dir_limit": 200_000,
            "workers": _workers(machine),
        }
    raise ValueError(f"unknown profile {profile!r} ({', '.join(PROFILES)})")


def parse_profile(text: str) -> str:
    if text not in PROFILES:
        raise ValueError(f"unknown profile {text!r} ({', '.join(PROFILES)})")
    return text


def affinity_cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def this_machine() -> Machine:
    cpus = affinity_cpus()
    quota = cgroup_cpu_limit()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = cgroup_memory_limit()
    return Machine(cpus if quota is None else max(1, min(cpus, quota)),
                   memory if limit is None else min(memory, limit))


def _own_cgroup_v2(root: str, self_cgroup: str) -> str | None:
    try:
        with open(self_cgroup) as lines:
            for line in lines:
                hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
                if hierarchy == "0" and controllers == "":
                    return os.path.join(root, path.lstrip("/"))
    except (OSError, ValueError):
        pass
    return None


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup") -> int | None:
    """CPUs this process's cgroup (v2 ``cpu.max``) allows, rounded up; None without a quota."""
    directory = _own_cgroup_v2(root, self_cgroup)
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, "cpu.max")) as limit:
            quota, _, period = limit.read().strip().partition(" ")
    except OSError:
        return None
    if quota == "max" or not quota.isdigit() or not period.isdigit() or not int(period):
        return None
    return -(-int(quota) // int(period))


def cgroup_memory_limit(root: str = "/sys/fs/cgroup", self_cgroup: str = "/proc/self/cgroup") -> int | None:
    """This process's cgroup memory limit in bytes (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``), or None when there is none."""
    try:
        with open(self_cgroup) as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
    except OSError:
        return None
    for hierarchy, controllers, path in entries:
        if hierarchy == "0" and controllers == "":  # cgroup v2
            candidates = [os.path.join(root, path.lstrip("/"), "memory.max"), os.path.join(root, "memory.max")]
        elif "memory" in controllers.split(","):  # cgroup v1
            candidates = [os.path.join(root, "memory", path.lstrip("/"), "memory.limit_in_bytes"),
                          os.path.join(root, "memory", "memory.limit_in_bytes")]
        else:
            continue
        for candidate in candidates:
            try:
                with open(candidate) as limit:
                    text = limit.read().strip()
            except OSError:
                continue
            if text == "max" or not text.isdigit() or int(text) >= 1 << 60:  # v1 "no limit" is a huge number
                return None
            return int(text)
    return None
