"""The TOML config file and the mount(8) helper for /etc/fstab."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from rapidmount import mount_helper
from rapidmount.emulator import Emulator
from tests.mountutil import is_mounted, mounted, require_fuse, stop_and_wait_unmounted

BUCKET = "cfg-bucket"


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        emulator.seed(BUCKET, "a.txt", b"abc")
        yield emulator


def test_translate_fstab_options():
    assert mount_helper.translate(["b", "/mnt", "-o", "rw,_netdev,allow_other,uid=1000,file_mode=0644"]) == [
        "-o", "rw,allow_other,uid=1000,file_mode=0644", "b", "/mnt"]
    assert mount_helper.translate(["-n", "b", "/mnt", "-o", "defaults,noauto,x-systemd.automount"]) == ["b", "/mnt"]
    with pytest.raises(SystemExit):
        mount_helper.translate(["only-one"])


def test_mount_helper_mounts_with_fstab_options(emu, tmp_path):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    helper = os.path.join(os.path.dirname(sys.executable), "mount.rapidmount")
    options = (f"rw,_netdev,allow_other,uid=1000,gid=1000,file_mode=0600,anonymous,endpoint={emu.endpoint},"
               f"log_file={tmp_path / 'log'}")
    result = subprocess.run([helper, BUCKET, str(mnt), "-o", options], capture_output=True, text=True, timeout=60)
    try:
        assert result.returncode == 0, result.stderr
        assert is_mounted(str(mnt))
        info = os.stat(mnt / "a.txt")
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1000, 1000, 0o600)
        assert "allow_other" in open("/proc/self/mountinfo").read().split(str(mnt), 1)[1].split("\n", 1)[0]
    finally:
        stop_and_wait_unmounted(str(mnt), f"mount.rapidmount {BUCKET} {mnt}")


def test_config_file_sets_flags_and_flags_override_it(emu, tmp_path):
    config = tmp_path / "rapidmount.toml"
    config.write_text('file-mode = "0640"\nmetadata_ttl = -1\noptions = ["ro"]\ndir-mode = "0700"\n')
    with mounted(emu.endpoint, BUCKET, "--config-file", str(config), "--dir-mode", "0750") as m:
        assert stat.S_IMODE(os.stat(m.path / "a.txt").st_mode) == 0o440  # 0640, write bits off: ro
        assert stat.S_IMODE(os.stat(m.path).st_mode) == 0o550  # the flag won over the file (0750, ro)
        with pytest.raises(OSError):
            open(m.path / "new.txt", "wb")


@pytest.mark.parametrize("text, fragment", [
    ("no_such_key = 1\n", "unknown key 'no_such_key'"),
    ('cache-size = "lots"\n', "key 'cache-size'"),
    ("foreground = 3\n", "key 'foreground' must be true or false"),
    ("this is not toml", "not valid TOML"),
])
def test_config_file_errors_name_the_key(tmp_path, text, fragment):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    result = subprocess.run([sys.executable, "-m", "rapidmount.cli", "--config-file", str(config),
                             "bucket-name", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr
