"""Every test in this folder mounts a real FUSE file system over real gRPC."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/mount/" in str(item.path):
            item.add_marker(pytest.mark.mount)
