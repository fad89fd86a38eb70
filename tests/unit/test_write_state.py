"""Unit tests for the write state machine (rapidmount.core.write_state): one
record per file, changed only by events the table allows, guards included."""

from __future__ import annotations

import errno
import itertools

import pytest

from rapidmount.core.errors import FSError
from rapidmount.core.write_state import (
    TRANSITIONS, Appended, AppendUndone, Clean, CloseEnded, Closed, CloseStarted, Closing, CopyWritten, Dirty, Failed,
    Failure, IllegalTransition, MetadataChanges, Moved, NameRemoved, Recreated, Resized, SizeSeen, Staged, StagedAnew,
    StagedAsIs, StreamClosed, StreamOpened, Streaming, Unlinked, UploadInterrupted, Uploaded, UploadedKeepingStream,
    UploadStarted, Uploading, WriteRecord, WriteState, an_empty_file, at_the_end, undoes_no_more_than_was_appended)
from rapidmount.superblock.inodes import Inode
from rapidmount.superblock.names import EntryKind

COPY, APPENDER, OTHER_COPY, OTHER_APPENDER = object(), object(), object(), object()  # stand-ins: carried only
STALE = FSError(errno.ESTALE)
SIZE, BASE = 100, 7


def sample(kind: type):
    """One phase of each kind, with its data."""
    return {
        Clean: lambda: Clean(),
        Streaming: lambda: Streaming(APPENDER),
        Staged: lambda: Staged(COPY),
        Dirty: lambda: Dirty(COPY),
        Uploading: lambda: Uploading(COPY),
        Unlinked: lambda: Unlinked(COPY),
        Failed: lambda: Failed(STALE, COPY),
        Closing: lambda: Closing(Dirty(COPY)),
        Closed: lambda: Closed(),
    }[kind]()


def event(kind: type):
    """One event of each kind that every guard allows in a file of SIZE bytes."""
    return {
        StreamOpened: lambda: StreamOpened(OTHER_APPENDER, 5),
        Appended: lambda: Appended(SIZE, 10),
        AppendUndone: lambda: AppendUndone(10),
        StreamClosed: lambda: StreamClosed(8),
        SizeSeen: lambda: SizeSeen(120),
        StagedAnew: lambda: StagedAnew(OTHER_COPY, 50, 40),
        StagedAsIs: lambda: StagedAsIs(OTHER_COPY, 50, 40),
        CopyWritten: lambda: CopyWritten(150),
        Resized: lambda: Resized(30),
        UploadStarted: lambda: UploadStarted(),
        Uploaded: lambda: Uploaded(9, 60),
        UploadedKeepingStream: lambda: UploadedKeepingStream(9, 0, OTHER_APPENDER),
        UploadInterrupted: lambda: UploadInterrupted(),
        Failure: lambda: Failure(FSError(errno.EIO)),
        NameRemoved: lambda: NameRemoved(),
        Moved: lambda: Moved(11, 70, 70),
        Recreated: lambda: Recreated(0),
        CloseStarted: lambda: CloseStarted(),
        CloseEnded: lambda: CloseEnded(),
    }[kind]()


PHASES = [Clean, Streaming, Staged, Dirty, Uploading, Unlinked, Failed, Closing, Closed]
EVENTS = [StreamOpened, Appended, AppendUndone, StreamClosed, SizeSeen, StagedAnew, StagedAsIs, CopyWritten, Resized,
          UploadStarted, Uploaded, UploadedKeepingStream, UploadInterrupted, Failure, NameRemoved, Moved, Recreated,
          CloseStarted, CloseEnded]


def state_in(phase, size: int = SIZE) -> WriteState:
    state = WriteState(Inode(2, 1, "f", EntryKind.FILE, "f"), size=size, base_generation=BASE)
    state._now = WriteRecord(phase, size, BASE)  # placed there directly: what is tested is the next change
    return state


def test_the_table_names_every_phase_and_event_and_nothing_else():
    assert {phase for phase, _ in TRANSITIONS} == set(PHASES) - {Closed}
    assert {kind for _, kind in TRANSITIONS} == set(EVENTS)
    assert {target for target, _ in TRANSITIONS.values()} <= set(PHASES)


@pytest.mark.parametrize("old,kind", list(itertools.product(PHASES, EVENTS)),
                         ids=lambda kind: kind.__name__)
def test_an_event_changes_the_record_if_and_only_if_the_table_allows_it(old, kind):
    """Each allowed transition leads where the table says; any other is refused and changes nothing."""
    state = state_in(sample(old), size=0 if kind is UploadedKeepingStream else SIZE)
    before, happened = state.record, event(kind)
    # While closing, a change of the phase being closed is looked up as that phase's.
    inner = old is Closing and kind not in (CloseStarted, CloseEnded)
    source = type(before.phase.of) if inner else old
    rule = TRANSITIONS.get((source, kind))
    if rule is None:
        with pytest.raises(IllegalTransition, match=f"{source.__name__} does not take {kind.__name__}"):
            state.become(happened)
        assert state.record is before, "a refused change changes nothing"
        return
    state.become(happened)
    target, _ = rule
    phase = state.phase.of if inner else state.phase
    assert type(phase) is target
    if inner:
        assert isinstance(state.phase, Closing) and state.phase.done is before.phase.done
    if target is source:
        assert phase is (before.phase.of if inner else before.phase), "a step within a phase keeps its data"


def test_every_phase_can_end_and_closed_is_final():
    """From every phase some path leads to Closed; nothing leaves Closed."""
    assert not [key for key in TRANSITIONS if key[0] is Closed]
    for kind in PHASES:
        seen, frontier = {kind}, [kind]
        while frontier:
            source = frontier.pop()
            for (phase, _), (target, _) in TRANSITIONS.items():
                if phase is source and target not in seen:
                    seen.add(target)
                    frontier.append(target)
        assert Closed in seen or kind is Closed, f"{kind.__name__} can never end"


# -- what each transition does --------------------------------------------------------------------


def test_a_stream_opens_at_the_objects_size_and_appends_grow_it():
    state = state_in(Clean(), size=0)
    state.become(StreamOpened(APPENDER, 40))
    assert state.phase.appender is APPENDER and state.size == 40 and state.appender is APPENDER
    state.become(Appended(40, 10))
    assert state.size == 50
    state.become(AppendUndone(10))
    assert state.size == 40


def test_closing_the_stream_leaves_a_clean_file_based_on_its_generation():
    state = state_in(Streaming(APPENDER))
    state.become(StreamClosed(12))
    assert isinstance(state.phase, Clean) and state.base_generation == 12 and state.size == SIZE


def test_a_new_copy_is_dirty_and_a_copy_of_the_bucket_is_clean():
    for event_kind, phase_kind in ((StagedAnew, Dirty), (StagedAsIs, Staged)):
        state = state_in(Clean())
        state.become(event_kind(COPY, 30, 25))
        assert type(state.phase) is phase_kind and state.copy is COPY
        assert (state.size, state.base_size, state.base_generation) == (30, 25, BASE)


def test_a_write_or_resize_makes_a_clean_copy_dirty_and_keeps_the_others_phase():
    for kind in (Staged, Dirty, Unlinked):
        written = state_in(sample(kind))
        written.become(CopyWritten(SIZE - 50))
        assert written.size == SIZE, "a write inside the file keeps its size"
        written.become(CopyWritten(SIZE + 50))
        assert written.size == SIZE + 50 and written.copy is COPY
        assert isinstance(written.phase, Unlinked if kind is Unlinked else Dirty)
        resized = state_in(sample(kind))
        resized.become(Resized(3))
        assert resized.size == 3 and isinstance(resized.phase, Unlinked if kind is Unlinked else Dirty)
    failed = state_in(Failed(STALE))
    failed.become(Resized(0))
    assert failed.size == 0 and failed.failure is STALE


def test_an_upload_ends_clean_on_its_generation_or_dirty_again():
    state = state_in(Dirty(COPY))
    state.become(UploadStarted())
    assert isinstance(state.phase, Uploading) and state.copy is COPY
    state.become(UploadInterrupted())
    assert isinstance(state.phase, Dirty) and state.copy is COPY and state.base_generation == BASE
    state.become(UploadStarted())
    state.become(Uploaded(20, SIZE))
    assert isinstance(state.phase, Staged) and (state.base_generation, state.base_size) == (20, SIZE)


def test_an_empty_files_upload_may_keep_its_stream():
    state = state_in(Uploading(COPY), size=0)
    state.become(UploadedKeepingStream(21, 0, APPENDER))
    assert isinstance(state.phase, Streaming) and state.appender is APPENDER and state.base_generation == 21


def test_a_move_rebases_the_file_and_a_stream_starts_over_clean_at_the_moved_size():
    streaming = state_in(Streaming(APPENDER))
    streaming.become(Moved(30, 80, 80))
    assert isinstance(streaming.phase, Clean) and streaming.size == 80
    assert (streaming.base_generation, streaming.base_size) == (30, 80)
    staged = state_in(Staged(COPY))
    staged.become(Moved(30, None, 80))
    assert isinstance(staged.phase, Staged) and staged.size == SIZE
    assert (staged.base_generation, staged.base_size) == (30, None)


def test_a_removed_name_keeps_the_copy_for_reads_and_writes():
    for kind in (Staged, Dirty):
        state = state_in(sample(kind))
        state.become(NameRemoved())
        assert state.unlinked and state.copy is COPY


def test_a_recreated_file_must_find_no_object_but_its_own():
    state = state_in(Dirty(COPY))
    state.become(Recreated(0))
    assert state.base_generation == 0 and isinstance(state.phase, Dirty)


# -- guards ------------------------------------------------------------------------------------------


def test_an_append_must_go_where_the_file_ends():
    state = state_in(Streaming(APPENDER))
    assert state.allows(Appended(SIZE, 1)) and not state.allows(Appended(SIZE - 1, 1))
    with pytest.raises(IllegalTransition, match=at_the_end.__name__):
        state.become(Appended(SIZE + 1, 1))
    assert state.size == SIZE


def test_an_undone_append_cannot_take_back_more_than_the_file_has():
    for phase in (Streaming(APPENDER), Failed(STALE, appender=APPENDER)):
        state = state_in(phase, size=5)
        with pytest.raises(IllegalTransition, match=undoes_no_more_than_was_appended.__name__):
            state.become(AppendUndone(6))
        assert state.size == 5
        state.become(AppendUndone(5))
        assert state.size == 0


def test_only_an_empty_files_upload_keeps_its_stream():
    state = state_in(Uploading(COPY), size=1)
    with pytest.raises(IllegalTransition, match=an_empty_file.__name__):
        state.become(UploadedKeepingStream(21, 1, APPENDER))
    assert isinstance(state.phase, Uploading)


def test_every_guard_is_tried():
    guards = {guard for _, guard in TRANSITIONS.values() if guard is not None}
    assert guards == {at_the_end, undoes_no_more_than_was_appended, an_empty_file}


# -- closing --------------------------------------------------------------------------------------


def test_while_closing_the_closed_phase_still_moves_only_as_the_table_allows():
    state = state_in(Clean())
    state.become(CloseStarted())
    done = state.phase.done
    state.become(StagedAnew(COPY, 0, None))  # a truncate(2) stages inside its closing
    assert isinstance(state.phase, Closing) and isinstance(state.current, Dirty) and state.phase.done is done
    with pytest.raises(IllegalTransition, match="Dirty does not take StreamOpened"):
        state.become(StreamOpened(APPENDER, 0))
    with pytest.raises(IllegalTransition, match="Closing does not take CloseStarted"):
        state.become(CloseStarted())
    state.become(CloseEnded())
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
    state_in(Dirty(COPY)).check()
    with pytest.raises(FSError) as failed:
        state_in(Failed(STALE)).check()
    assert failed.value is STALE
    for phase in (Closing(Clean()), Closed()):
        with pytest.raises(FSError) as closing:
            state_in(phase).check()
        assert closing.value.errno == errno.EBADF


def test_a_closing_file_keeps_its_failure_and_a_closed_one_reports_it():
    state = state_in(Failed(STALE, COPY))
    state.become(CloseStarted())
    assert state.failure is STALE and state.copy is COPY
    state.become(CloseEnded())
    assert state.failure is STALE and state.copy is None and state.appender is None


def test_what_each_phase_holds():
    assert state_in(Clean()).copy is None and state_in(Clean()).appender is None
    assert state_in(Streaming(APPENDER)).appender is APPENDER
    for phase in (Staged(COPY), Dirty(COPY), Uploading(COPY), Unlinked(COPY)):
        assert state_in(phase).copy is COPY
    assert state_in(Unlinked(COPY)).unlinked and not state_in(Dirty(COPY)).unlinked


def test_the_record_is_frozen_and_only_become_replaces_it():
    state = state_in(Dirty(COPY))
    with pytest.raises(AttributeError):
        state.record.size = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        state.size = 1  # type: ignore[misc]
    before = state.record
    state.become(Resized(1))
    assert state.record is not before and before.size == SIZE and state.size == 1


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
