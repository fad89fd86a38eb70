"""Unit tests for object name <-> POSIX name mapping (rapidmount.superblock.names)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapidmount.superblock.names import (
    MAX_NAME_BYTES,
    REASON_DOT,
    REASON_EMPTY,
    REASON_NUL,
    REASON_OUTSIDE,
    REASON_SHADOWED,
    REASON_TOO_LONG,
    EntryKind,
    HiddenNames,
    ListedEntry,
    child_path,
    component_from_fuse,
    entries_from_listing,
    invalid_reason,
    is_valid_component,
    parent_prefix,
    split_object_name,
)

FILE, DIR, LINK = EntryKind.FILE, EntryKind.DIR, EntryKind.SYMLINK


@pytest.mark.parametrize(
    "name, reason",
    [
        ("a", None),
        ("with space", None),
        ("ünïcödé", None),
        (".hidden", None),
        ("...", None),
        ("x" * MAX_NAME_BYTES, None),
        ("é" * 127, None),  # 254 bytes
        ("", REASON_EMPTY),
        (".", REASON_DOT),
        ("..", REASON_DOT),
        ("a\x00b", REASON_NUL),
        ("x" * (MAX_NAME_BYTES + 1), REASON_TOO_LONG),
        ("é" * 128, REASON_TOO_LONG),  # 128 characters but 256 bytes
    ],
)
def test_component_validity(name: str, reason: str | None) -> None:
    assert invalid_reason(name) == reason
    assert is_valid_component(name) is (reason is None)


def test_slash_and_surrogates_are_never_components() -> None:
    assert not is_valid_component("a/b")
    assert not is_valid_component("/")
    assert not is_valid_component("\udcff")


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"file.txt", "file.txt"),
        ("ü".encode(), "ü"),
        (b"\xff\xfe", None),  # not UTF-8
        (b"..", None),
        (b".", None),
        (b"", None),
        (b"a\x00", None),
        (b"x" * 256, None),
    ],
)
def test_component_from_fuse(raw: bytes, expected: str | None) -> None:
    assert component_from_fuse(raw) == expected


@pytest.mark.parametrize(
    "prefix, name, is_dir, expected",
    [
        ("", "a", False, "a"),
        ("", "a", True, "a/"),
        ("a/b/", "c", False, "a/b/c"),
        ("a/b/", "c", True, "a/b/c/"),
    ],
)
def test_child_path(prefix: str, name: str, is_dir: bool, expected: str) -> None:
    assert child_path(prefix, name, is_dir) == expected


@pytest.mark.parametrize(
    "prefix, name", [("", ".."), ("a/", "."), ("a/", ""), ("a/", "b/c"), ("a", "b")]
)
def test_child_path_refuses_escapes(prefix: str, name: str) -> None:
    with pytest.raises(ValueError):
        child_path(prefix, name, False)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a", ["a"]),
        ("a/b/c", ["a", "b", "c"]),
        ("a/b/", ["a", "b"]),
        ("", None),
        ("/", None),
        ("/a", None),
        ("a//b", None),
        ("a//", None),
        ("a/./b", None),
        ("a/../b", None),
        ("../etc/passwd", None),
        ("a/\x00", None),
    ],
)
def test_split_object_name(name: str, expected: list[str] | None) -> None:
    assert split_object_name(name) == expected


@pytest.mark.parametrize(
    "path, expected",
    [("a/b/c", "a/b/"), ("a/b/c/", "a/b/"), ("a", ""), ("a/", ""), ("", "")],
)
def test_parent_prefix(path: str, expected: str) -> None:
    assert parent_prefix(path) == expected


def test_hidden_names_note_once_and_bounded() -> None:
    hidden = HiddenNames(max_entries=2)
    assert hidden.note("a//b", REASON_EMPTY)
    assert not hidden.note("a//b", REASON_EMPTY)
    assert hidden.note("x", REASON_SHADOWED) and not hidden.take_overflow()
    # Full: nothing is forgotten (it would be logged again at every listing),
    # new names are not logged, and the caller is told so once.
    assert not hidden.note("y", REASON_SHADOWED) and not hidden.note("z", REASON_SHADOWED)
    assert len(hidden) == 2 and "a//b" in hidden and "y" not in hidden
    assert not hidden.note("a//b", REASON_EMPTY)
    assert hidden.take_overflow() and not hidden.take_overflow()


def test_hidden_names_messages_name_objects_and_prefixes() -> None:
    hidden = HiddenNames(max_entries=2)
    assert hidden.messages([("d/..", REASON_DOT), ("d/../", REASON_DOT)]) == [
        ("hiding object %r: %s", ("d/..", REASON_DOT)),
        ("hiding %r and every object below it: %s", ("d/../", REASON_DOT))]
    hidden.note("a", REASON_SHADOWED), hidden.note("b", REASON_SHADOWED), hidden.note("c", REASON_SHADOWED)
    assert hidden.messages([]) == [
        ("more than %d hidden names: the others are hidden without a log line", (2,))]
    assert hidden.messages([]) == []


def listing(prefix, objects, prefixes=(), hidden=None, **kw):
    hidden = HiddenNames() if hidden is None else hidden
    objs = [(name, f"rec:{name}") for name in objects]
    return entries_from_listing(prefix, objs, prefixes, hidden, **kw)


def test_listing_maps_files_and_prefixes_sorted() -> None:
    entries, hidden = listing("d/", ["d/b", "d/a"], ["d/c/", "d/0/"])
    assert entries == [
        ListedEntry("0", DIR, None),
        ListedEntry("a", FILE, "rec:d/a"),
        ListedEntry("b", FILE, "rec:d/b"),
        ListedEntry("c", DIR, None),
    ]
    assert hidden == []


def test_listing_skips_own_placeholder_and_maps_child_placeholders() -> None:
    entries, hidden = listing("d/", ["d/", "d/x/"], ["d/x/"])
    assert entries == [ListedEntry("x", DIR, "rec:d/x/")]
    assert hidden == []


def test_listing_directory_shadows_file() -> None:
    entries, hidden = listing("", ["a", "b"], ["a/"])
    assert entries == [ListedEntry("a", DIR, None), ListedEntry("b", FILE, "rec:b")]
    assert hidden == [("a", REASON_SHADOWED)]


def test_listing_hides_invalid_names_and_logs_each_once() -> None:
    memory = HiddenNames()
    objects = ["d/ok", "d/.", "d/..", "d/a\x00", "d/" + "x" * 256, "elsewhere"]
    entries, hidden = listing("d/", objects, ["d//", "d/../"], memory)
    assert entries == [ListedEntry("ok", FILE, "rec:d/ok")]
    assert sorted(hidden) == sorted(
        [
            ("d/.", REASON_DOT),
            ("d/..", REASON_DOT),
            ("d/a\x00", REASON_NUL),
            ("d/" + "x" * 256, REASON_TOO_LONG),
            ("elsewhere", REASON_OUTSIDE),
            ("d//", REASON_EMPTY),
            ("d/../", REASON_DOT),
        ]
    )
    again, hidden_again = listing("d/", objects, ["d//", "d/../"], memory)
    assert again == entries and hidden_again == []


def test_listing_symlinks_and_deeper_objects() -> None:
    entries, _ = listing(
        "", ["link", "f", "deep/er/obj"], is_symlink=lambda rec: rec == "rec:link"
    )
    assert entries == [
        ListedEntry("deep", DIR, None),
        ListedEntry("f", FILE, "rec:f"),
        ListedEntry("link", LINK, "rec:link"),
    ]


segment = st.sampled_from(["a", "b", "", ".", "..", "c\x00", "é" * 130, "x"])
object_names = st.lists(segment, min_size=1, max_size=4).map("/".join)


@settings(max_examples=300, deadline=None)
@given(objects=st.lists(object_names, max_size=12), dir_segments=st.lists(st.sampled_from(["a", "b"]), max_size=2))
def test_listing_never_yields_an_unsafe_or_duplicate_name(objects, dir_segments) -> None:
    prefix = "".join(s + "/" for s in dir_segments)
    prefixes = sorted(
        {prefix + o[len(prefix):].split("/")[0] + "/" for o in objects if o.startswith(prefix) and "/" in o[len(prefix):]}
    )
    files = [o for o in objects if o.startswith(prefix) and "/" not in o[len(prefix):]]
    entries, hidden = listing(prefix, files, prefixes)
    names = [e.name for e in entries]
    assert names == sorted(set(names))
    for entry in entries:
        assert is_valid_component(entry.name)
        full = child_path(prefix, entry.name, entry.kind is DIR)
        assert split_object_name(full) is not None and full.startswith(prefix)
    visible_dirs = {e.name for e in entries if e.kind is DIR}
    for entry in entries:
        assert entry.kind is DIR or entry.name not in visible_dirs
    assert len({name for name, _ in hidden}) == len(hidden)
    # Nothing silently vanishes: each file is listed or reported as hidden.
    hidden_names = {name for name, _ in hidden}
    listed_files = {prefix + e.name for e in entries if e.kind is FILE}
    for name in files:
        if name != prefix:
            assert (name in listed_files) != (name in hidden_names), name
