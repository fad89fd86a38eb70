"""The ``rapidmount`` command as a process: ``--print-config`` prints the
settings in force and exits without mounting; a bad value or profile is one
line on stderr and exit code 2."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

RAPIDMOUNT = (sys.executable, "-m", "rapidmount.daemon.cli")


def test_the_cli_prints_and_exits_without_mounting(tmp_path):
    result = subprocess.run([*RAPIDMOUNT, "--print-config", "--workers", "3",
                             "my-bucket", str(tmp_path / "no-such-dir")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert tomllib.loads(result.stdout)["workers"] == 3
    bad = subprocess.run([*RAPIDMOUNT, "--print-config", "--cache-size", "lots",
                          "my-bucket", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and bad.stdout == ""


def test_print_config_takes_a_profile_and_refuses_an_unknown_one_in_one_line():
    ok = subprocess.run([*RAPIDMOUNT, "--print-config", "--profile", "aiml-serving",
                         "a-bucket", "/mnt/x"], capture_output=True, text=True, check=True, timeout=60)
    assert "read-streams = 8  # profile aiml-serving" in ok.stdout
    bad = subprocess.run([*RAPIDMOUNT, "--print-config", "-o", "profile=training",
                          "a-bucket", "/mnt/x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "unknown profile 'training'" in bad.stderr


def test_help_lists_every_flag_of_the_mount_and_the_emulator():
    """``--help`` formats every flag's text (argparse reads ``%`` in it as a format), and
    hides the internal flags (configuration.md documents them)."""
    from rapidmount.daemon.config import FLAGS

    result = subprocess.run([*RAPIDMOUNT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr[-500:]
    listed = set(re.findall(r"(--[a-z0-9-]+)(?: [A-Z:]+)?(?=\s|,|$)", result.stdout.split("options:", 1)[1]))
    missing = [flag.name for flag in FLAGS if not flag.internal and flag.name not in listed]
    assert not missing, missing
    shown = [flag.name for flag in FLAGS if flag.internal and re.search(rf"^\s+{flag.name}\b", result.stdout, re.M)]
    assert not shown, shown
    emulator = subprocess.run([sys.executable, "-m", "rapidmount.emulator", "--help"], capture_output=True,
                              text=True, timeout=60)
    assert emulator.returncode == 0 and "--port" in emulator.stdout
