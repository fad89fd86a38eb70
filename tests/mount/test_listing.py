"""Fast listing through real mounts: --prefetch-metadata and listings serving stats."""

from __future__ import annotations

import os
import re
import subprocess
import time

import pytest

from rapidmount.daemon.config import ConfigError, GivenSettings, MountConfig, apply_mount_options, load_config_file
from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard
from tests.polling import until

BUCKET = "listing-bucket"
FLAT = "listing-flat"
WIDE = "listing-wide"
DIRS, SUBDIRS, FILES = 20, 10, 15  # 3000 objects, 220 directories
EMPTY_FOLDERS = 1500

_GUARD = HangGuard(240)
_hang_guard = _GUARD.autouse_fixture()


def tree_names(top: str = "") -> list[str]:
    return [f"{top}set{d:02d}/part-{s}/sample_{f:04d}.jpg"
            for d in range(DIRS) for s in range(SUBDIRS) for f in range(FILES)]


@pytest.fixture(scope="module")
def emu():
    with Emulator(buckets={BUCKET: "zonal", FLAT: "flat", WIDE: "flat"}) as emulator:
        names = tree_names()
        emulator.seed_many(BUCKET, {name: name.encode()[-7:] for name in names})
        emulator.store.create_folder(BUCKET, "empty-folder/")
        for index in range(EMPTY_FOLDERS):  # more than one ListFolders page
            emulator.store.create_folder(BUCKET, f"empties/folder-{index:04d}/", recursive=True)
        emulator.seed_many(FLAT, {name: b"x" for name in tree_names("nested/")[:600]})
        emulator.seed(FLAT, "nested/placeholder-dir/", b"")
        emulator.seed_many(WIDE, {f"wide/obj-{index:05d}": b"w" for index in range(5000)})
        yield emulator


def wait_for_log(mount, text: str, limit: float = 60.0) -> str:
    deadline = time.monotonic() + limit
    while text not in mount.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{mount.log()}"
        time.sleep(0.05)
    return mount.log()


def rpc_total(emu: Emulator) -> int:
    return sum(emu.rpc_counts.values())


def test_prefetched_tree_serves_stat_find_and_ls_without_rpcs(emu):
    # An immutable dataset: a listing's silence trusted as long as the listing.
    with _GUARD.mount(emu, BUCKET, "--prefetch-metadata", "--prefetch-metadata-workers", "6",
                      "--negative-ttl", "-1") as m:
        log = wait_for_log(m, "metadata prefetch of gs://listing-bucket/ done")
        assert "3000 objects listed" in log
        emu.reset_rpc_counts()
        # Every path component and every file: lookups and getattrs from the cache.
        names = tree_names()
        for name in names:
            assert os.stat(m.path / name).st_size == 7
        find = subprocess.run(["find", str(m.path), "-type", "f"], capture_output=True, text=True, check=True)
        assert len(find.stdout.splitlines()) == len(names)
        ls = subprocess.run(["ls", "-lR", str(m.path)], capture_output=True, text=True, check=True)
        assert ls.stdout.count("sample_") == len(names)
        assert os.listdir(m.path / "empty-folder") == []  # a folder without objects is a directory too
        assert len(os.listdir(m.path / "empties")) == EMPTY_FOLDERS
        with pytest.raises(FileNotFoundError):
            os.stat(m.path / "set00" / "no-such-file")  # answered by the prefetched listing
        assert rpc_total(emu) == 0, emu.rpc_counts
        assert (m.path / names[-1]).read_bytes() == names[-1].encode()[-7:]


def test_complete_directories_are_cached_before_the_whole_tree_is_listed(emu):
    emu.set_latency(200)
    try:
        with _GUARD.mount(emu, BUCKET, "--prefetch-metadata", "--prefetch-metadata-workers", "2",
                          "--negative-ttl", "-1") as m:
            log = wait_for_log(m, "metadata prefetch of gs://listing-bucket/ done")
            early = log.find("complete directories cached while listing")
            assert 0 <= early < log.find("metadata prefetch of gs://listing-bucket/ done"), log
            emu.set_latency(0)
            emu.reset_rpc_counts()
            find = subprocess.run(["find", str(m.path), "-type", "f"], capture_output=True, text=True, check=True)
            assert len(find.stdout.splitlines()) == DIRS * SUBDIRS * FILES
            assert rpc_total(emu) == 0, emu.rpc_counts
    finally:
        emu.set_latency(0)


def test_prefetch_of_a_flat_bucket_under_only_dir(emu):
    with _GUARD.mount(emu, FLAT, "-o", "prefetch_metadata", "--only-dir", "nested", "--negative-ttl", "-1") as m:
        wait_for_log(m, "metadata prefetch of gs://listing-flat/nested/ done")
        emu.reset_rpc_counts()
        listed = subprocess.run(["find", str(m.path)], capture_output=True, text=True, check=True).stdout
        assert len([line for line in listed.splitlines() if line.endswith(".jpg")]) == 600
        assert os.listdir(m.path / "placeholder-dir") == []
        assert sorted(os.listdir(m.path))[:2] == ["placeholder-dir", "set00"]
        assert rpc_total(emu) == 0, emu.rpc_counts


def test_one_wide_directory_is_split_by_stealing(emu):
    """The sample sees only the first 1000 names: idle workers must steal the rest."""
    emu.set_latency(20)
    try:
        with _GUARD.mount(emu, WIDE, "--prefetch-metadata", "--prefetch-metadata-workers", "4",
                          "--negative-ttl", "-1") as m:
            log = wait_for_log(m, "metadata prefetch of gs://listing-wide/ done")
            steals = re.search(r"5000 objects listed in [\d.]+ s \(\d+ objects/s; \d+ ranges, (\d+) steals", log)
            assert steals is not None and int(steals[1]) > 0, log
            emu.set_latency(0)
            emu.reset_rpc_counts()
            assert sorted(os.listdir(m.path / "wide")) == [f"obj-{index:05d}" for index in range(5000)]
            assert rpc_total(emu) == 0, emu.rpc_counts
    finally:
        emu.set_latency(0)


def test_prefetched_listing_answers_only_within_its_ttl(emu):
    # The listing's silence would be trusted for 30 s; the listing itself only for 3.
    with _GUARD.mount(emu, FLAT, "--prefetch-metadata", "--metadata-ttl", "3", "--negative-ttl", "30") as m:
        wait_for_log(m, "metadata prefetch of gs://listing-flat/ done")
        emu.seed(FLAT, "nested/set00/part-0/late.jpg", b"late")
        try:
            emu.reset_rpc_counts()
            late = m.path / "nested/set00/part-0/late.jpg"
            assert not late.exists()  # the prefetched listing says so, without asking
            assert rpc_total(emu) == 0, emu.rpc_counts
            # Well before the 30 s: the listing expired, and the bucket was asked again.
            until(late.exists, 20, "the name made after the prefetch")
            assert late.read_bytes() == b"late"
        finally:
            emu.store.delete_object(FLAT, "nested/set00/part-0/late.jpg")


def test_own_changes_during_prefetch_are_not_hidden(emu):
    """A file created while the prefetch runs stays visible once it installs."""
    emu.set_latency(30)
    try:
        with _GUARD.mount(emu, FLAT, "--prefetch-metadata", "--prefetch-metadata-workers", "1") as m:
            (m.path / "nested" / "set01" / "made-during-prefetch.txt").write_bytes(b"mine")
            wait_for_log(m, "metadata prefetch of gs://listing-flat/ done")
            assert "made-during-prefetch.txt" in os.listdir(m.path / "nested" / "set01")
            assert (m.path / "nested" / "set01" / "made-during-prefetch.txt").read_bytes() == b"mine"
    finally:
        emu.set_latency(0)
        emu.store.delete_object(FLAT, "nested/set01/made-during-prefetch.txt")


def test_prefetch_stops_when_the_tree_does_not_fit(emu):
    """Directories listed completely before the budget ran out stay cached; the rest is listed on demand."""
    with _GUARD.mount(emu, FLAT, "--prefetch-metadata", "--metadata-cache-size", "128KiB") as m:
        log = wait_for_log(m, "metadata prefetch of gs://listing-flat/ stopped")
        cached = re.search(r"--metadata-cache-size\S* .*; (\d+) directories cached", log)
        assert cached is not None and int(cached[1]) > 0, log
        served_from_cache = 0
        for d in range(4):  # the first 600 names of the tree: set00 to set03
            for s in range(SUBDIRS):
                directory = m.path / "nested" / f"set{d:02d}" / f"part-{s}"
                assert directory.is_dir()
                emu.reset_rpc_counts()
                names = os.listdir(directory)
                assert len([name for name in names if name.startswith("sample_")]) == FILES
                served_from_cache += rpc_total(emu) == 0
        assert served_from_cache > 0


def test_unmount_cancels_a_running_prefetch(emu):
    emu.set_latency(400)
    try:
        with _GUARD.mount(emu, BUCKET, "--prefetch-metadata") as m:
            wait_for_log(m, "metadata prefetch of gs://listing-bucket/ started")
        assert m.process.returncode == 0, m.log()
        assert "Traceback" not in m.log()
        assert "prefetch of gs://listing-bucket/ done" not in m.log()
    finally:
        emu.set_latency(0)


def test_readdir_serves_later_lookups_and_getattrs(emu):
    """``ls -l``: one listing, then no stat RPC per file."""
    with _GUARD.mount(emu, BUCKET) as m:
        directory = m.path / "set04" / "part-7"
        assert directory.is_dir()
        emu.reset_rpc_counts()
        names = os.listdir(directory)
        assert len(names) == FILES
        listings = emu.rpc_counts.get("ListObjects", 0)
        for name in names:
            os.lstat(directory / name)
        ls = subprocess.run(["ls", "-l", str(directory)], capture_output=True, text=True, check=True)
        assert ls.stdout.count("sample_") == FILES
        assert listings == 1 and rpc_total(emu) == listings, emu.rpc_counts


def test_prefetch_flags_from_options_and_config_file(tmp_path):
    given = GivenSettings()
    apply_mount_options(given, ["prefetch_metadata,prefetch-metadata-workers=4"])
    config = given.build("b", "/mnt")
    assert config.prefetch_metadata is True and config.prefetch_metadata_workers == 4
    path = tmp_path / "rapidmount.toml"
    path.write_text("prefetch-metadata = true\nprefetch_metadata_workers = 16\n")
    assert load_config_file(str(path)) == {"prefetch_metadata": True, "prefetch_metadata_workers": 16}
    for bad in ("0", "257", "many"):
        with pytest.raises(ConfigError, match="--prefetch-metadata-workers"):
            apply_mount_options(GivenSettings(), [f"prefetch_metadata_workers={bad}"])
    assert MountConfig("b", "/mnt").prefetch_metadata is False


def test_prefetch_retries_transient_errors(emu):
    emu.add_fault("unavailable:method=ListObjects,rate=0.3,count=12")
    try:
        with _GUARD.mount(emu, FLAT, "--prefetch-metadata", "--prefetch-metadata-workers", "4") as m:
            log = wait_for_log(m, "metadata prefetch of gs://listing-flat/ done")
            objects = len(emu.store.list_objects(FLAT, page_size=1000).objects)
            assert f" {objects} objects listed" in log  # every object once, no more
            emu.reset_rpc_counts()
            assert len(os.listdir(m.path / "nested" / "set03" / "part-9")) == FILES
            assert rpc_total(emu) == 0, (emu.rpc_counts, m.log()[-6000:])
    finally:
        emu.clear_faults()


def test_prefetch_that_keeps_failing_gives_up_and_the_mount_works(emu):
    emu.add_fault("outage:method=ListObjects")  # mounting itself lists nothing
    try:
        with _GUARD.mount(emu, FLAT, "--prefetch-metadata", "--retry-deadline", "1") as m:
            log = wait_for_log(m, "metadata prefetch of gs://listing-flat/ stopped")
            emu.clear_faults()
            assert "Traceback" not in log
            assert len(os.listdir(m.path / "nested" / "set02" / "part-1")) == FILES
    finally:
        emu.clear_faults()
