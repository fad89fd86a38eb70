"""The typed settings and the flag table are one: every flag is a field of
``Settings``, with the type its parser returns, and a mount's configuration
is a frozen value, made once from the settings given and their sources."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest

from rapidmount.daemon import config
from rapidmount.daemon.config import FLAGS, GivenSettings, MountConfig, Settings

FIELD_TYPES = typing.get_type_hints(Settings)


def _members(annotation: object) -> set[object]:
    """``int | None`` -> {int, NoneType}; ``int`` -> {int}."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set(typing.get_args(annotation))
    return {annotation}


def test_the_flags_are_the_fields_of_settings_in_order() -> None:
    fields = dataclasses.fields(Settings)
    assert [flag.dest for flag in FLAGS] == [field.name for field in fields]
    assert [flag.name for flag in FLAGS] == ["--" + field.name.replace("_", "-") for field in fields]
    defaults = Settings()
    for flag in FLAGS:
        assert getattr(defaults, flag.dest) == flag.default, flag.name


@pytest.mark.parametrize("flag", FLAGS, ids=lambda flag: flag.name)
def test_each_field_has_the_type_of_its_default_and_of_its_parser(flag: config.Flag) -> None:
    allowed = _members(FIELD_TYPES[flag.dest])
    assert type(flag.default) in allowed, f"{flag.name}: default {flag.default!r} is not a {allowed}"
    if flag.is_switch:
        assert allowed == {bool} and flag.parse is None
        return
    assert callable(flag.parse), flag.name
    returns = str if flag.parse is str else typing.get_type_hints(flag.parse)["return"]
    assert _members(returns) <= allowed, f"{flag.name}: its parser returns {returns}, the field is {allowed}"


def test_settings_are_given_with_their_source_and_the_config_is_made_once() -> None:
    given = GivenSettings()
    given.update({"cache_size": 1 << 30, "read_only": True}, "flag")
    given.update({"cache_size": 1 << 29}, "-o")  # a later source wins
    with pytest.raises(KeyError, match="no_such_setting"):
        given.update({"no_such_setting": 1}, "flag")
    mount = given.build("a-bucket", "/mnt/x")
    assert mount.cache_size == 1 << 29 and mount.read_only and mount.values == {"cache_size": 1 << 29}
    assert mount.source_of("cache_size") == "-o" and mount.source_of("read_only") == "flag"
    assert mount.source_of("read_streams") == "default"
    for name in ("cache_size", "mountpoint", "read_only"):  # the mount's own fields too
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(mount, name, None)
    moved = dataclasses.replace(mount, mountpoint="/mnt/y")
    assert (moved.mountpoint, mount.mountpoint) == ("/mnt/y", "/mnt/x") and moved.sources == mount.sources


def test_values_given_at_construction_are_the_settings() -> None:
    mount = MountConfig("a-bucket", "/mnt/x", metadata_ttl=-1.0, workers=3)
    assert mount.metadata_ttl == -1.0 and mount.effective_listing_ttl == -1.0 and mount.effective_workers == 3
    assert mount.values == {} and mount.source_of("workers") == "default"  # none given through a source
    with pytest.raises(TypeError):
        MountConfig("a-bucket", "/mnt/x", no_such_setting=1)  # type: ignore[call-arg]


def test_validators_are_named_for_their_flag() -> None:
    assert config.FLAG_BY_DEST["read_streams"].parse is config.parse_read_streams
    assert config.FLAG_BY_DEST["workers"].parse is config.parse_workers
    assert config.FLAG_BY_DEST["prefetch_metadata_workers"].parse is config.parse_prefetch_metadata_workers
    assert config.parse_read_streams(str(config.MAX_READ_STREAMS)) == config.MAX_READ_STREAMS
    assert config.parse_prefetch_metadata_workers(str(config.MAX_LISTING_CALLS)) == config.MAX_LISTING_CALLS
    for parse, limit in ((config.parse_read_streams, config.MAX_READ_STREAMS),
                         (config.parse_workers, config.MAX_WORKERS),
                         (config.parse_prefetch_metadata_workers, config.MAX_LISTING_CALLS)):
        for bad in ("0", str(limit + 1), "many"):
            with pytest.raises(ValueError):
                parse(bad)
