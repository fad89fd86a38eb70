"""The write state of one file: one frozen record, changed only by events the table allows.

A file with pending writes is in exactly one phase, and each phase carries
the data only it has (the appender, the staged file, the failure)::

    Clean ──▶ Streaming(appender) ──▶ Clean            (rename; restaged: stream closed first)
      │            └──▶ Failed(errno)                  (an append, flush or close failed)
      ├──▶ Dirty(copy) ──▶ Uploading(copy) ──▶ Staged | Dirty | Streaming | Failed
      └──▶ Staged(copy) ──▶ Dirty                      (a write or truncation of a clean copy)
           Staged | Dirty ──▶ Unlinked(copy) ──▶ Failed
    any other phase ──▶ Closing(of, done) ──▶ Closed(failure)

Besides its phase, the record holds the file's size and what a staged upload
is conditional on (``base_generation``, ``base_size``). The record is
frozen: :meth:`WriteState.become` is the one way to change it, and it takes
an event. ``TRANSITIONS`` is the whole list of the changes allowed, keyed by
(phase, event): the phase the event leads to, and the guard that must hold
for it, if any. A step to the same phase changes only the size or the
bases, never the phase's data. An event the table does not hold for the
phase, or whose guard fails, is a bug in rapidmount, and raises
:class:`IllegalTransition`.

``Closing`` wraps the phase its final upload works from (``of``): while it
runs, that phase still moves as the table allows (a refused upload makes it
``Failed``), and whoever must come after it (an open, a truncate, a rename,
an unlink) waits for ``done``. But for the step into ``Closing`` (at once,
at the last release), the step into ``Closed``, an append that needs no wait
(``write_now``, when the lock is free) and a create's new base, the record
changes only under the state's lock, so an operation that waited for the
lock looks at the phase again.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass

from rapidmount.core.errors import FSError
from rapidmount.core.locks import QuickLock
from rapidmount.core.staged import StagedFile
from rapidmount.core.write_events import (AppendUndone, Appended, CloseEnded, CloseStarted, CopyWritten, Event,
                                          Failure, Moved, NameRemoved, Recreated, Resized, SizeSeen, StagedAnew,
                                          StagedAsIs, StreamClosed, StreamOpened, UploadInterrupted, Uploaded,
                                          UploadedKeepingStream, UploadStarted)
from rapidmount.core.write_phases import (Clean, Closable, Closed, Closing, Dirty, Failed, IllegalTransition, Phase,
                                          Staged, Streaming, Unlinked, Uploading, WriteRecord, appender_in, copy_in)
from rapidmount.storage.seam import ObjectAppender
from rapidmount.superblock.inodes import Inode

__all__ = [
    # the phases and the record (core/write_phases.py)
    "Clean", "Closable", "Closed", "Closing", "Dirty", "Failed", "IllegalTransition", "Phase", "Staged", "Streaming",
    "Unlinked", "Uploading", "WriteRecord",
    # the events (core/write_events.py)
    "AppendUndone", "Appended", "CloseEnded", "CloseStarted", "CopyWritten", "Event", "Failure", "Moved",
    "NameRemoved", "Recreated", "Resized", "SizeSeen", "StagedAnew", "StagedAsIs", "StreamClosed", "StreamOpened",
    "UploadInterrupted", "Uploaded", "UploadedKeepingStream", "UploadStarted",
    # the table and one file's state
    "CLOSING_EVENTS", "TRANSITIONS", "Guard", "MetadataChanges", "WriteState", "an_empty_file", "at_the_end",
    "refusal", "undoes_no_more_than_was_appended",
]


# -- the table ---------------------------------------------------------------------------------------

#: A condition on the record and the event, beyond the phase, for a change to be allowed.
Guard = Callable[[WriteRecord, Event], bool]


def at_the_end(now: WriteRecord, event: Event) -> bool:
    """An append goes where the file ends."""
    return isinstance(event, Appended) and event.offset == now.size


def undoes_no_more_than_was_appended(now: WriteRecord, event: Event) -> bool:
    """An undone append takes back bytes the file has."""
    return isinstance(event, AppendUndone) and 0 <= event.length <= now.size


def an_empty_file(now: WriteRecord, event: Event) -> bool:
    """Only an empty file's upload keeps its stream: its next write streams into it."""
    return now.size == 0


#: Every change allowed: (phase, event) → (the phase it leads to, its guard or None).
TRANSITIONS: dict[tuple[type, type[Event]], tuple[type, Guard | None]] = {
    (Clean, StreamOpened): (Streaming, None),  # create on a zonal bucket; a first write at an unfinalized object's end
    (Clean, SizeSeen): (Clean, None),  # the first write asked the bucket again
    (Clean, StagedAnew): (Dirty, None),  # any other first write, O_TRUNC, truncate; create elsewhere
    (Clean, StagedAsIs): (Staged, None),  # the name of an open file is removed
    (Clean, Moved): (Clean, None),  # its object was renamed
    (Clean, Recreated): (Clean, None),  # create(2) of the name of an inode that still had write state
    (Clean, CloseStarted): (Closing, None),

    (Streaming, Appended): (Streaming, at_the_end),
    (Streaming, AppendUndone): (Streaming, undoes_no_more_than_was_appended),
    (Streaming, StreamClosed): (Clean, None),  # restaged: a write elsewhere, O_TRUNC, truncate, unlink
    (Streaming, Moved): (Clean, None),  # the next write takes the moved object over
    (Streaming, Failure): (Failed, None),  # an append, flush or close failed (ESTALE: another writer)
    (Streaming, Recreated): (Streaming, None),
    (Streaming, CloseStarted): (Closing, None),

    (Staged, CopyWritten): (Dirty, None),
    (Staged, Resized): (Dirty, None),
    (Staged, NameRemoved): (Unlinked, None),  # unlink, or a rename onto it
    (Staged, Moved): (Staged, None),
    (Staged, Failure): (Failed, None),  # a write or truncation of the copy failed (ENOSPC, EIO)
    (Staged, Recreated): (Staged, None),
    (Staged, CloseStarted): (Closing, None),

    (Dirty, CopyWritten): (Dirty, None),
    (Dirty, Resized): (Dirty, None),
    (Dirty, UploadStarted): (Uploading, None),  # fsync, close, the last release, a truncate(2)
    (Dirty, NameRemoved): (Unlinked, None),
    (Dirty, Failure): (Failed, None),
    (Dirty, Recreated): (Dirty, None),
    (Dirty, CloseStarted): (Closing, None),

    (Uploading, Uploaded): (Staged, None),  # the bucket holds the copy
    (Uploading, UploadedKeepingStream): (Streaming, an_empty_file),  # a close uploaded an empty file
    (Uploading, UploadInterrupted): (Dirty, None),  # a transient failure or a cancellation
    (Uploading, Failure): (Failed, None),  # refused (ESTALE)
    (Uploading, Recreated): (Uploading, None),
    (Uploading, CloseStarted): (Closing, None),

    (Unlinked, CopyWritten): (Unlinked, None),
    (Unlinked, Resized): (Unlinked, None),
    (Unlinked, Moved): (Unlinked, None),
    (Unlinked, Failure): (Failed, None),
    (Unlinked, Recreated): (Unlinked, None),
    (Unlinked, CloseStarted): (Closing, None),

    (Failed, Resized): (Failed, None),  # O_TRUNC of a failed file: nothing is uploaded
    (Failed, AppendUndone): (Failed, undoes_no_more_than_was_appended),  # the append that failed it
    (Failed, Recreated): (Failed, None),
    (Failed, CloseStarted): (Closing, None),

    (Closing, CloseEnded): (Closed, None),  # the final upload is over, whatever happened
}

#: Events that change a closing file itself; every other one changes the phase it closes.
CLOSING_EVENTS = (CloseStarted, CloseEnded)


def refusal(phase: Phase, event: Event, now: WriteRecord) -> str | None:
    """Why the table refuses ``event`` in ``phase``; None if it allows it."""
    rule = TRANSITIONS.get((type(phase), type(event)))
    if rule is None:
        return f"write state {type(phase).__name__} does not take {type(event).__name__}"
    _, guard = rule
    if guard is not None and not guard(now, event):
        return f"write state {type(phase).__name__} refuses {event!r}: not {guard.__name__}"
    return None


# -- one file's state --------------------------------------------------------------------------------


@dataclass(eq=False)
class MetadataChanges:
    """A time or mode set on the open file (utime, chmod with --preserve-mode),
    stored with its next upload, or after its last close."""

    mtime_ns: int | None = None  # the time set, until a write makes it stale
    uploaded_mtime_ns: int | None = None  # the time the last upload or store carried
    mode_changed: bool = False  # chmod since the last upload or store

    def taken(self) -> None:
        """An upload or a store is carrying what is set now."""
        self.uploaded_mtime_ns, self.mode_changed = self.mtime_ns, False

    @property
    def unstored(self) -> bool:
        return self.mode_changed or self.mtime_ns not in (None, self.uploaded_mtime_ns)


class WriteState:
    """The pending changes of one file, shared by its writing handles."""

    def __init__(self, inode: Inode, *, size: int, base_generation: int) -> None:
        self.inode = inode
        self.handles = 0  # writing handles open
        self.metadata = MetadataChanges()
        #: One change of the file at a time (taken at once when free: every WRITE takes it).
        self.lock = QuickLock()
        self._now = WriteRecord(Clean(), size, base_generation)

    def __repr__(self) -> str:
        return f"WriteState({self.inode.path!r}, {self._now!r})"

    @property
    def record(self) -> WriteRecord:
        return self._now

    @property
    def phase(self) -> Phase:
        return self._now.phase

    @property
    def size(self) -> int:
        return self._now.size

    @property
    def base_generation(self) -> int:
        return self._now.base_generation

    @property
    def base_size(self) -> int | None:
        return self._now.base_size

    @property
    def current(self) -> Closable:
        """The phase the file's bytes are in, seen through ``Closing``."""
        phase = self._now.phase
        return phase.of if isinstance(phase, Closing) else phase

    def _source(self, event: Event) -> Phase:
        """The phase ``event`` applies to: while closing, the phase being closed."""
        phase = self._now.phase
        if isinstance(phase, Closing) and not isinstance(event, CLOSING_EVENTS):
            return phase.of
        return phase

    def allows(self, event: Event) -> bool:
        """Whether the table allows ``event`` now (nothing changes)."""
        return refusal(self._source(event), event, self._now) is None

    def become(self, event: Event) -> None:
        """The one way to change the record: ``event`` as the table allows it.
        While closing, a change of the phase being closed keeps it closing."""
        now, source = self._now, self._source(event)
        rule = TRANSITIONS.get((type(source), type(event)))
        if rule is None or rule[1] is not None and not rule[1](now, event):
            raise IllegalTransition(refusal(source, event, now))
        target = rule[0]
        phase = source if target is type(source) else event.enter(source)
        if type(phase) is not target:
            raise IllegalTransition(f"{type(event).__name__} made {type(phase).__name__}, not {target.__name__}")
        if source is not now.phase:
            assert isinstance(now.phase, Closing) and not isinstance(phase, Closing)  # see _source
            phase = Closing(phase, now.phase.done)
        self._now = event.after(now, phase)

    def fail(self, error: FSError) -> FSError:
        """Make the failure stick (the first one, if it already failed); returns it."""
        current = self.current
        if isinstance(current, Failed):
            return current.error
        self.become(Failure(error))
        return error

    @property
    def copy(self) -> StagedFile | None:
        return copy_in(self.current)

    @property
    def appender(self) -> ObjectAppender | None:
        return appender_in(self.current)

    @property
    def failure(self) -> FSError | None:
        phase = self._now.phase
        if isinstance(phase, Closed):
            return phase.failure
        current = self.current
        return current.error if isinstance(current, Failed) else None

    @property
    def unlinked(self) -> bool:
        return isinstance(self.current, Unlinked)

    @property
    def closing(self) -> bool:
        return isinstance(self._now.phase, (Closing, Closed))

    def check(self) -> None:
        """Before a write or truncate through a handle: the sticky failure, or EBADF once closing."""
        failure = self.failure
        if failure is not None:
            raise failure
        if self.closing:
            raise FSError(errno.EBADF)
