"""The TOML config file and the mount(8) helper for /etc/fstab."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from rapidmount.daemon import cli, config as config_module, mount_helper
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
    result = subprocess.run([sys.executable, "-m", "rapidmount.daemon.cli", "--config-file", str(config),
                             "bucket-name", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], result.stderr


# Two valid values and one bad value per kind of flag (by metavar); a new
# kind of flag must add its samples here, so every flag is covered.
_SAMPLES = {
    "HOST:PORT": ("localhost:1234", "10.0.0.1:443", "nohost"),
    "DIR": ("/var/tmp/a", "/var/tmp/b", None),
    "PATH": ("/var/log/a.log", "/var/log/b.log", None),
    "PREFIX": ("data/a", "data/b", None),
    "MODE": ("0700", "0640", "999"),
    "BYTES": ("8MiB", "16MiB", "lots"),
    "KB": ("512", "2048", "-1"),
    "N": ("3", "7", "-1"),
    "SECONDS": ("7", "9", "soon"),
    "LEVEL": ("debug", "warning", "loud"),
    "FORMAT": ("json", "text", "xml"),
    "PORT": ("9100", "9200", "70000"),
    "ADDRESS": ("0.0.0.0", "::1", "localhost"),
    "PROJECT": ("my-project", "other-project-2", "Bad Project!"),
    "TYPE": ("zonal", "regional", "tape"),
    "NAME": ("aiml-training", "aiml-serving", "aiml-everything"),  # --profile
    None: ("1234", "4321", "-5"),  # --uid, --gid
}
# --anonymous needs an explicit --endpoint.
_ENDPOINT_LINE = 'endpoint = "localhost:1"\n'


# Flags whose valid values exclude the samples of their metavar.
_FLAG_SAMPLES = {"--worker-memory-limit": ("64MiB", "128MiB", "lots"),
                 "--worker-allocator": ("glibc", "auto", "tcmalloc")}


def _samples(flag):
    if flag.name in _FLAG_SAMPLES:
        return _FLAG_SAMPLES[flag.name]
    assert flag.metavar in _SAMPLES, f"no config-file test samples for {flag.name} ({flag.metavar})"
    return _SAMPLES[flag.metavar]


def _toml(key: str, value) -> str:
    if isinstance(value, bool):
        return f"{key} = {'true' if value else 'false'}\n"
    return f'{key} = "{value}"\n'


def _config(tmp_path, text: str, *args: str):
    path = tmp_path / "rapidmount.toml"
    path.write_text(text if text.startswith("endpoint") else _ENDPOINT_LINE + text)
    parsed = cli.build_parser().parse_args(["--config-file", str(path), *args, "bucket-name", "/mnt"])
    return config_module.config_from_args(parsed)


@pytest.mark.parametrize("flag", config_module.FLAGS, ids=lambda flag: flag.name)
def test_every_flag_is_a_config_file_key_and_the_command_line_wins(flag, tmp_path):
    key = flag.name[2:]
    if flag.is_switch:
        for spelling in (key, flag.dest):
            assert _config(tmp_path, _toml(spelling, True)).values[flag.dest] is True
        assert _config(tmp_path, _toml(key, False)).values[flag.dest] is False
        assert _config(tmp_path, _toml(key, False), flag.name).values[flag.dest] is True
        assert _config(tmp_path, _toml(key, True), "-o", f"{key}=false").values[flag.dest] is False
        return
    in_file, on_command_line, _ = _samples(flag)
    expected_file = flag.parse(in_file) if callable(flag.parse) else in_file
    expected_flag = flag.parse(on_command_line) if callable(flag.parse) else on_command_line
    assert expected_file != expected_flag
    for spelling in (key, flag.dest):
        assert getattr(_config(tmp_path, _toml(spelling, in_file)), flag.dest) == expected_file
    assert getattr(_config(tmp_path, _toml(key, in_file), flag.name, on_command_line), flag.dest) == expected_flag
    assert getattr(_config(tmp_path, _toml(key, in_file), "-o", f"{key}={on_command_line}"),
                   flag.dest) == expected_flag


@pytest.mark.parametrize("flag", [flag for flag in config_module.FLAGS
                                  if flag.is_switch or _samples(flag)[2] is not None],  # not any-string flags
                         ids=lambda flag: flag.name)
def test_every_config_file_key_rejects_a_bad_value_by_name(flag, tmp_path):
    key = flag.name[2:]
    bad = 3 if flag.is_switch else _samples(flag)[2]
    path = tmp_path / "bad.toml"
    path.write_text(f"{key} = {bad}\n" if flag.is_switch else _toml(key, bad))
    with pytest.raises(config_module.ConfigError, match=f"key '{key}'"):
        config_module.load_config_file(str(path))


def test_a_key_given_with_dash_and_underscore_is_an_error(tmp_path):
    path = tmp_path / "twice.toml"
    path.write_text('cache-size = "1GiB"\ncache_size = "2GiB"\n')
    with pytest.raises(config_module.ConfigError, match="given twice"):
        config_module.load_config_file(str(path))


def test_compose_prefetch_is_refused_on_a_read_only_mount(tmp_path):
    with pytest.raises(config_module.ConfigError, match="not with -o ro"):
        config_module.validate(_config(tmp_path, _toml("compose-prefetch", True), "-o", "ro"))
