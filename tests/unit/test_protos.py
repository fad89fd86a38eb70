"""The wire can never drift: generated code is fresh, and every field we
declare matches the official client's descriptors exactly."""

from __future__ import annotations

import pathlib

import pytest
from google.protobuf import descriptor as d

from rapidmount.shared import wire
from rapidmount._proto import generate

# Importing the official client in the same process as our modules is itself
# part of the test: a duplicate symbol would fail right here.
from google.cloud._storage_v2.types import storage as official_storage  # noqa: E402
from google.cloud.storage_control_v2.types import storage_control as official_control  # noqa: E402


def test_generated_code_is_fresh(tmp_path: pathlib.Path) -> None:
    fresh = {p.name: p.read_bytes() for p in generate.generate(tmp_path)}
    committed = {p.name: p.read_bytes() for p in generate.PACKAGE_DIR.glob("*_pb2.py*")}
    assert sorted(fresh) == sorted(committed), "run `make protos`"
    stale = [name for name in fresh if fresh[name] != committed[name]]
    assert not stale, f"generated code is stale, run `make protos`: {stale}"


def _official_descriptor(full_name: str) -> d.Descriptor:
    """Look a public message up in the pool the official client filled."""
    from google.protobuf import descriptor_pool

    # Touch the modules so their descriptors are registered.
    assert official_storage.Object and official_control.Folder
    return descriptor_pool.Default().FindMessageTypeByName(full_name)


def _public_name(full_name: str) -> str:
    return wire.type_url(_FakeMessage(full_name)).removeprefix("type.googleapis.com/")


class _FakeMessage:
    def __init__(self, full_name: str) -> None:
        self.DESCRIPTOR = type("D", (), {"full_name": full_name})


def _our_messages() -> list[d.Descriptor]:
    found: list[d.Descriptor] = []

    def walk(desc: d.Descriptor) -> None:
        if desc.GetOptions().map_entry:
            return
        found.append(desc)
        for nested in desc.nested_types:
            walk(nested)

    for module in (wire.storage, wire.control):
        for desc in module.DESCRIPTOR.message_types_by_name.values():
            walk(desc)
    return found


def _field_signature(field: d.FieldDescriptor) -> tuple:
    type_name = None
    if field.message_type is not None:
        type_name = _public_name(field.message_type.full_name)
    elif field.enum_type is not None:
        type_name = field.enum_type.full_name
    return (
        field.number,
        field.type,
        field.is_repeated,
        field.has_presence,
        type_name,
        field.containing_oneof.name if field.containing_oneof and not field.containing_oneof.name.startswith("_") else None,
    )


MESSAGES = _our_messages()


def test_subset_covers_the_rapid_data_path() -> None:
    names = {m.name for m in MESSAGES}
    for required in ("BidiReadObjectRequest", "BidiReadObjectResponse", "BidiWriteObjectRequest",
                     "BidiWriteObjectResponse", "ListObjectsRequest", "StorageLayout", "Folder",
                     "RenameFolderRequest", "MoveObjectRequest", "ComposeObjectRequest"):
        assert required in names


@pytest.mark.parametrize("ours", MESSAGES, ids=lambda m: m.full_name.rsplit(".v2.", 1)[-1])
def test_every_field_matches_the_official_client(ours: d.Descriptor) -> None:
    official = _official_descriptor(_public_name(ours.full_name))
    official_fields = {f.name: f for f in official.fields}
    # proto-plus renames `object` → `object_` and `type` → `type_` in Python only.
    for field in ours.fields:
        theirs = official_fields.get(field.name) or official_fields.get(field.name + "_")
        assert theirs is not None, f"{ours.full_name}.{field.name} is not upstream"
        assert _field_signature(field) == _field_signature(theirs), f"{ours.full_name}.{field.name}"


def test_method_paths_are_the_real_ones() -> None:
    assert wire.STORAGE_METHODS["BidiReadObject"].path == "/google.storage.v2.Storage/BidiReadObject"
    assert wire.CONTROL_METHODS["GetStorageLayout"].path == (
        "/google.storage.control.v2.StorageControl/GetStorageLayout")
    # Our service declarations name the same RPCs as the bound paths.
    for module, table in ((wire.storage, wire.STORAGE_METHODS), (wire.control, wire.CONTROL_METHODS)):
        (service,) = module.DESCRIPTOR.services_by_name.values()
        assert sorted(m.name for m in service.methods) == sorted(table)
        for method in service.methods:
            bound = table[method.name]
            assert bound.request.DESCRIPTOR.full_name == method.input_type.full_name
            assert bound.response.DESCRIPTOR.full_name == method.output_type.full_name
            assert bound.kind.startswith("stream" if method.client_streaming else "unary")
            assert bound.kind.endswith("stream" if method.server_streaming else "unary")


def test_error_details_use_public_type_urls() -> None:
    trailer = wire.status_details_trailer(10, "redirect", [
        wire.storage.BidiReadObjectRedirectedError(routing_token="t")])
    found = wire.unpack_details(trailer, wire.storage.BidiReadObjectRedirectedError)
    assert found[wire.storage.BidiReadObjectRedirectedError].routing_token == "t"
    from google.rpc import status_pb2

    status = status_pb2.Status.FromString(trailer[0][1])
    assert status.details[0].type_url == "type.googleapis.com/google.storage.v2.BidiReadObjectRedirectedError"


def test_routing_params_are_parsed_not_compared() -> None:
    md = (("x-goog-request-params", "bucket=projects%2F_%2Fbuckets%2Fmy+bucket&routing_token=abc"),)
    assert wire.parse_routing_params(md) == {"bucket": "projects/_/buckets/my bucket", "routing_token": "abc"}
    key, value = wire.routing_header("b", "tok")
    assert wire.parse_routing_params(((key, value),)) == {"bucket": "projects/_/buckets/b", "routing_token": "tok"}
