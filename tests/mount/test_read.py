"""Reads through a real FUSE mount, against the emulator over real gRPC."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import threading

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import (
    is_mounted, mounted, payload, rapidmount_command, require_fuse, stop_and_wait_unmounted, unmount)

MiB = 1 << 20
BUCKET = "read-bucket"
SIZES = {"empty": 0, "one": 1, "chunk-minus-1": 2 * MiB - 1, "chunk": 2 * MiB,
         "chunk-plus-1": 2 * MiB + 1, "hundred-mib": 100 * MiB}


@pytest.fixture(scope="module")
def dataset():
    return {name: payload(size, index) for index, (name, size) in enumerate(SIZES.items())}


@pytest.fixture(scope="module")
def emu(dataset, request_loop):
    with Emulator(buckets={BUCKET: "zonal", "flat-read": "flat"}) as emulator:
        for name, data in dataset.items():
            emulator.seed(BUCKET, f"sizes/{name}", data)
        emulator.seed(BUCKET, "nested/a/b/c/deep.txt", b"deep\n")
        emulator.seed(BUCKET, "implicit/only/child.txt", b"child\n")
        emulator.seed(BUCKET, "placeholder/", b"")
        emulator.seed(BUCKET, "both", b"i am a file shadowed by a directory\n")
        emulator.seed(BUCKET, "both/inside.txt", b"inside\n")
        for odd in ("odd//double-slash", "odd/./dot", "odd/../escape", "odd/ok name with spaces",
                    "odd/ünïcödé", "odd/" + "x" * 256):
            emulator.seed(BUCKET, odd, b"odd\n")
        emulator.seed_many(BUCKET, {f"big-dir/obj-{i:05d}": b"%d\n" % i for i in range(10_000)})
        emulator.seed("flat-read", "flat/file.bin", payload(3 * MiB + 17, 99))
        yield emulator


@pytest.fixture(scope="module")
def mount(emu):
    with mounted(emu.endpoint, BUCKET, "--retry-deadline", "20") as m:
        yield m


@pytest.mark.parametrize("name", list(SIZES))
def test_whole_file_is_byte_exact(mount, dataset, name):
    path = mount.path / "sizes" / name
    assert os.stat(path).st_size == SIZES[name]
    with open(path, "rb") as f:
        assert f.read() == dataset[name]


@pytest.mark.parametrize("name", ["chunk-plus-1", "hundred-mib"])
def test_random_pread_is_byte_exact(mount, dataset, name):
    data = dataset[name]
    rng = random.Random(7)
    fd = os.open(mount.path / "sizes" / name, os.O_RDONLY)
    try:
        for _ in range(300):
            offset = rng.randrange(0, len(data))
            length = rng.choice([1, 4096, 65536, MiB, 3 * MiB])
            assert os.pread(fd, length, offset) == data[offset:offset + length]
        assert os.pread(fd, 10, len(data)) == b""
    finally:
        os.close(fd)


def test_cmp_against_source(mount, dataset, tmp_path):
    source = tmp_path / "source"
    source.write_bytes(dataset["hundred-mib"])
    result = subprocess.run(["cmp", str(source), str(mount.path / "sizes" / "hundred-mib")])
    assert result.returncode == 0


def test_o_direct_reads_are_exact(mount, dataset):
    fd = os.open(mount.path / "sizes" / "chunk-plus-1", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.pread(fd, 4 * MiB, 0) == dataset["chunk-plus-1"]
    finally:
        os.close(fd)


def test_nested_and_implicit_directories(mount):
    assert (mount.path / "nested/a/b/c/deep.txt").read_bytes() == b"deep\n"
    assert (mount.path / "implicit").is_dir()
    assert (mount.path / "implicit/only").is_dir()
    assert os.listdir(mount.path / "implicit/only") == ["child.txt"]
    assert (mount.path / "placeholder").is_dir()
    assert os.listdir(mount.path / "placeholder") == []
    assert set(os.listdir(mount.path)) >= {"sizes", "nested", "implicit", "placeholder", "both", "odd"}


def test_directory_wins_over_file_of_same_name(mount):
    assert (mount.path / "both").is_dir()
    assert os.listdir(mount.path / "both") == ["inside.txt"]
    assert os.listdir(mount.path).count("both") == 1


def test_odd_names_are_hidden_and_never_escape(mount):
    names = set(os.listdir(mount.path / "odd"))
    assert "ok name with spaces" in names and "ünïcödé" in names
    assert "x" * 256 not in names and "escape" not in names and "dot" not in names
    assert (mount.path / "odd/ok name with spaces").read_bytes() == b"odd\n"
    with pytest.raises(OSError) as info:
        os.stat(mount.path / "odd" / ("x" * 256))
    assert info.value.errno == errno.ENAMETOOLONG
    # "odd//double-slash" has an empty segment: hidden, and "odd" lists no ""-named dir.
    assert "" not in names and "double-slash" not in names


def test_missing_file_is_enoent(mount):
    with pytest.raises(FileNotFoundError):
        open(mount.path / "nope.txt", "rb")


def test_big_directory_listing_and_warm_ls_makes_no_rpc(mount, emu):
    big = mount.path / "big-dir"
    names = os.listdir(big)
    assert len(names) == 10_000 and names == sorted(names)
    subprocess.run(["ls", "-l", str(big)], check=True, stdout=subprocess.DEVNULL)
    emu.reset_rpc_counts()
    subprocess.run(["ls", "-l", str(big)], check=True, stdout=subprocess.DEVNULL)
    assert sum(emu.rpc_counts.values()) == 0, emu.rpc_counts


def test_concurrent_random_readers(mount, dataset):
    """16 threads read one file at random while 4 others read other files."""
    errors: list[str] = []
    big = dataset["hundred-mib"]

    def random_reader(seed: int) -> None:
        rng = random.Random(seed)
        with open(mount.path / "sizes" / "hundred-mib", "rb", buffering=0) as f:
            for _ in range(60):
                offset = rng.randrange(0, len(big) - 1)
                length = rng.choice([4096, 65536, MiB])
                if os.pread(f.fileno(), length, offset) != big[offset:offset + length]:
                    errors.append(f"random mismatch at {offset}+{length}")

    def sequential_reader(name: str) -> None:
        with open(mount.path / "sizes" / name, "rb") as f:
            if f.read() != dataset[name]:
                errors.append(f"sequential mismatch in {name}")

    threads = [threading.Thread(target=random_reader, args=(s,)) for s in range(16)]
    threads += [threading.Thread(target=sequential_reader, args=(n,))
                for n in ("chunk", "chunk-plus-1", "chunk-minus-1", "one")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a reader hung"
    assert errors == []


def test_non_zonal_bucket_reads_through_readobject(emu):
    data = payload(3 * MiB + 17, 99)
    with mounted(emu.endpoint, "flat-read") as m:
        assert (m.path / "flat/file.bin").read_bytes() == data
        fd = os.open(m.path / "flat/file.bin", os.O_RDONLY)
        try:
            assert os.pread(fd, 100, MiB + 5) == data[MiB + 5:MiB + 105]
        finally:
            os.close(fd)
        assert "zonal" not in m.log().split("mounted gs://", 1)[1].split("\n", 1)[0]


def test_clean_unmount_with_open_files(emu):
    with mounted(emu.endpoint, BUCKET) as m:
        f = open(m.path / "sizes" / "chunk", "rb")
        f.read(100)
        m.process.terminate()
        assert m.process.wait(timeout=30) == 0
        # The mount is detached at once; the open file just loses its backing.
        assert not is_mounted(str(m.path))
        try:
            f.close()
        except OSError as err:
            assert err.errno == errno.ENOTCONN


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(rapidmount_command(*args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _assert_one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_error_bucket_missing(emu, tmp_path):
    result = _run_cli("--anonymous", "--endpoint", emu.endpoint, "no-such-bucket", str(tmp_path))
    _assert_one_line_error(result, "does not exist")


def test_error_endpoint_unreachable(tmp_path):
    result = _run_cli("--anonymous", "--endpoint", "127.0.0.1:9", "--connect-timeout", "2", "some-bucket",
                      str(tmp_path))
    _assert_one_line_error(result, "cannot reach")


def test_error_mountpoint_missing_or_not_dir(emu, tmp_path):
    _assert_one_line_error(_run_cli("--anonymous", "--endpoint", emu.endpoint, BUCKET,
                                    str(tmp_path / "missing")), "does not exist")
    file_path = tmp_path / "file"
    file_path.write_text("x")
    _assert_one_line_error(_run_cli("--anonymous", "--endpoint", emu.endpoint, BUCKET, str(file_path)),
                           "not a directory")


def test_error_already_mounted(mount, emu):
    result = _run_cli("--anonymous", "--endpoint", emu.endpoint, BUCKET, str(mount.path))
    _assert_one_line_error(result, "already mounted")


def test_error_fuse_device_not_permitted(emu, tmp_path):
    """As an unprivileged user /dev/fuse (0600 root) cannot be opened.

    The CLI runs in a forked child that drops to nobody: the Python under
    /root is not readable by other users, so it cannot be started anew.
    """
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("needs root under CI, to switch to an unprivileged user")
        pytest.skip("needs root to switch to an unprivileged user")
    if os.stat("/dev/fuse").st_mode & 0o006:
        pytest.skip("/dev/fuse is world-accessible on this machine")
    from rapidmount.daemon import cli

    import tempfile

    mnt = tempfile.mkdtemp(prefix="rapidmount-nobody-")  # /tmp/pytest-of-root is 0700
    os.chmod(mnt, 0o755)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        # A fork of a process running gRPC threads can deadlock on a lock one
        # of them held: end the child, never hang the suite.
        import signal
        signal.alarm(60)
        try:
            import sys

            sys.stderr = os.fdopen(write_fd, "w")
            os.setgid(65534)
            os.setuid(65534)
            code = cli.main(["--anonymous", "--endpoint", emu.endpoint, "--foreground", BUCKET, mnt])
            sys.stderr.flush()
        except BaseException:
            code = 99
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as stderr:
        message = stderr.read()
    _, status = os.waitpid(pid, 0)
    os.rmdir(mnt)
    result = subprocess.CompletedProcess([], os.waitstatus_to_exitcode(status), "", message)
    _assert_one_line_error(result, "no permission to open /dev/fuse")


@pytest.mark.parametrize("args, fragment", [
    (["--cache-size", "lots"], "--cache-size"),
    (["--metadata-ttl", "-5"], "--metadata-ttl"),
    (["--file-mode", "999"], "--file-mode"),
    (["--endpoint", "nohostport"], "--endpoint"),
    (["-o", "bogus_option"], "bogus_option"),
    (["--no-such-flag"], "no-such-flag"),
])
def test_error_invalid_flag_value(args, fragment, tmp_path):
    endpoint = [] if "--endpoint" in args else ["--endpoint", "127.0.0.1:1"]
    result = _run_cli("--anonymous", *endpoint, *args, "bucket", str(tmp_path))
    assert result.returncode == 2
    _assert_one_line_error(result, fragment)


def test_daemon_mode_returns_once_live_and_unmounts_on_sigterm(emu, tmp_path):
    require_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = _run_cli("--anonymous", "--endpoint", emu.endpoint, "--log-file", str(tmp_path / "log"),
                      BUCKET, str(mnt))
    try:
        assert result.returncode == 0, result.stderr
        assert is_mounted(str(mnt))
        assert (mnt / "nested/a/b/c/deep.txt").read_bytes() == b"deep\n"
        assert stop_and_wait_unmounted(str(mnt), f"rapidmount.daemon.cli.*{mnt}"), "SIGTERM did not unmount"
    finally:
        unmount(str(mnt))


def test_embedded_emulator_default_and_demo_data(tmp_path):
    """`rapidmount --emulator` starts its own emulator, creates the bucket and mounts it."""
    from rapidmount.daemon import demo
    require_fuse()
    data_dir = tmp_path / "emu"
    data_dir.mkdir()
    demo.seed(data_dir, "demo-bucket")  # what `make run` does first
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    result = _run_cli("--emulator", "--emulator-dir", str(data_dir), "--log-file", str(tmp_path / "log"),
                      "demo-bucket", str(mnt))
    try:
        assert result.returncode == 0, result.stderr
        assert (mnt / "README.txt").read_bytes().startswith(b"Hello from a Rapid bucket")
        assert len(os.listdir(mnt / "datasets" / "images")) == 100
        assert (mnt / "datasets/metrics.csv").read_text().splitlines()[0] == "step,loss,accuracy"
    finally:
        stop_and_wait_unmounted(str(mnt), f"rapidmount.daemon.cli --emulator --emulator-dir {data_dir}")
    # A bucket that does not exist yet is created in an empty emulator.
    fresh = tmp_path / "mnt2"
    fresh.mkdir()
    result = _run_cli("--emulator", "--log-file", str(tmp_path / "log2"), "brand-new-bucket", str(fresh))
    try:
        assert result.returncode == 0, result.stderr
        assert os.listdir(fresh) == []
    finally:
        stop_and_wait_unmounted(str(fresh), f"rapidmount.daemon.cli --emulator --log-file {tmp_path / 'log2'}")
