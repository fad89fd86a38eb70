"""`allow_other` keeps the bucket's files to those the modes allow.

Real mounts, made by root, used by a second uid: the kernel checks modes,
owner and group (FUSE's ``default_permissions``) whenever other users can
reach the mount, unless ``--no-permission-checks`` turns that off.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

import pytest

from rapidmount.emulator import Emulator
from tests.mountutil import errno_name, mounted

BUCKET = "perm-bucket"
NOBODY = 65534  # uid and gid (nogroup)
STRANGER = 65533  # another uid, in another group


@pytest.fixture(autouse=True)
def _needs_root():
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("these tests switch to other uids: they need root under CI")
        pytest.skip("needs root to act as another user")


@pytest.fixture
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        emulator.seed(BUCKET, "data.txt", b"secret\n")
        emulator.seed(BUCKET, "dir/inner.txt", b"inner\n")
        yield emulator


@pytest.fixture
def open_dir():
    """A mountpoint whose parents other users may traverse (pytest's tmp_path is 0700)."""
    parent = pathlib.Path(tempfile.mkdtemp(prefix="rapidmount-perm-"))
    os.chmod(parent, 0o755)
    (parent / "mnt").mkdir()
    yield parent / "mnt"
    shutil.rmtree(parent, ignore_errors=True)


def as_user(uid: int, gid: int, script: str, *args: object) -> int | None:
    """Run a shell ``script`` (arguments in ``$1``...) as this uid and gid, with
    no supplementary groups: None if it succeeded, else the errno its error
    message names. setpriv switches users after the exec: a plain fork of this
    multithreaded process (gRPC's fork handlers) can crash the child."""
    command = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
               "/bin/sh", "-c", script, "sh", *map(str, args)]
    result = subprocess.run(command, cwd="/", stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=60)
    if result.returncode == 0:
        return None
    for code in (errno.EACCES, errno.EPERM, errno.ENOENT, errno.EIO, errno.EROFS, errno.ESTALE):
        if os.strerror(code) in result.stderr:
            return code
    raise AssertionError(f"{script!r} failed ({result.returncode}) without a known errno: {result.stderr.strip()!r}")


READ = 'cat "$1" >/dev/null'
APPEND = 'printf "appended\\n" >>"$1"'
CREATE = 'set -C; printf "new\\n" >"$1"'  # noclobber: O_CREAT | O_EXCL
OPEN_TRUNC = ': >"$1"'
TRUNCATE = 'truncate -s 0 "$1"'
MKDIR = 'mkdir "$1"'
UNLINK = 'unlink "$1"'
RENAME = 'mv -T "$1" "$2"'
RMDIR = 'rmdir "$1"'
CHMOD = 'chmod "$2" "$1"'
LIST = 'ls "$1" >/dev/null'
STAT = 'stat "$1" >/dev/null'


def expect(got: int | None, want: int | None, what: str) -> None:
    assert got == want, f"{what}: expected {errno_name(want)}, got {errno_name(got)}"


def mount_options(m) -> str:
    """The mount's options as /proc/self/mountinfo shows them (both fields)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            fields = line.split()
            if fields[4] == str(m.path):
                return " ".join(fields[5:])
    raise AssertionError(f"{m.path} is not mounted")


def test_allow_other_refuses_what_the_modes_forbid(emu, open_dir):
    """Root's mount, default modes (0644 files, 0755 directories): another user
    reads, and is refused every change, with EACCES (chmod: EPERM)."""
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", mountpoint=open_dir) as m:
        assert "default_permissions" in mount_options(m)
        data = m.path / "data.txt"
        assert as_user(NOBODY, NOBODY, READ, data) is None
        expect(as_user(NOBODY, NOBODY, APPEND, data), errno.EACCES, "append to a 0644 file of root")
        expect(as_user(NOBODY, NOBODY, TRUNCATE, data), errno.EACCES, "truncate")
        expect(as_user(NOBODY, NOBODY, OPEN_TRUNC, data), errno.EACCES,
               "open(O_TRUNC)")
        expect(as_user(NOBODY, NOBODY, CREATE, m.path / "new.txt"), errno.EACCES, "create in a 0755 directory")
        expect(as_user(NOBODY, NOBODY, MKDIR, m.path / "newdir"), errno.EACCES, "mkdir")
        expect(as_user(NOBODY, NOBODY, UNLINK, data), errno.EACCES, "unlink")
        expect(as_user(NOBODY, NOBODY, RENAME, data, m.path / "moved.txt"), errno.EACCES, "rename")
        expect(as_user(NOBODY, NOBODY, RMDIR, m.path / "dir"), errno.EACCES, "rmdir")
        expect(as_user(NOBODY, NOBODY, CHMOD, data, "666"), errno.EPERM, "chmod of root's file")
        # Root, the mounting user, is not held back.
        with open(data, "ab") as f:
            f.write(b"root\n")
    assert emu.store.read_all(BUCKET, "data.txt") == b"secret\nroot\n"
    names = {o.name for o in emu.store.list_objects(BUCKET).objects}
    assert names == {"data.txt", "dir/inner.txt"}


def test_allow_other_refuses_reads_the_mode_forbids(emu, open_dir):
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--file-mode", "0640", "--dir-mode", "0711",
                 mountpoint=open_dir) as m:
        expect(as_user(NOBODY, NOBODY, READ, m.path / "data.txt"), errno.EACCES, "read of a 0640 file")
        expect(as_user(NOBODY, NOBODY, LIST, m.path), errno.EACCES, "list a 0711 directory")
        assert as_user(NOBODY, NOBODY, STAT, m.path / "dir") is None  # search (x) is allowed
        # The group that the mode lets read: root's group.
        assert as_user(NOBODY, 0, READ, m.path / "data.txt") is None


def test_uid_grants_the_owner_everything(emu, open_dir):
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--uid", str(NOBODY), mountpoint=open_dir) as m:
        info = os.stat(m.path / "data.txt")
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (NOBODY, 0o644)
        assert as_user(NOBODY, NOBODY, APPEND, m.path / "data.txt") is None
        assert as_user(NOBODY, NOBODY, CREATE, m.path / "mine.txt") is None
        assert as_user(NOBODY, NOBODY, UNLINK, m.path / "dir/inner.txt") is None
        # Any other user still only reads.
        assert as_user(STRANGER, STRANGER, READ, m.path / "data.txt") is None
        expect(as_user(STRANGER, STRANGER, APPEND, m.path / "data.txt"), errno.EACCES, "a stranger appends")
    assert emu.store.read_all(BUCKET, "data.txt") == b"secret\nappended\n"
    assert emu.store.read_all(BUCKET, "mine.txt") == b"new\n"


def test_gid_and_modes_share_with_a_group(emu, open_dir):
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--gid", str(NOBODY), "--file-mode", "0660",
                 "--dir-mode", "0770", mountpoint=open_dir) as m:
        assert as_user(STRANGER, NOBODY, APPEND, m.path / "data.txt") is None  # in the group
        assert as_user(STRANGER, NOBODY, CREATE, m.path / "dir/shared.txt") is None
        expect(as_user(STRANGER, STRANGER, READ, m.path / "data.txt"), errno.EACCES, "read outside the group")
        expect(as_user(STRANGER, STRANGER, CREATE, m.path / "x.txt"), errno.EACCES, "create outside the group")
    assert emu.store.read_all(BUCKET, "data.txt") == b"secret\nappended\n"
    assert emu.store.read_all(BUCKET, "dir/shared.txt") == b"new\n"


def test_preserved_modes_are_enforced(emu, open_dir):
    """chmod by the owner, stored with --preserve-mode, is what the kernel checks."""
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--preserve-mode", mountpoint=open_dir) as m:
        data = m.path / "data.txt"
        os.chmod(data, 0o666)
        assert stat.S_IMODE(os.stat(data).st_mode) == 0o666
        assert as_user(NOBODY, NOBODY, APPEND, data) is None
        os.chmod(data, 0o600)
        expect(as_user(NOBODY, NOBODY, READ, data), errno.EACCES, "read after chmod 0600")
    assert emu.store.read_all(BUCKET, "data.txt") == b"secret\nappended\n"
    # The mode stays with the object: a fresh mount enforces it too.
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--preserve-mode", mountpoint=open_dir) as m:
        assert stat.S_IMODE(os.stat(m.path / "data.txt").st_mode) == 0o600
        expect(as_user(NOBODY, NOBODY, READ, m.path / "data.txt"), errno.EACCES, "read on a fresh mount")


def test_no_permission_checks_opens_the_mount_as_before(emu, open_dir):
    """The documented, unsafe opt-out: other users change root's 0644 files."""
    with mounted(emu.endpoint, BUCKET, "-o", "allow_other", "--no-permission-checks", mountpoint=open_dir) as m:
        assert "default_permissions" not in mount_options(m)
        assert as_user(NOBODY, NOBODY, APPEND, m.path / "data.txt") is None
        assert as_user(NOBODY, NOBODY, CREATE, m.path / "theirs.txt") is None
        assert "--no-permission-checks" in m.log()  # the warning at mount time
    assert emu.store.read_all(BUCKET, "data.txt") == b"secret\nappended\n"


def test_without_allow_other_nothing_changes(emu, open_dir):
    """Only the mounting user reaches the mount; the kernel checks no modes for it."""
    with mounted(emu.endpoint, BUCKET, mountpoint=open_dir) as m:
        options = mount_options(m)
        assert "default_permissions" not in options and "allow_other" not in options
        expect(as_user(NOBODY, NOBODY, STAT, m.path / "data.txt"), errno.EACCES, "another user")
        with open(m.path / "data.txt", "rb") as f:
            assert f.read() == b"secret\n"


# -- which FUSE options each combination asks for, and the one-line errors ---------------------------

def _options(*argv: str) -> set[str]:
    from rapidmount.daemon import cli, config, serve as daemon

    parsed = config.config_from_args(cli.build_parser().parse_args([*argv, "my-bucket", "/mnt"]))
    options = daemon._mount_options(parsed)
    chosen = {name for name, wanted in (("allow_other", options.allow_other),
                                        ("default_permissions", options.default_permissions)) if wanted}
    # The reference loop's options for libfuse say the same.
    assert daemon._pyfuse3_options(options) & {"allow_other", "default_permissions"} == chosen
    return chosen


@pytest.mark.parametrize("argv, expected", [
    ((), set()),
    (("-o", "allow_other"), {"allow_other", "default_permissions"}),
    (("-o", "allow_other,default_permissions"), {"allow_other", "default_permissions"}),
    (("-o", "default_permissions"), {"default_permissions"}),
    (("-o", "allow_other", "--no-permission-checks"), {"allow_other"}),
    (("-o", "allow_other,no_permission_checks"), {"allow_other"}),
    (("--no-permission-checks",), set()),  # nobody else reaches the mount: nothing to turn off
])
def test_fuse_options_of_each_combination(argv, expected):
    assert _options(*argv) == expected


@pytest.mark.parametrize("args, fragment", [
    (["-o", "allow_other,default_permissions", "--no-permission-checks"], "contradict"),
    (["--file-mode", "rw-r--r--"], "--file-mode: not an octal mode"),
    (["--dir-mode", "0o8"], "--dir-mode: not an octal mode"),
    (["-o", "file_mode=0x1ff"], "--file-mode: not an octal mode"),
    (["--file-mode", "17777"], "--file-mode: mode out of range"),
])
def test_bad_permission_options_are_one_line_errors(args, fragment, tmp_path):
    import sys

    result = subprocess.run([sys.executable, "-m", "rapidmount.daemon.cli", "--anonymous", "--endpoint", "127.0.0.1:1",
                             *args, "bucket", str(tmp_path)], capture_output=True, text=True, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
