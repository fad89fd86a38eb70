"""The layers keep to their imports: the core and the storage seam know
nothing of gRPC, scan-ahead nothing of the core, and each side of the data
plane loads only its own event loop."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rapidmount"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_by(path: Path) -> set[str]:
    """Every module a source file imports, at any depth of its code, as absolute names."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _sources(*packages: str) -> list[Path]:
    return sorted(path for package in packages for path in (PACKAGE / package).rglob("*.py"))


def loaded_by(*modules: str) -> set[str]:
    """Every module a fresh interpreter holds once it imported ``modules``."""
    probe = f"import importlib, sys\nfor name in {list(modules)!r}: importlib.import_module(name)\nprint(*sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=PACKAGE.parent)
    return set(done.stdout.split())


def _reaches(names: set[str], forbidden: str) -> list[str]:
    return sorted(name for name in names if name == forbidden or name.startswith(forbidden + "."))


@pytest.mark.parametrize("path", _sources("core", "storage"), ids=lambda path: _module_name(path))
def test_the_core_and_the_storage_seam_import_no_grpc(path):
    names = imported_by(path)
    assert not _reaches(names, "grpc") and not _reaches(names, "google.protobuf"), _module_name(path)
    for layer in ("rapidmount.client", "rapidmount.dataplane", "rapidmount.wire", "rapidmount._proto"):
        assert not _reaches(names, layer), f"{_module_name(path)} imports {layer}"


def test_loading_the_core_and_the_seam_loads_no_grpc():
    """Transitively too. (The in-memory store behind the seam for tests,
    MemoryStore, is the emulator's in-process backend and lives there.)"""
    loaded = loaded_by(*(_module_name(path) for path in _sources("core", "storage")))
    assert "rapidmount.core.filesystem" in loaded
    assert not _reaches(loaded, "grpc") and not _reaches(loaded, "google.protobuf")


#: Each module of the data plane runs on one side, with that side's event loop.
FUSE_SIDE = ["dataplane/pool.py", "dataplane/store.py", "dataplane/token_pusher.py", "scanahead/files.py"]
WORKER_SIDE = ["dataplane/worker.py", "dataplane/worker_tokens.py", "dataplane/pagestore.py", "dataplane/descriptors.py",
               "scanahead/batches.py",
               *(str(path.relative_to(PACKAGE)) for path in _sources("client"))]


@pytest.mark.parametrize("module", FUSE_SIDE)
def test_the_fuse_process_side_imports_no_asyncio(module):
    assert not _reaches(imported_by(PACKAGE / module), "asyncio")


@pytest.mark.parametrize("module", WORKER_SIDE)
def test_the_worker_side_imports_no_trio(module):
    assert not _reaches(imported_by(PACKAGE / module), "trio")


def test_a_worker_process_loads_no_trio():
    loaded = loaded_by("rapidmount.dataplane.worker")
    assert "rapidmount.scanahead.batches" in loaded and not _reaches(loaded, "trio")


@pytest.mark.parametrize("path", _sources("scanahead"), ids=lambda path: _module_name(path))
def test_scan_ahead_does_not_import_the_core(path):
    assert not _reaches(imported_by(path), "rapidmount.core")


def test_loading_scan_ahead_loads_no_core():
    loaded = loaded_by("rapidmount.scanahead.files", "rapidmount.scanahead.batches")
    assert not _reaches(loaded, "rapidmount.core")
