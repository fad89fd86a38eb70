"""Tests that start processes, as the mount does, without mounting: the
data-plane worker processes against the emulator, the ``rapidmount``
command, fresh interpreters. No FUSE and no root; slower than tests/unit."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/process/" in str(item.path):
            item.add_marker(pytest.mark.process)
