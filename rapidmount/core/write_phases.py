"""The phases of a file's write state, and the record that holds its phase.

Each phase carries the data only it has (the appender, the staged file, the
failure), so no flag can contradict it. :class:`WriteRecord` adds what the
phases share: the file's size and what a staged upload is conditional on.
Both are frozen; ``core/write_state.py`` says how one becomes another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Union

import trio

from rapidmount.core.errors import FSError
from rapidmount.core.staged import StagedFile
from rapidmount.storage.seam import ObjectAppender


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
    """A local copy is the file, and the bucket holds the same bytes."""

    copy: StagedFile


@dataclass(frozen=True, eq=False)
class Dirty:
    """A local copy is the file, with changes the bucket does not hold yet."""

    copy: StagedFile


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


Phase = Union[Clean, Streaming, Staged, Dirty, Uploading, Unlinked, Failed, Closing, Closed]
#: What a Closing can wrap: never another Closing.
Closable = Union[Clean, Streaming, Staged, Dirty, Uploading, Unlinked, Failed, Closed]
#: The phases whose local copy is the file.
WITH_COPY = (Staged, Dirty, Uploading, Unlinked)


def copy_in(phase: Phase) -> StagedFile | None:
    """The staged file the phase holds, if any."""
    return phase.copy if isinstance(phase, (*WITH_COPY, Failed)) else None


def appender_in(phase: Phase) -> ObjectAppender | None:
    """The stream the phase holds, if any."""
    return phase.appender if isinstance(phase, (Streaming, Failed)) else None


class WriteRecord(NamedTuple):
    """All that the table governs: replaced whole by each change, never changed
    in place. (A named tuple: one is made per WRITE, at a fraction of a frozen
    dataclass's cost.)"""

    phase: Phase
    size: int  # the file's size as its writes made it
    base_generation: int  # precondition of a staged upload (0: must not exist)
    base_size: int | None = None  # size of the unfinalized object the staged copy was made from
