"""The layers keep to their imports: each module sits in the package of the
process that runs it and loads only that process's event loop, the core and
the storage seam know nothing of gRPC, scan-ahead nothing of the core, and
no import cycle exists."""

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


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """Each import of a source file, at any depth of its code: (absolute
    module, names taken from it); ``import a.b`` is (``a.b``, [])."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.extend((alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, [alias.name for alias in node.names]))
    return found


def imported_by(path: Path) -> set[str]:
    """Every module a source file imports, and every name it takes from one, as absolute names."""
    names: set[str] = set()
    for base, taken in _imports(path):
        names.add(base)
        names.update(f"{base}.{name}" for name in taken)
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
    for layer in ("rapidmount.workers.client", "rapidmount.dataplane", "rapidmount.shared.wire", "rapidmount._proto"):
        assert not _reaches(names, layer), f"{_module_name(path)} imports {layer}"


def test_loading_the_core_and_the_seam_loads_no_grpc():
    """Transitively too. (The in-memory store behind the seam for tests,
    MemoryStore, is the emulator's in-process backend and lives there.)"""
    loaded = loaded_by(*(_module_name(path) for path in _sources("core", "storage")))
    assert "rapidmount.core.filesystem" in loaded
    assert not _reaches(loaded, "grpc") and not _reaches(loaded, "google.protobuf")


def test_a_worker_process_loads_no_trio():
    loaded = loaded_by("rapidmount.workers.main")
    assert "rapidmount.workers.scan_batches" in loaded and not _reaches(loaded, "trio")


@pytest.mark.parametrize("path", _sources("scanahead"), ids=lambda path: _module_name(path))
def test_scan_ahead_does_not_import_the_core(path):
    assert not _reaches(imported_by(path), "rapidmount.core")


@pytest.mark.parametrize("path", _sources("core", "scanahead"), ids=lambda path: _module_name(path))
def test_the_core_and_scan_ahead_import_nothing_of_the_daemon_the_fuse_layer_or_the_data_plane(path):
    """The daemon builds the core's settings (``core/settings.py``) and serves it;
    the core reaches storage only through the seam."""
    names = imported_by(path)
    for layer in ("rapidmount.daemon", "rapidmount.fuse", "rapidmount.dataplane"):
        assert not _reaches(names, layer), f"{_module_name(path)} imports {layer}"


def test_loading_scan_ahead_loads_no_core():
    loaded = loaded_by("rapidmount.scanahead.files", "rapidmount.workers.scan_batches")
    assert not _reaches(loaded, "rapidmount.core")


#: Which process runs each package, and with which event loop. A module's
#: path says it: a package's modules run where the package does.
FUSE_PROCESS = ("daemon", "fuse", "core", "cache", "listing", "localcache", "readahead", "superblock",
                "scanahead", "dataplane")  # trio
WORKERS = ("workers",)  # asyncio and grpc.aio, in the worker processes
SHARED = ("shared", "storage", "_proto")  # loaded by more than one process; no event loop
EMULATOR = ("emulator",)  # the emulator's own process (and MemoryStore, in tests)
ALL = FUSE_PROCESS + WORKERS + SHARED + EMULATOR


def _package_of(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0]


def _ours(names: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(name for package in packages for name in _reaches(names, f"rapidmount.{package}"))


def test_every_module_sits_in_the_package_of_the_process_that_runs_it():
    loose = [path.name for path in PACKAGE.glob("*.py") if path.name != "__init__.py"]
    assert not loose, f"modules at the package root: {loose}"
    unknown = sorted({path.relative_to(PACKAGE).parts[0] for path in PACKAGE.iterdir()
                      if path.is_dir() and (path / "__init__.py").exists()} - set(ALL))
    assert not unknown, f"packages with no process: {unknown}"


@pytest.mark.parametrize("path", _sources(*FUSE_PROCESS), ids=_module_name)
def test_the_fuse_process_imports_no_asyncio_and_no_worker_code(path):
    names = imported_by(path)
    assert not _reaches(names, "asyncio"), _module_name(path)
    # The daemon alone may start the embedded emulator (``--emulator``), in a thread of its own.
    others = WORKERS if _package_of(path) == "daemon" else WORKERS + EMULATOR
    assert not _ours(names, others), f"{_module_name(path)} imports {_ours(names, others)}"


@pytest.mark.parametrize("path", _sources(*WORKERS), ids=_module_name)
def test_the_workers_import_no_trio_and_no_fuse_process_code(path):
    names = imported_by(path)
    assert not _reaches(names, "trio"), _module_name(path)
    assert not _ours(names, FUSE_PROCESS + EMULATOR), f"{_module_name(path)} imports {_ours(names, FUSE_PROCESS + EMULATOR)}"


@pytest.mark.parametrize("path", _sources(*SHARED), ids=_module_name)
def test_shared_modules_run_no_event_loop_and_import_no_process_code(path):
    names = imported_by(path)
    assert not _reaches(names, "trio") and not _reaches(names, "asyncio"), _module_name(path)
    others = FUSE_PROCESS + WORKERS + EMULATOR
    assert not _ours(names, others), f"{_module_name(path)} imports {_ours(names, others)}"


def _module_graph() -> dict[str, set[str]]:
    """Module to the modules it imports, at any depth of its code:
    ``from package import module`` is an edge to the module,
    ``from package import name`` one to the package."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for base, taken in _imports(path):
            if not taken:
                targets.add(base)
            targets.update(f"{base}.{each}" if f"{base}.{each}" in modules else base for each in taken)
        graph[name] = {target for target in targets if target in modules} - {name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycles():
    """Imports inside functions count too: a cycle hidden in a function is still one."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
