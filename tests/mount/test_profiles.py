"""--profile on real mounts: from the command line, a config file and fstab (-o), each doing what it says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rapidmount.daemon import serve as daemon
from rapidmount.emulator import Emulator
from tests.mountutil import is_mounted, mounted, payload, require_fuse, stop_and_wait_unmounted


def _wait_for_line(mount, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in mount.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{mount.log()[-3000:]}"
        time.sleep(0.05)
    return mount.log()


def test_training_from_the_command_line_lists_the_tree_at_mount_and_trusts_it():
    with Emulator(buckets={"prof-train": "zonal"}) as emu:
        emu.seed_many("prof-train", {f"shards/{index:03d}.tar": payload(4096, seed=index) for index in range(40)})
        with mounted(emu.endpoint, "prof-train", "--profile", "aiml-training") as mount:
            log = _wait_for_line(mount, "metadata prefetch of")
            assert "profile aiml-training: " in log and "metadata-ttl=-1" in log and "prefetch-metadata=True" in log
            _wait_for_line(mount, "done in")
            emu.reset_rpc_counts()
            names = sorted(os.listdir(mount.path / "shards"))
            assert len(names) == 40
            for name in names:
                os.stat(mount.path / "shards" / name)
            calls = {method: count for method, count in emu.rpc_counts.items() if count}
            # The tree was listed at mount: no listing, and no stat of its own (anything else that
            # looks up other names in the mount meanwhile costs a GetObject or two, never 40).
            assert calls.get("ListObjects", 0) == 0 and calls.get("GetObject", 0) < 40, calls
            # Trusted for good: a shard replaced behind the mount's back keeps the size the mount saw.
            emu.seed("prof-train", "shards/000.tar", b"x")
            assert os.stat(mount.path / "shards" / "000.tar").st_size == 4096


def test_serving_from_a_config_file_sets_kernel_read_ahead_and_reads_exactly(tmp_path):
    with Emulator(buckets={"prof-serve": "zonal"}) as emu:
        model = payload(40 << 20, seed=3)
        emu.seed("prof-serve", "model.safetensors", model)
        config = tmp_path / "serving.toml"
        config.write_text('profile = "aiml-serving"\n')
        with mounted(emu.endpoint, "prof-serve", "--config-file", str(config)) as mount:
            log = _wait_for_line(mount, "profile aiml-serving: ")
            assert "read-streams=8" in log and "readahead-max=134217728" in log
            bdi = daemon._bdi_of(str(mount.path))
            deadline = time.monotonic() + 30
            while int(open(f"/sys/class/bdi/{bdi}/read_ahead_kb").read()) != 4096:
                assert time.monotonic() < deadline, "read_ahead_kb never became 4096"
                time.sleep(0.05)
            with open(mount.path / "model.safetensors", "rb") as f:
                assert f.read() == model


def test_checkpointing_from_fstab_options_renames_a_checkpoint_directory_on_a_flat_bucket(tmp_path):
    require_fuse()
    with Emulator(buckets={"prof-ckpt": "flat"}) as emu:
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        helper = os.path.join(os.path.dirname(sys.executable), "mount.rapidmount")
        options = (f"rw,_netdev,anonymous,endpoint={emu.endpoint},profile=aiml-checkpointing,negative_ttl=0,"
                   f"log_file={tmp_path / 'log'}")
        result = subprocess.run([helper, "prof-ckpt", str(mnt), "-o", options], capture_output=True, text=True,
                                timeout=60)
        try:
            assert result.returncode == 0, result.stderr
            assert is_mounted(str(mnt))
            (mnt / "step-1.tmp").mkdir()
            shards = {f"shard-{index}.pt": payload(1 << 20, seed=index) for index in range(3)}
            for name, data in shards.items():
                with open(mnt / "step-1.tmp" / name, "wb") as f:
                    f.write(data)
                    os.fsync(f.fileno())
            os.rename(mnt / "step-1.tmp", mnt / "step-1")  # refused (ENOTSUP) without the profile
            assert sorted(os.listdir(mnt / "step-1")) == sorted(shards)
            assert all(emu.read_object("prof-ckpt", f"step-1/{name}") == data for name, data in shards.items())
            log = (tmp_path / "log").read_text()
            assert "profile aiml-checkpointing: " in log and "rename-dir-limit=200000" in log
        finally:
            stop_and_wait_unmounted(str(mnt), f"mount.rapidmount prof-ckpt {mnt}")
