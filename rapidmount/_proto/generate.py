"""Regenerate the protobuf modules in this folder from ``protos/``.

``make protos`` runs this; ``tests/unit/test_protos.py`` runs :func:`generate` into a
scratch folder and fails when the committed modules differ (stale code).
Needs ``grpcio-tools`` (a development dependency).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent.parent
PROTO_ROOT = REPO_ROOT / "protos"
# Sources live under protos/rapidmount/ so their descriptor names
# ("rapidmount/storage_v2.proto") cannot clash with anyone else's in the pool.
PROTO_FILES = ("rapidmount/storage_v2.proto", "rapidmount/storage_control_v2.proto")


def _include_dirs() -> list[str]:
    import grpc_tools

    dirs = [str(PROTO_ROOT), str(pathlib.Path(grpc_tools.__file__).parent / "_proto")]
    # google/rpc/status.proto and google/longrunning/operations.proto ship with
    # googleapis-common-protos; import them from there, never generate copies.
    for entry in sys.path:
        if (pathlib.Path(entry) / "google" / "rpc" / "status.proto").is_file():
            dirs.append(entry)
            return dirs
    raise RuntimeError("googleapis-common-protos .proto sources not found on sys.path")


def _longrunning_include(scratch: pathlib.Path) -> str:
    """googleapis-common-protos ships google/longrunning/operations.proto as
    ``operations_proto.proto``; expose it under its registered name."""
    import google.longrunning

    source = pathlib.Path(list(google.longrunning.__path__)[0]) / "operations_proto.proto"
    target = scratch / "google" / "longrunning" / "operations.proto"
    target.parent.mkdir(parents=True)
    shutil.copyfile(source, target)
    return str(scratch)


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Generate ``*_pb2.py`` and ``*_pb2.pyi`` for every proto into ``out_dir``."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory() as extra:
        includes = [*_include_dirs(), _longrunning_include(pathlib.Path(extra))]
        args = ["protoc", *(f"-I{d}" for d in includes),
                f"--python_out={scratch}", f"--pyi_out={scratch}", *PROTO_FILES]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed: " + " ".join(args))
        produced = sorted((pathlib.Path(scratch) / "rapidmount").glob("*_pb2.py*"))
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for path in produced:
            target = out_dir / path.name
            shutil.copyfile(path, target)
            written.append(target)
        return written


def main() -> int:
    for path in generate(PACKAGE_DIR):
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
