"""The write state of one file: one value, changed only through one table.

A file with pending writes is in exactly one phase, and each phase carries
the data only it has (the appender, the staged file, the failure)::

    Clean ──▶ Streaming(appender) ──▶ Clean          (rename; restaged: stream closed first)
      │            └──▶ Failed(errno)                (an append, flush or close failed)
      └──▶ Staged(copy, dirty) ──▶ Uploading(copy) ──▶ Staged | Streaming | Failed
              │  └──▶ Unlinked(copy) ──▶ Failed
              └──▶ Failed                            (a write to the copy failed)
    any other phase ──▶ Closing(of, done) ──▶ Closed(failure)

``TRANSITIONS`` is the whole list. ``Closing`` wraps the phase its final
upload works from (``of``): while it runs, that phase still moves as the
table allows (a refused upload makes it ``Failed``), and whoever must come
after it (an open, a truncate, a rename, an unlink) waits for ``done``.
Every change goes through :meth:`WriteState.become`, which refuses a change
the table does not hold: that is a bug in rapidmount, and raises
:class:`IllegalTransition`.

But for the step into ``Closing`` (at once, at the last release) and the
step into ``Closed``, the phase changes only under the state's lock, so an
operation that waited for the lock looks at the phase again.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from typing import Union

import trio

from rapidmount.core.errors import FSError
from rapidmount.core.locks import QuickLock
from rapidmount.core.staged import StagedFile
from rapidmount.storage.seam import ObjectAppender
from rapidmount.superblock.inodes import Inode


class IllegalTransition(RuntimeError):
    """A change of write state the table does not allow: a bug, never a user's error."""


@dataclass(frozen=True, eq=False)
class Clean:
    """Open for writing, nothing changed yet: the first write picks the phase."""


@dataclass(frozen=True, eq=False)
class Streaming:
    """Appends go to the object itself, over one stream."""

    appender: ObjectAppender


@dataclass(frozen=True, eq=False)
class Staged:
    """A local copy is the file."""

    copy: StagedFile
    dirty: bool  # the copy holds changes the bucket does not


@dataclass(frozen=True, eq=False)
class Uploading:
    """The copy is being uploaded as a new generation (under the state's lock)."""

    copy: StagedFile


@dataclass(frozen=True, eq=False)
class Unlinked:
    """The name was removed while the file was open: the copy serves reads
    and writes, and nothing is uploaded any more."""

    copy: StagedFile


@dataclass(frozen=True, eq=False)
class Failed:
    """Sticky: every later write, fsync and close returns ``error``."""

    error: FSError
    copy: StagedFile | None = None  # reads still come from it
    appender: ObjectAppender | None = None  # aborted at the last release


@dataclass(frozen=True, eq=False)
class Closing:
    """The last handle was released: the final upload or close runs from ``of``."""

    of: Closable
    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, eq=False)
class Closed:
    """Over. ``failure``: the file ended refused (its last upload, or earlier)."""

    failure: FSError | None = None


Phase = Union[Clean, Streaming, Staged, Uploading, Unlinked, Failed, Closing, Closed]
#: What a Closing can wrap: never another Closing.
Closable = Union[Clean, Streaming, Staged, Uploading, Unlinked, Failed, Closed]

#: Every change of phase allowed: from a phase, the phases it may become.
TRANSITIONS: dict[type, frozenset[type]] = {
    Clean: frozenset({Streaming, Staged, Closing}),
    Streaming: frozenset({Clean, Failed, Closing}),
    Staged: frozenset({Staged, Uploading, Unlinked, Failed, Closing}),
    Uploading: frozenset({Staged, Streaming, Failed, Closing}),
    Unlinked: frozenset({Failed, Closing}),
    Failed: frozenset({Closing}),
    Closing: frozenset({Closed}),
    Closed: frozenset(),
}


def check_transition(old: Phase, new: Phase) -> None:
    if type(new) not in TRANSITIONS[type(old)]:
        raise IllegalTransition(f"write state {type(old).__name__} cannot become {type(new).__name__}")


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


@dataclass(eq=False)
class WriteState:
    """The pending changes of one file, shared by its writing handles."""

    inode: Inode
    size: int
    base_generation: int  # precondition of a staged upload (0: must not exist)
    base_size: int | None = None  # size of the unfinalized object the staged copy was made from
    handles: int = 0
    metadata: MetadataChanges = field(default_factory=MetadataChanges)
    #: One change of the file at a time (taken at once when free: every WRITE takes it).
    lock: QuickLock = field(default_factory=QuickLock)
    _phase: Phase = field(default_factory=Clean, init=False, repr=False)

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def current(self) -> Closable:
        """The phase the file's bytes are in, seen through ``Closing``."""
        phase = self._phase
        return phase.of if isinstance(phase, Closing) else phase

    def become(self, new: Phase) -> None:
        """The one way to change phase. While closing, a change of the
        phase being closed keeps it closing."""
        old = self._phase
        if isinstance(old, Closing) and not isinstance(new, (Closing, Closed)):
            check_transition(old.of, new)
            self._phase = Closing(new, old.done)
        else:
            check_transition(old, new)
            self._phase = new

    def fail(self, error: FSError) -> FSError:
        """Make the failure stick (the first one, if it already failed); returns it."""
        current = self.current
        if isinstance(current, Failed):
            return current.error
        self.become(Failed(error, self.copy, self.appender))
        return error

    @property
    def copy(self) -> StagedFile | None:
        current = self.current
        return None if isinstance(current, (Clean, Streaming, Closed)) else current.copy

    @property
    def appender(self) -> ObjectAppender | None:
        current = self.current
        return current.appender if isinstance(current, (Streaming, Failed)) else None

    @property
    def failure(self) -> FSError | None:
        phase = self._phase
        if isinstance(phase, Closed):
            return phase.failure
        current = self.current
        return current.error if isinstance(current, Failed) else None

    @property
    def unlinked(self) -> bool:
        return isinstance(self.current, Unlinked)

    @property
    def closing(self) -> bool:
        return isinstance(self._phase, (Closing, Closed))

    def check(self) -> None:
        """Before a write or truncate through a handle: the sticky failure, or EBADF once closing."""
        failure = self.failure
        if failure is not None:
            raise failure
        if self.closing:
            raise FSError(errno.EBADF)
