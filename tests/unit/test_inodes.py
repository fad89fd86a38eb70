"""Unit tests for the inode table (rapidmount.superblock.inodes)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rapidmount.superblock.inodes import ROOT_INODE, InodeTable
from rapidmount.superblock.names import EntryKind, child_path

FILE, DIR = EntryKind.FILE, EntryKind.DIR


def looked_up(table: InodeTable, parent: int, name: str, kind: EntryKind = FILE) -> int:
    """What a FUSE lookup does: resolve, then count the kernel's reference."""
    inode = table.resolve(parent, name, kind)
    table.lookup(inode.ino)
    return inode.ino


def test_root() -> None:
    table = InodeTable()
    root = table.get(ROOT_INODE)
    assert (root.ino, root.parent, root.path, root.kind) == (1, 1, "", DIR)
    assert root.object_id == 1 and len(table) == 1
    with pytest.raises(KeyError):
        table.get(2)


def test_resolve_is_stable_and_derives_paths() -> None:
    table = InodeTable()
    d = looked_up(table, ROOT_INODE, "a", DIR)
    f = looked_up(table, d, "b")
    assert table.get(d).path == "a/" and table.get(f).path == "a/b"
    assert table.resolve(d, "b", FILE).ino == f
    assert table.child(d, "b") is table.get(f) and table.child(d, "zz") is None
    assert table.get(f).object_id == f
    assert [i.ino for i in table.children(d)] == [f]


def test_resolve_rejects_bad_names_and_non_directories() -> None:
    table = InodeTable()
    f = looked_up(table, ROOT_INODE, "f")
    with pytest.raises(ValueError):
        table.resolve(ROOT_INODE, "..", FILE)
    with pytest.raises(NotADirectoryError):
        table.resolve(f, "x", FILE)


def test_kind_change_gets_new_inode_and_detaches_old() -> None:
    table = InodeTable()
    old = looked_up(table, ROOT_INODE, "x", FILE)
    new = looked_up(table, ROOT_INODE, "x", DIR)
    assert new > old and table.get(new).path == "x/"
    assert table.get(old).detached and table.child(ROOT_INODE, "x").ino == new
    table.forget(old, 1)
    assert old not in table and new in table


def test_generation_change_gets_new_inode_when_asked() -> None:
    table = InodeTable()
    a = table.resolve(ROOT_INODE, "f", FILE, generation=5)
    assert table.resolve(ROOT_INODE, "f", FILE, generation=5) is a
    assert table.resolve(ROOT_INODE, "f", FILE) is a  # generation not given: same inode
    b = table.resolve(ROOT_INODE, "f", FILE, generation=6)
    assert b.ino != a.ino and b.generation == 6
    assert a.ino not in table  # never looked up, so dropped at once


def test_forget_drops_only_when_unreferenced_and_closed() -> None:
    table = InodeTable()
    f = looked_up(table, ROOT_INODE, "f")
    table.lookup(f)
    table.opened(f)
    table.forget(f, 2)
    assert f in table  # still open
    table.closed(f)
    assert f not in table and table.child(ROOT_INODE, "f") is None
    table.forget(f, 1)  # unknown inode: FORGET must never fail
    table.closed(f)


def test_forget_never_drops_root_and_clamps() -> None:
    table = InodeTable()
    table.forget(ROOT_INODE, 5)
    assert ROOT_INODE in table and table.get(ROOT_INODE).nlookup == 0


def test_inode_numbers_are_never_reused() -> None:
    table = InodeTable()
    first = looked_up(table, ROOT_INODE, "f")
    table.forget(first, 1)
    second = looked_up(table, ROOT_INODE, "f")
    assert second > first


def test_detach_keeps_inode_until_forgotten() -> None:
    table = InodeTable()
    f = looked_up(table, ROOT_INODE, "f")
    table.detach(f)
    assert table.child(ROOT_INODE, "f") is None and table.get(f).detached
    replacement = looked_up(table, ROOT_INODE, "f")
    assert replacement != f
    table.forget(f, 1)
    assert f not in table and table.child(ROOT_INODE, "f").ino == replacement
    with pytest.raises(ValueError):
        table.detach(ROOT_INODE)


def test_parent_kept_while_child_referenced() -> None:
    table = InodeTable()
    d = looked_up(table, ROOT_INODE, "d", DIR)
    f = looked_up(table, d, "f")
    table.forget(d, 1)
    assert d in table  # a live child needs its parent's path
    table.forget(f, 1)
    assert d not in table and f not in table and len(table) == 1


def test_forgetting_a_directory_drops_its_never_looked_up_children() -> None:
    table = InodeTable()
    d = looked_up(table, ROOT_INODE, "d", DIR)
    for i in range(100):
        table.resolve(d, f"f{i}", FILE)  # readdir entries the kernel never took
    assert len(table) == 102
    table.forget(d, 1)
    assert len(table) == 1


def test_move_file_and_replace_target() -> None:
    table = InodeTable()
    a = looked_up(table, ROOT_INODE, "a", DIR)
    f = looked_up(table, ROOT_INODE, "f")
    victim = looked_up(table, a, "g")
    table.move(f, a, "g")
    assert table.get(f).path == "a/g" and table.get(f).parent == a
    assert table.child(a, "g").ino == f and table.child(ROOT_INODE, "f") is None
    assert table.get(victim).detached


def test_move_directory_updates_all_descendants() -> None:
    table = InodeTable()
    a = looked_up(table, ROOT_INODE, "a", DIR)
    b = looked_up(table, a, "b", DIR)
    c = looked_up(table, b, "c")
    z = looked_up(table, ROOT_INODE, "z", DIR)
    table.move(a, z, "renamed")
    assert table.get(a).path == "z/renamed/"
    assert table.get(b).path == "z/renamed/b/"
    assert table.get(c).path == "z/renamed/b/c"


def test_move_refuses_cycles_and_root() -> None:
    table = InodeTable()
    a = looked_up(table, ROOT_INODE, "a", DIR)
    b = looked_up(table, a, "b", DIR)
    with pytest.raises(ValueError):
        table.move(a, b, "a")
    with pytest.raises(ValueError):
        table.move(a, a, "a")
    with pytest.raises(ValueError):
        table.move(ROOT_INODE, a, "r")
    assert table.get(a).path == "a/"


NAMES = st.sampled_from(["a", "b", "c"])
KINDS = st.sampled_from([FILE, DIR])


class InodeMachine(RuleBasedStateMachine):
    """Random kernel-like traffic keeps the table consistent."""

    def __init__(self) -> None:
        super().__init__()
        self.table = InodeTable()
        self.max_ino = ROOT_INODE
        self.refs: dict[int, int] = {}  # what the kernel holds: ino -> nlookup

    def live(self) -> list[int]:
        return sorted(self.table._inodes)

    def pick(self, data: st.DataObject, pool: list[int]) -> int:
        return data.draw(st.sampled_from(pool))

    @rule(data=st.data(), name=NAMES, kind=KINDS)
    def lookup(self, data: st.DataObject, name: str, kind: EntryKind) -> None:
        dirs = [i for i in self.live() if self.table.get(i).kind is DIR and not self.table.get(i).detached]
        parent = self.pick(data, dirs)
        existing = self.table.child(parent, name)
        inode = self.table.resolve(parent, name, kind)
        if existing is None or existing.kind is not kind:
            assert inode.ino > self.max_ino, "inode number reused"
            self.max_ino = inode.ino
        self.table.lookup(inode.ino)
        self.refs[inode.ino] = self.refs.get(inode.ino, 0) + 1

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def forget(self, data: st.DataObject) -> None:
        ino = self.pick(data, sorted(self.refs))
        n = data.draw(st.integers(1, self.refs[ino]))
        self.table.forget(ino, n)
        self.refs[ino] -= n
        if not self.refs[ino]:
            del self.refs[ino]

    @precondition(lambda self: self.refs)
    @rule(data=st.data())
    def open_close(self, data: st.DataObject) -> None:
        ino = self.pick(data, sorted(self.refs))
        self.table.opened(ino)
        if data.draw(st.booleans()):
            self.table.closed(ino)

    @precondition(lambda self: len(self.table) > 1)
    @rule(data=st.data())
    def detach(self, data: st.DataObject) -> None:
        self.table.detach(self.pick(data, self.live()[1:]))

    @precondition(lambda self: len(self.table) > 1)
    @rule(data=st.data(), name=NAMES)
    def move(self, data: st.DataObject, name: str) -> None:
        ino = self.pick(data, self.live()[1:])
        dirs = [i for i in self.live() if self.table.get(i).kind is DIR and not self.table.get(i).detached]
        try:
            self.table.move(ino, self.pick(data, dirs), name)
        except ValueError:
            pass  # a directory into itself

    @invariant()
    def consistent(self) -> None:
        table = self.table
        assert ROOT_INODE in table
        for ino in self.refs:
            assert ino in table, "an inode the kernel holds was dropped"
        for parent, names in table._children.items():
            for name, ino in names.items():
                child = table.get(ino)
                assert (child.parent, child.name, child.detached) == (parent, name, False)
                assert child.path == child_path(table.get(parent).path, name, child.kind is DIR)
        for ino in table._inodes:
            assert table.get(ino).ino == ino <= self.max_ino


InodeMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_inode_state_machine = InodeMachine.TestCase
