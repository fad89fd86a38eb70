"""--profile: what each profile chooses, sized to the machine, and that anything given wins over it."""

from __future__ import annotations

import argparse

import pytest

from rapidmount.daemon.config import (
    ConfigError, GivenSettings, MountConfig, add_flags, apply_profile, config_from_args, effective_toml)
from rapidmount.daemon.profiles import GiB, MiB, PROFILES, Machine, cgroup_cpu_limit, cgroup_memory_limit, settings

SMALL, NODE, A3 = Machine(2, 8 * GiB), Machine(16, 64 * GiB), Machine(208, 1872 * GiB)


def parse(*argv: str) -> MountConfig:
    parser = argparse.ArgumentParser()
    parser.add_argument("bucket")
    parser.add_argument("mountpoint")
    parser.add_argument("-o", dest="options", action="append")
    parser.add_argument("--config-file")
    add_flags(parser)
    return config_from_args(parser.parse_args([*argv, "a-bucket", "/mnt/x"]))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_chooses_only_real_settings(profile):
    from rapidmount.daemon.config import FLAG_BY_DEST

    for machine in (SMALL, NODE, A3):
        chosen = settings(profile, machine)
        assert chosen and set(chosen) <= set(FLAG_BY_DEST)


def test_sizes_follow_the_memory_within_bounds():
    assert settings("aiml-training", SMALL)["cache_size"] == 512 * MiB
    assert settings("aiml-training", NODE)["cache_size"] == 4 * GiB
    assert settings("aiml-training", Machine(2, 2 * GiB))["cache_size"] == 256 * MiB  # a small container
    assert settings("aiml-serving", A3)["cache_size"] == 8 * GiB
    assert settings("aiml-checkpointing", SMALL)["write_buffer"] == 128 * MiB
    assert settings("aiml-checkpointing", Machine(2, 1 * GiB))["write_buffer"] == 64 * MiB


def test_an_unknown_profile_is_refused():
    with pytest.raises(ValueError, match="unknown profile 'aiml-foo'"):
        settings("aiml-foo", SMALL)
    with pytest.raises(ConfigError, match="--profile: unknown profile"):
        parse("--profile", "aiml-foo")


def test_the_profile_fills_what_nobody_gave_and_says_so():
    config = parse("--profile", "aiml-training")
    assert config.metadata_ttl == -1 and config.prefetch_metadata and config.prefetch_files == 64
    assert config.source_of("metadata_ttl") == "profile aiml-training"
    assert "metadata-ttl = -1.0  # profile aiml-training" in effective_toml(config)
    assert "profile = \"aiml-training\"  # flag" in effective_toml(config)


def test_a_flag_an_option_and_a_config_file_each_win_over_the_profile(tmp_path):
    toml = tmp_path / "mount.toml"
    toml.write_text('profile = "aiml-serving"\nread-streams = 2\n')
    config = parse("--config-file", str(toml), "--metadata-ttl", "30", "-o", "kernel_read_ahead_kb=512")
    assert config.profile == "aiml-serving" and config.source_of("profile") == f"config file {toml}"
    assert (config.read_streams, config.source_of("read_streams")) == (2, f"config file {toml}")
    assert (config.metadata_ttl, config.source_of("metadata_ttl")) == (30, "flag")
    assert (config.kernel_read_ahead_kb, config.source_of("kernel_read_ahead_kb")) == (512, "-o")
    assert config.source_of("readahead_max") == "profile aiml-serving"


def test_the_profile_from_a_mount_option_as_fstab_gives_it():
    config = parse("-o", "ro,profile=aiml-checkpointing")
    assert config.read_only and config.rename_dir_limit == 200_000
    assert config.source_of("profile") == "-o"


def test_a_smaller_readahead_max_given_caps_the_profiles_first_window():
    config = parse("--profile", "aiml-serving", "--readahead-max", "16M")
    assert config.readahead_initial == 16 * MiB  # not the profile's 32 MiB, which would be refused


def test_no_profile_changes_nothing():
    given = GivenSettings()
    apply_profile(given, SMALL)
    assert given.values == {} and given.sources == {}
    assert given.build("a-bucket", "/mnt/x").sources == {}


def test_cgroup_limits_v2_v1_and_none(tmp_path):
    (tmp_path / "self").write_text("0::/kubepods/pod1/ctr\n")
    limit = tmp_path / "root" / "kubepods" / "pod1" / "ctr" / "memory.max"
    limit.parent.mkdir(parents=True)
    limit.write_text("2147483648\n")
    assert cgroup_memory_limit(str(tmp_path / "root"), str(tmp_path / "self")) == 2 * GiB
    limit.write_text("max\n")
    assert cgroup_memory_limit(str(tmp_path / "root"), str(tmp_path / "self")) is None
    (tmp_path / "self").write_text("4:memory:/docker/abc\n3:cpu:/docker/abc\n")
    v1 = tmp_path / "root" / "memory" / "docker" / "abc" / "memory.limit_in_bytes"
    v1.parent.mkdir(parents=True)
    v1.write_text("1073741824\n")
    assert cgroup_memory_limit(str(tmp_path / "root"), str(tmp_path / "self")) == 1 * GiB
    v1.write_text(str(1 << 62))
    assert cgroup_memory_limit(str(tmp_path / "root"), str(tmp_path / "self")) is None
    assert cgroup_memory_limit(str(tmp_path / "nowhere"), str(tmp_path / "missing")) is None


def test_cgroup_cpu_quota(tmp_path):
    (tmp_path / "self").write_text("0::/pod/ctr\n")
    quota = tmp_path / "root" / "pod" / "ctr" / "cpu.max"
    quota.parent.mkdir(parents=True)
    quota.write_text("250000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path / "root"), str(tmp_path / "self")) == 3  # 2.5 CPUs, rounded up
    quota.write_text("max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path / "root"), str(tmp_path / "self")) is None
    assert settings("aiml-training", Machine(3, 8 * GiB))["workers"] == 2
