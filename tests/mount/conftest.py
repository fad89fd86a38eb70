"""Every test in this folder mounts a real FUSE file system over real gRPC.

The namespace, read, write and errno tests run twice: under the mount's own
FUSE request loop and under pyfuse3's (``--pyfuse3-requests``), the
reference, so that each loop checks the other.
"""

import pathlib

import pytest

from tests import mountutil

#: Modules whose every test runs under both request loops.
BOTH_LOOPS = {"test_namespace.py", "test_read.py", "test_write.py", "test_errnos.py"}
LOOPS = {"own": (), "pyfuse3": ("--pyfuse3-requests",)}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/mount/" in str(item.path):
            item.add_marker(pytest.mark.mount)


def pytest_generate_tests(metafunc):
    if pathlib.Path(metafunc.definition.path).name in BOTH_LOOPS:
        metafunc.parametrize("request_loop", list(LOOPS), indirect=True, scope="module")


@pytest.fixture(scope="module", autouse=True)
def request_loop(request):
    """Which request loop the module's mounts use (``mounted()`` adds its flags).
    A module-scoped emulator of those modules takes it too, so that each loop
    starts from a fresh bucket."""
    loop = getattr(request, "param", "own")
    mountutil.LOOP_FLAGS = LOOPS[loop]
    try:
        yield loop
    finally:
        mountutil.LOOP_FLAGS = ()
