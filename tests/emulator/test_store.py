"""The emulator's object store, without gRPC.

A hypothesis state machine drives random create / append / flush / finalize /
delete / move / put / list sequences against a plain dict model; example
tests pin listing semantics, folders, and persistence across restarts.
"""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import google_crc32c
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from rapidmount.emulator import Emulator
from rapidmount.emulator.listing import successor
from rapidmount.emulator.store import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Preconditions,
    Store,
    parent_folders,
)

BUCKET = "model-bucket"

# Few, overlapping path segments so that prefixes, delimiters and subtrees collide.
names = st.lists(st.sampled_from(["a", "b", "a/", "b/", "ab", "é", "-", "/", "z~"]), min_size=1, max_size=4).map(
    "".join).filter(lambda name: name not in (".", ".."))
payloads = st.binary(max_size=300)


# ---------------------------------------------------------------- the model

class ModelObject:
    def __init__(self, data: bytes = b"", finalized: bool = False) -> None:
        self.data = bytearray(data)
        self.finalized = finalized
        self.generation = 0
        self.writer_epoch = 1


def model_listing(objects: dict[str, ModelObject], folders: set[str], *, prefix: str, delimiter: str,
                  trailing: bool, start: str, end: str, with_folders: bool) -> tuple[list[str], list[str]]:
    """The listing, computed the slow and obvious way."""
    lower = max(prefix, start)
    upper = successor(prefix) if prefix else None
    if end and (upper is None or end < upper):
        upper = end

    def in_range(name: str) -> bool:
        return name.startswith(prefix) and name >= lower and (upper is None or name < upper)

    listed, prefixes = [], set()
    for name in sorted(n for n in objects if in_range(n)):
        cut = name.find(delimiter, len(prefix)) if delimiter else -1
        if cut < 0:
            listed.append(name)
            continue
        collapsed = name[:cut + len(delimiter)]
        prefixes.add(collapsed)
        if trailing and name == collapsed:
            listed.append(name)
    if with_folders and delimiter == "/":
        for folder in folders:
            if in_range(folder) and folder != prefix:
                prefixes.add(folder[:folder.index("/", len(prefix)) + 1])
    return listed, sorted(prefixes)


def list_everything(store: Store, page_size: int, **query) -> tuple[list[str], list[str]]:
    objects, prefixes, token = [], [], ""
    while True:
        page = store.list_objects(BUCKET, page_size=page_size, page_token=token, **query)
        limit = page_size + (1 if page_size == 1 else 0)  # a prefix and its own object travel together
        assert len(page.objects) + len(page.prefixes) <= limit
        assert page.objects or page.prefixes or not page.next_page_token
        objects += [record.name for record in page.objects]
        prefixes += page.prefixes
        token = page.next_page_token
        if not token:
            return objects, prefixes


class StoreMachine(RuleBasedStateMachine):
    """Random operations on a zonal bucket, mirrored on a dict of ModelObjects."""

    @initialize()
    def setup(self) -> None:
        self.store = Store()
        self.store.create_bucket(BUCKET, "zonal")
        self.model: dict[str, ModelObject] = {}
        self.folders: set[str] = set()

    def teardown(self) -> None:
        self.store.close()

    def _created(self, name: str, obj: ModelObject, generation: int, epoch: int = 1) -> None:
        obj.generation, obj.writer_epoch = generation, epoch
        self.model[name] = obj
        self.folders.update(parent_folders(name))

    # ------------------------------------------------------------ writes

    @rule(name=names, create_only=st.booleans())
    def create_appendable(self, name: str, create_only: bool) -> None:
        condition = Preconditions(if_generation_match=0) if create_only else Preconditions()
        if create_only and name in self.model:
            with pytest.raises(FailedPrecondition):
                self.store.create_appendable(BUCKET, name, condition)
            return
        record = self.store.create_appendable(BUCKET, name, condition)
        assert (record.size, record.finalized, record.writer_epoch) == (0, False, 1)
        self._created(name, ModelObject(), record.generation)

    @rule(name=names, data=payloads)
    def put_object(self, name: str, data: bytes) -> None:
        record = self.store.put_object(BUCKET, name, data)
        assert record.crc32c == google_crc32c.value(data)
        self._created(name, ModelObject(data, finalized=True), record.generation)

    @rule(name=names, data=payloads, rewind=st.integers(min_value=0, max_value=50))
    def append(self, name: str, data: bytes, rewind: int) -> None:
        obj = self.model.get(name)
        if obj is None:
            with pytest.raises(NotFound):
                self.store.append(BUCKET, name, 1, 1, 0, data)
            return
        if obj.finalized:
            with pytest.raises(FailedPrecondition):
                self.store.append(BUCKET, name, obj.generation, obj.writer_epoch, len(obj.data), data)
            return
        # Resending already persisted bytes is harmless: they are skipped.
        offset = max(0, len(obj.data) - rewind)
        resent = bytes(obj.data[offset:]) + data
        record = self.store.append(BUCKET, name, obj.generation, obj.writer_epoch, offset, resent)
        obj.data += data
        assert record.size == len(obj.data)

    @rule(name=names, gap=st.integers(min_value=1, max_value=10))
    def append_past_the_end_fails(self, name: str, gap: int) -> None:
        obj = self.model.get(name)
        if obj is not None and not obj.finalized:
            with pytest.raises(OutOfRange):
                self.store.append(BUCKET, name, obj.generation, obj.writer_epoch, len(obj.data) + gap, b"x")

    @rule(name=names)
    def takeover_fences_the_old_writer(self, name: str) -> None:
        obj = self.model.get(name)
        if obj is None or obj.finalized:
            return
        record = self.store.open_appendable(BUCKET, name, obj.generation)
        assert record.writer_epoch == obj.writer_epoch + 1
        with pytest.raises(FailedPrecondition):
            self.store.append(BUCKET, name, obj.generation, obj.writer_epoch, len(obj.data), b"stale")
        with pytest.raises(FailedPrecondition):
            self.store.open_appendable(BUCKET, name, obj.generation, writer_epoch=obj.writer_epoch)
        obj.writer_epoch = record.writer_epoch

    @rule(name=names)
    def flush(self, name: str) -> None:
        obj = self.model.get(name)
        if obj is None or obj.finalized:
            return
        record = self.store.writer_state(BUCKET, name, obj.generation, obj.writer_epoch)
        self.store.sync(record)
        assert (record.size, record.crc32c) == (len(obj.data), google_crc32c.value(bytes(obj.data)))

    @rule(name=names, checksum_right=st.booleans())
    def finalize(self, name: str, checksum_right: bool) -> None:
        obj = self.model.get(name)
        if obj is None or obj.finalized:
            return
        crc = google_crc32c.value(bytes(obj.data))
        if not checksum_right:
            with pytest.raises(InvalidArgument):
                self.store.finalize(BUCKET, name, obj.generation, obj.writer_epoch, expected_crc32c=crc ^ 1)
            return
        record = self.store.finalize(BUCKET, name, obj.generation, obj.writer_epoch, expected_crc32c=crc)
        assert record.finalized and record.finalize_time
        obj.finalized = True

    @rule(name=names, wrong_generation=st.booleans())
    def delete(self, name: str, wrong_generation: bool) -> None:
        obj = self.model.get(name)
        if obj is None:
            with pytest.raises(NotFound):
                self.store.delete_object(BUCKET, name)
        elif wrong_generation:
            with pytest.raises(FailedPrecondition):
                self.store.delete_object(BUCKET, name, preconditions=Preconditions(
                    if_generation_match=obj.generation + 1))
        else:
            self.store.delete_object(BUCKET, name)
            del self.model[name]

    @rule(source=names, destination=names)
    def move(self, source: str, destination: str) -> None:
        if source not in self.model:
            with pytest.raises(NotFound):
                self.store.move_object(BUCKET, source, destination + "-moved")
            return
        if source == destination:
            with pytest.raises(InvalidArgument):
                self.store.move_object(BUCKET, source, destination)
            return
        record = self.store.move_object(BUCKET, source, destination)
        obj = self.model.pop(source)
        self._created(destination, obj, record.generation)

    # ------------------------------------------------------------ reads

    @rule(prefix=st.sampled_from(["", "a", "a/", "b/", "a/a", "é"]), delimiter=st.sampled_from(["", "/", "b"]),
          trailing=st.booleans(), start=st.sampled_from(["", "a/", "ab", "b"]), end=st.sampled_from(["", "b", "b/", "z"]),
          page_size=st.sampled_from([1, 2, 3, 1000]), with_folders=st.booleans())
    def list_objects(self, prefix, delimiter, trailing, start, end, page_size, with_folders) -> None:
        query = dict(prefix=prefix, delimiter=delimiter, include_trailing_delimiter=trailing,
                     lexicographic_start=start, lexicographic_end=end, include_folders_as_prefixes=with_folders)
        assert list_everything(self.store, page_size, **query) == model_listing(
            self.model, self.folders, prefix=prefix, delimiter=delimiter, trailing=trailing, start=start,
            end=end, with_folders=with_folders)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def objects_match_the_model(self) -> None:
        for name, obj in self.model.items():
            record = self.store.get_object(BUCKET, name)
            assert (record.generation, record.size, record.finalized) == (obj.generation, len(obj.data), obj.finalized)
            assert record.crc32c == google_crc32c.value(bytes(obj.data))
            assert self.store.read_all(BUCKET, name) == obj.data

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def folders_match_the_model(self) -> None:
        listed = []
        token = ""
        while True:
            page = self.store.list_folders(BUCKET, page_token=token, page_size=7)
            listed += [folder.name for folder in page.folders]
            token = page.next_page_token
            if not token:
                break
        assert listed == sorted(self.folders)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- listing examples

@pytest.fixture
def store():
    store = Store()
    store.create_bucket("zonal-b", "zonal")
    store.create_bucket("flat-b", "flat")
    yield store
    store.close()


@pytest.mark.parametrize("name", ["b", "ab", "Upper-case", "-dash-first", "dots..twice", "x" * 223, "under_last_"])
def test_bucket_names_gcs_refuses_are_refused(store, name):
    with pytest.raises(InvalidArgument):
        store.create_bucket(name, "flat")


def test_bucket_kinds_and_names(store):
    assert store.create_bucket("a.b-c_9", "hns").location_type == "region"
    assert store.create_bucket("zonal-b", "zonal").location_type == "zone"  # the same again: returned as is
    with pytest.raises(AlreadyExists):
        store.create_bucket("zonal-b", "flat")
    with pytest.raises(InvalidArgument):
        store.create_bucket("other-b", "regional")


def _names(listing):
    return [record.name for record in listing.objects]


def test_listing_with_delimiter_and_trailing_delimiter(store):
    for name in ("dir/", "dir/a", "dir/sub/b", "dir2", "top"):
        store.put_object("flat-b", name, b"")
    plain = store.list_objects("flat-b", delimiter="/")
    assert (_names(plain), plain.prefixes) == (["dir2", "top"], ["dir/"])
    trailing = store.list_objects("flat-b", delimiter="/", include_trailing_delimiter=True)
    assert (_names(trailing), trailing.prefixes) == (["dir/", "dir2", "top"], ["dir/"])
    inside = store.list_objects("flat-b", prefix="dir/", delimiter="/")
    assert (_names(inside), inside.prefixes) == (["dir/", "dir/a"], ["dir/sub/"])
    everything = store.list_objects("flat-b")
    assert _names(everything) == ["dir/", "dir/a", "dir/sub/b", "dir2", "top"]


def test_listing_with_lexicographic_bounds(store):
    for name in ("a", "b", "ba", "c", "d"):
        store.put_object("flat-b", name, b"")
    window = store.list_objects("flat-b", lexicographic_start="b", lexicographic_end="d")
    assert _names(window) == ["b", "ba", "c"]
    assert _names(store.list_objects("flat-b", lexicographic_start="bb")) == ["c", "d"]
    assert _names(store.list_objects("flat-b", lexicographic_end="b")) == ["a"]


def test_listing_orders_by_utf8_bytes(store):
    for name in ("é", "z", "Z", "~", "\u4e00", "\U0001f600"):
        store.put_object("flat-b", name, b"")
    listed = _names(store.list_objects("flat-b"))
    assert listed == sorted(listed, key=lambda name: name.encode())


def test_listing_pages_across_more_than_1000_objects(store):
    names = [f"many/{index:05d}" for index in range(2500)]
    store.put_many("flat-b", {name: b"" for name in names})
    pages, token, seen = 0, "", []
    while True:
        page = store.list_objects("flat-b", prefix="many/", page_token=token)
        assert len(page.objects) <= 1000
        seen += _names(page)
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert (seen, pages) == (names, 3)
    with pytest.raises(InvalidArgument):
        store.list_objects("flat-b", page_token="not-a-token")
    with pytest.raises(InvalidArgument):
        store.list_objects("flat-b", page_size=-1)


def test_listing_skips_large_subtrees_with_a_delimiter(store):
    store.put_many("flat-b", {f"big/{index:05d}": b"" for index in range(3000)})
    store.put_object("flat-b", "small", b"")
    listing = store.list_objects("flat-b", delimiter="/", page_size=1)
    assert (listing.prefixes, _names(listing)) == (["big/"], [])
    following = store.list_objects("flat-b", delimiter="/", page_size=1, page_token=listing.next_page_token)
    assert (following.prefixes, _names(following), following.next_page_token) == ([], ["small"], "")


def test_empty_folders_show_up_as_prefixes(store):
    store.create_folder("zonal-b", "empty/")
    store.create_folder("zonal-b", "docs/inner/", recursive=True)
    store.put_object("zonal-b", "docs/file", b"")
    top = store.list_objects("zonal-b", delimiter="/", include_folders_as_prefixes=True)
    assert top.prefixes == ["docs/", "empty/"]
    assert store.list_objects("zonal-b", delimiter="/").prefixes == ["docs/"]
    docs = store.list_objects("zonal-b", prefix="docs/", delimiter="/", include_folders_as_prefixes=True)
    assert (_names(docs), docs.prefixes) == (["docs/file"], ["docs/inner/"])


def test_objects_create_their_parent_folders(store):
    store.put_object("zonal-b", "p/q//r/obj", b"")
    store.put_object("zonal-b", "dir1/", b"")
    folders = [folder.name for folder in store.list_folders("zonal-b").folders]
    assert folders == ["dir1/", "p/", "p/q/", "p/q//", "p/q//r/"]
    store.put_object("flat-b", "p/q/obj", b"")
    with pytest.raises(FailedPrecondition):
        store.list_folders("flat-b")
    with pytest.raises(InvalidArgument):
        store.put_object("zonal-b", "x/" * 51 + "too-deep", b"")
    with pytest.raises(InvalidArgument):
        store.put_object("zonal-b", "f" * 600 + "/name", b"")


def test_folder_rules(store):
    with pytest.raises(FailedPrecondition):
        store.create_folder("zonal-b", "a/b/")  # the parent is missing
    store.create_folder("zonal-b", "a/b/", recursive=True)
    with pytest.raises(AlreadyExists):
        store.create_folder("zonal-b", "a/")
    with pytest.raises(InvalidArgument):
        store.create_folder("zonal-b", "no-trailing-slash")
    with pytest.raises(FailedPrecondition):
        store.delete_folder("zonal-b", "a/")  # holds a/b/
    store.delete_folder("zonal-b", "a/b/")
    store.put_object("zonal-b", "a/file", b"")
    with pytest.raises(FailedPrecondition):
        store.delete_folder("zonal-b", "a/")  # holds an object
    with pytest.raises(NotFound):
        store.get_folder("zonal-b", "missing/")
    folder = store.get_folder("zonal-b", "a/")
    with pytest.raises(FailedPrecondition):
        store.get_folder("zonal-b", "a/", Preconditions(if_metageneration_match=folder.metageneration + 1))


def test_list_folders_with_delimiter_and_paging(store):
    for folder in ("a/", "a/b/", "a/b/c/", "a/d/", "e/"):
        store.create_folder("zonal-b", folder, recursive=True)
    children = store.list_folders("zonal-b", prefix="a/", delimiter="/")
    assert [folder.name for folder in children.folders] == ["a/", "a/b/", "a/d/"]
    first = store.list_folders("zonal-b", page_size=2)
    rest = store.list_folders("zonal-b", page_size=10, page_token=first.next_page_token)
    assert [f.name for f in first.folders + rest.folders] == ["a/", "a/b/", "a/b/c/", "a/d/", "e/"]
    with pytest.raises(InvalidArgument):
        store.list_folders("zonal-b", prefix="a")


def test_rename_folder_moves_the_subtree_atomically(store):
    store.create_folder("zonal-b", "src/empty/", recursive=True)
    before = store.put_object("zonal-b", "src/x", b"x")
    store.put_object("zonal-b", "src/deep/y", b"y")
    store.put_object("zonal-b", "srcfile", b"not inside")
    store.create_folder("zonal-b", "dst/")
    with pytest.raises(AlreadyExists):
        store.rename_folder("zonal-b", "src/", "dst/")
    with pytest.raises(InvalidArgument):
        store.rename_folder("zonal-b", "src/", "src/inner/")
    with pytest.raises(FailedPrecondition):
        store.rename_folder("zonal-b", "src/", "missing-parent/new/")
    renamed = store.rename_folder("zonal-b", "src/", "dst/moved/")
    assert renamed.name == "dst/moved/"
    assert _names(store.list_objects("zonal-b")) == ["dst/moved/deep/y", "dst/moved/x", "srcfile"]
    assert store.read_all("zonal-b", "dst/moved/deep/y") == b"y"
    after = store.get_object("zonal-b", "dst/moved/x")  # the same generation; its metadata changed
    assert (after.generation, after.metageneration) == (before.generation, before.metageneration + 1)
    folders = [folder.name for folder in store.list_folders("zonal-b").folders]
    assert folders == ["dst/", "dst/moved/", "dst/moved/deep/", "dst/moved/empty/"]


def test_a_folders_update_time_is_its_creation_or_its_rename(store, monkeypatch):
    """As the service keeps it: objects made, changed or deleted inside a
    folder leave its update time alone; a rename sets it (and its subfolders')."""
    now = [1_700_000_000.0]
    monkeypatch.setattr("rapidmount.emulator.store_index.time", SimpleNamespace(
        time=lambda: now[0], time_ns=lambda: int(now[0] * 1e9)))
    made = store.create_folder("zonal-b", "d/")
    assert (made.create_time, made.update_time, made.metageneration) == (now[0], now[0], 1)
    now[0] += 10
    store.put_object("zonal-b", "d/f", b"x")
    store.put_object("zonal-b", "d/", b"", metadata={"gcsfuse_mtime": "2001-02-03T04:05:06Z"})
    store.update_object("zonal-b", "d/", metadata_patch={"gcsfuse_mtime": "2002-02-03T04:05:06Z"})
    store.put_object("zonal-b", "d/sub/g", b"y")  # an implied folder: made at the object's time
    store.delete_object("zonal-b", "d/f")
    assert store.get_folder("zonal-b", "d/") == made
    assert store.get_folder("zonal-b", "d/sub/").update_time == now[0]
    now[0] += 10
    renamed = store.rename_folder("zonal-b", "d/", "e/")
    assert (renamed.create_time, renamed.update_time, renamed.metageneration) == (made.create_time, now[0], 2)
    assert store.get_folder("zonal-b", "e/sub/").update_time == now[0]
    assert store.get_object("zonal-b", "e/").metadata == {"gcsfuse_mtime": "2002-02-03T04:05:06Z"}


def test_compose_concatenates_finalized_sources(store):
    store.create_bucket("hns-b", "hns")
    store.put_object("hns-b", "one", b"abc")
    store.put_object("hns-b", "two", b"defg")
    record = store.compose("hns-b", "both", [("one", 0, None), ("two", 0, None)],
                           expected_crc32c=google_crc32c.value(b"abcdefg"))
    assert (store.read_all("hns-b", "both"), record.component_count) == (b"abcdefg", 2)
    with pytest.raises(FailedPrecondition):
        store.compose("hns-b", "bad", [("one", 0, 12345)])
    with pytest.raises(FailedPrecondition):
        store.compose("zonal-b", "bad", [("one", 0, None)])  # zonal buckets do not compose


def test_metadata_updates_bump_the_metageneration(store):
    store.put_object("flat-b", "m", b"", metadata={"a": "1", "b": "2"})
    record = store.update_object("flat-b", "m", metadata_patch={"a": None, "c": "3"})
    assert (dict(record.metadata), record.metageneration) == ({"b": "2", "c": "3"}, 2)
    record = store.update_object("flat-b", "m", metadata={"only": "this"}, content_type="text/plain")
    assert (dict(record.metadata), record.content_type, record.metageneration) == ({"only": "this"}, "text/plain", 3)
    with pytest.raises(FailedPrecondition):
        store.update_object("flat-b", "m", preconditions=Preconditions(if_metageneration_match=1))


def test_a_reader_outlives_an_overwrite(store):
    store.put_object("zonal-b", "o", b"old bytes")
    _, reader = store.open_reader("zonal-b", "o")
    store.put_object("zonal-b", "o", b"new")
    assert reader.read(0, 9) == b"old bytes"
    reader.close()


# ---------------------------------------------------------------- persistence

def test_objects_and_folders_survive_a_restart(tmp_path):
    first = Store(tmp_path)
    first.create_bucket("zonal-b", "zonal")
    first.put_object("zonal-b", "dir/final", b"final bytes", metadata={"k": "v"})
    record = first.create_appendable("zonal-b", "dir/growing")
    record = first.append("zonal-b", "dir/growing", record.generation, 1, 0, b"first half ")
    first.sync(record)
    first.create_folder("zonal-b", "empty/")
    generation = record.generation
    first.close()

    second = Store(tmp_path)
    try:
        assert second.read_all("zonal-b", "dir/final") == b"final bytes"
        assert dict(second.get_object("zonal-b", "dir/final").metadata) == {"k": "v"}
        growing = second.get_object("zonal-b", "dir/growing")
        assert (growing.generation, growing.size, growing.finalized) == (generation, 11, False)
        taken = second.open_appendable("zonal-b", "dir/growing", generation)
        second.append("zonal-b", "dir/growing", generation, taken.writer_epoch, 11, b"second half")
        done = second.finalize("zonal-b", "dir/growing", generation, taken.writer_epoch,
                               expected_crc32c=google_crc32c.value(b"first half second half"))
        assert done.finalized
        assert [f.name for f in second.list_folders("zonal-b").folders] == ["dir/", "empty/"]
        assert second.create_appendable("zonal-b", "newer").generation > generation
    finally:
        second.close()


def test_restart_recovers_bytes_the_index_had_not_recorded(tmp_path):
    store = Store(tmp_path)
    store.create_bucket("zonal-b", "zonal")
    record = store.create_appendable("zonal-b", "o")
    store.append("zonal-b", "o", record.generation, 1, 0, b"0123456789")
    store.close()
    # As if the process died between writing the blob and updating the index.
    with sqlite3.connect(tmp_path / "index.sqlite3") as db:
        db.execute("UPDATE objects SET size = 4, crc32c = 0")
    (tmp_path / "blobs" / "999.blob").write_bytes(b"orphaned upload")
    reopened = Store(tmp_path)
    try:
        recovered = reopened.get_object("zonal-b", "o")
        assert (recovered.size, recovered.crc32c) == (10, google_crc32c.value(b"0123456789"))
        assert not (tmp_path / "blobs" / "999.blob").exists()
    finally:
        reopened.close()


def test_emulator_with_a_data_dir_keeps_objects_across_restarts(tmp_path):
    with Emulator(buckets={"keep-b": "zonal"}, data_dir=str(tmp_path)) as emu:
        generation = emu.seed("keep-b", "kept/object", b"x" * 5_000_000)
        emu.seed("keep-b", "kept/unfinalized", b"partial", finalize=False)
    with Emulator(buckets={"keep-b": "zonal"}, data_dir=str(tmp_path)) as emu:
        assert emu.object_info("keep-b", "kept/object")["generation"] == generation
        assert emu.read_object("keep-b", "kept/object") == b"x" * 5_000_000
        assert emu.object_info("keep-b", "kept/unfinalized")["finalized"] is False
        assert emu.read_object("keep-b", "kept/unfinalized") == b"partial"
