"""Unit tests for the write state machine (rapidmount.core.write_state): one
phase per file, changed only through the table."""

from __future__ import annotations

import errno
import itertools

import pytest

from rapidmount.core.errors import FSError
from rapidmount.core.write_state import (TRANSITIONS, Clean, Closed, Closing, Failed, IllegalTransition,
                                         MetadataChanges, Staged, Streaming, Unlinked, Uploading, WriteState)
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import EntryKind

COPY, APPENDER = object(), object()  # stand-ins: the phases only carry them
STALE = FSError(errno.ESTALE)


def sample(kind: type):
    """One phase of each kind, with its data."""
    return {
        Clean: lambda: Clean(),
        Streaming: lambda: Streaming(APPENDER),
        Staged: lambda: Staged(COPY, dirty=True),
        Uploading: lambda: Uploading(COPY),
        Unlinked: lambda: Unlinked(COPY),
        Failed: lambda: Failed(STALE, COPY),
        Closing: lambda: Closing(Staged(COPY, dirty=False)),
        Closed: lambda: Closed(),
    }[kind]()


KINDS = [Clean, Streaming, Staged, Uploading, Unlinked, Failed, Closing, Closed]


def state_in(phase) -> WriteState:
    state = WriteState(Inode(2, 1, "f", EntryKind.FILE, "f"), size=0, base_generation=0)
    state._phase = phase  # placed there directly: what is tested is the next change
    return state


def test_the_table_names_every_phase_and_nothing_else():
    assert set(TRANSITIONS) == set(KINDS)
    assert all(targets <= set(KINDS) for targets in TRANSITIONS.values())


@pytest.mark.parametrize("old,new", list(itertools.product(KINDS, KINDS)),
                         ids=lambda kind: kind.__name__)
def test_a_change_happens_if_and_only_if_the_table_allows_it(old, new):
    state = state_in(sample(old))
    before, target = state.phase, sample(new)
    # While closing, a change of the phase being closed is checked as that phase's.
    inner = old is Closing and new not in (Closing, Closed)
    source = type(before.of) if inner else old
    if new in TRANSITIONS[source]:
        state.become(target)
        if inner:
            assert state.phase.of is target and state.phase.done is before.done
        else:
            assert state.phase is target
    else:
        with pytest.raises(IllegalTransition, match=f"{source.__name__} cannot become {new.__name__}"):
            state.become(target)
        assert state.phase is before, "a refused change changes nothing"


def test_every_phase_can_end_and_closed_is_final():
    """From every phase some path leads to Closed; nothing leaves Closed."""
    assert TRANSITIONS[Closed] == frozenset()
    for kind in KINDS:
        seen, frontier = {kind}, [kind]
        while frontier:
            for target in TRANSITIONS[frontier.pop()]:
                if target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert Closed in seen or kind is Closed, f"{kind.__name__} can never end"


def test_while_closing_the_closed_phase_still_moves_only_as_the_table_allows():
    state = state_in(Clean())
    state.become(Closing(state.phase))
    done = state.phase.done
    state.become(Staged(COPY, dirty=True))  # a truncate(2) stages inside its closing
    assert isinstance(state.phase, Closing) and isinstance(state.current, Staged) and state.phase.done is done
    with pytest.raises(IllegalTransition, match="Staged cannot become Streaming"):
        state.become(Streaming(APPENDER))
    with pytest.raises(IllegalTransition, match="Closing cannot become Closing"):
        state.become(Closing(state.current))
    state.become(Closed())
    assert isinstance(state.phase, Closed) and state.current is state.phase


def test_a_failure_carries_what_must_still_be_read_or_released_and_the_first_one_sticks():
    streaming = state_in(Streaming(APPENDER))
    assert streaming.fail(STALE) is STALE
    assert isinstance(streaming.phase, Failed) and streaming.appender is APPENDER and streaming.copy is None
    later = FSError(errno.EIO)
    assert streaming.fail(later) is STALE and streaming.failure is STALE

    uploading = state_in(Uploading(COPY))
    uploading.fail(STALE)
    assert uploading.copy is COPY and uploading.appender is None


def test_a_clean_file_cannot_fail_it_has_nothing_to_lose():
    with pytest.raises(IllegalTransition):
        state_in(Clean()).fail(STALE)


def test_check_refuses_a_failed_or_closing_file():
    state_in(Staged(COPY, dirty=True)).check()
    with pytest.raises(FSError) as failed:
        state_in(Failed(STALE)).check()
    assert failed.value is STALE
    for phase in (Closing(Clean()), Closed()):
        with pytest.raises(FSError) as closing:
            state_in(phase).check()
        assert closing.value.errno == errno.EBADF


def test_a_closing_file_keeps_its_failure_and_a_closed_one_reports_it():
    state = state_in(Failed(STALE, COPY))
    state.become(Closing(state.phase))
    assert state.failure is STALE and state.copy is COPY
    state.become(Closed(state.failure))
    assert state.failure is STALE and state.copy is None and state.appender is None


def test_what_each_phase_holds():
    assert state_in(Clean()).copy is None and state_in(Clean()).appender is None
    assert state_in(Streaming(APPENDER)).appender is APPENDER
    for phase in (Staged(COPY, dirty=False), Uploading(COPY), Unlinked(COPY)):
        assert state_in(phase).copy is COPY
    assert state_in(Unlinked(COPY)).unlinked and not state_in(Staged(COPY, dirty=True)).unlinked


def test_metadata_set_on_an_open_file_is_unstored_until_an_upload_takes_it():
    changes = MetadataChanges()
    assert not changes.unstored
    changes.mtime_ns = 5
    assert changes.unstored
    changes.taken()
    assert not changes.unstored
    changes.mode_changed = True
    assert changes.unstored
    changes.taken()
    changes.mtime_ns = None  # a write made the time stale: nothing to store
    assert not changes.unstored
