"""The events that change a file's write state.

Each event is a fact about the file (bytes appended, a copy made, an upload
done). It builds the phase it leads to and the record after it; whether it
may happen in a phase, and where it leads, is the table's to say
(``TRANSITIONS`` in ``core/write_state.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidmount.core.errors import FSError
from rapidmount.core.staged import StagedFile
from rapidmount.core.write_phases import (Clean, Closing, Closed, Dirty, Failed, IllegalTransition, Phase, Staged,
                                          Streaming, Unlinked, Uploading, WriteRecord, appender_in, copy_in)
from rapidmount.storage.seam import ObjectAppender


class Event:
    """Something that happened to the file. The table says in which phase it
    may happen and to which phase it leads; the event builds that phase
    (:meth:`enter`) and its size and bases (:meth:`after`).

    Events are made and handed to ``become`` at once, never kept. They are
    not frozen: one is made per WRITE, and a frozen dataclass costs several
    times as much to make."""

    __slots__ = ()

    def enter(self, old: Phase) -> Phase:
        """The phase this event leads to from ``old`` (when it leaves it)."""
        raise IllegalTransition(f"{type(self).__name__} changes no phase")

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        """The record once this event happened, in ``phase``."""
        return now._replace(phase=phase)


def _copy(phase: Phase) -> StagedFile:
    copy = copy_in(phase)
    if copy is None:
        raise IllegalTransition(f"write state {type(phase).__name__} holds no staged file")
    return copy


@dataclass(slots=True, eq=False)
class StreamOpened(Event):
    """A stream into the object was made (create) or taken over; ``size``: the object's."""

    appender: ObjectAppender
    size: int

    def enter(self, old: Phase) -> Phase:
        return Streaming(self.appender)

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=self.size)


@dataclass(slots=True, eq=False)
class Appended(Event):
    """``length`` bytes appended at ``offset``."""

    offset: int
    length: int

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        # Not _replace: this runs for every append, and is much faster.
        return WriteRecord(phase, now.size + self.length, now.base_generation, now.base_size)


@dataclass(slots=True, eq=False)
class AppendUndone(Event):
    """The last append of ``length`` bytes never happened (it failed or was cancelled)."""

    length: int

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=now.size - self.length)


@dataclass(slots=True, eq=False)
class StreamClosed(Event):
    """The stream was closed with every byte in the object, of ``generation``."""

    generation: int

    def enter(self, old: Phase) -> Phase:
        return Clean()

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, base_generation=self.generation)


@dataclass(slots=True, eq=False)
class SizeSeen(Event):
    """The bucket was asked again: the object's size is ``size``."""

    size: int

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=self.size)


@dataclass(slots=True, eq=False)
class StagedAnew(Event):
    """A local copy of ``size`` bytes is the file now, to be uploaded."""

    copy: StagedFile
    size: int
    base_size: int | None  # see WriteRecord

    def enter(self, old: Phase) -> Phase:
        return Dirty(self.copy)

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=self.size, base_size=self.base_size)


@dataclass(slots=True, eq=False)
class StagedAsIs(StagedAnew):
    """A local copy of exactly what the bucket holds is the file now."""

    def enter(self, old: Phase) -> Phase:
        return Staged(self.copy)


@dataclass(slots=True, eq=False)
class CopyWritten(Event):
    """Bytes up to ``end`` were written into the copy."""

    end: int

    def enter(self, old: Phase) -> Phase:
        return Dirty(_copy(old))

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=max(now.size, self.end))


@dataclass(slots=True, eq=False)
class Resized(Event):
    """The file (its copy, if it has one) was truncated or extended to ``size``."""

    size: int

    def enter(self, old: Phase) -> Phase:
        return Dirty(_copy(old))

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, size=self.size)


@dataclass(slots=True, eq=False)
class UploadStarted(Event):
    """The copy's upload as a new generation begins."""

    def enter(self, old: Phase) -> Phase:
        return Uploading(_copy(old))


@dataclass(slots=True, eq=False)
class Uploaded(Event):
    """The bucket holds the copy as ``generation``; ``base_size`` as in WriteRecord."""

    generation: int
    base_size: int | None

    def enter(self, old: Phase) -> Phase:
        return Staged(_copy(old))

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, base_generation=self.generation, base_size=self.base_size)


@dataclass(slots=True, eq=False)
class UploadedKeepingStream(Uploaded):
    """Uploaded, and the stream that wrote it stays open: the file streams on."""

    appender: ObjectAppender

    def enter(self, old: Phase) -> Phase:
        return Streaming(self.appender)


@dataclass(slots=True, eq=False)
class UploadInterrupted(Event):
    """The upload failed for now or was cancelled: the copy still holds the changes."""

    def enter(self, old: Phase) -> Phase:
        return Dirty(_copy(old))


@dataclass(slots=True, eq=False)
class Failure(Event):
    """A failure that sticks: the file's changes can never be stored."""

    error: FSError

    def enter(self, old: Phase) -> Phase:
        return Failed(self.error, copy_in(old), appender_in(old))


@dataclass(slots=True, eq=False)
class NameRemoved(Event):
    """The file's name was removed (unlink, or a rename onto it)."""

    def enter(self, old: Phase) -> Phase:
        return Unlinked(_copy(old))


@dataclass(slots=True, eq=False)
class Moved(Event):
    """The file's object was renamed: it is ``generation`` (of ``size`` bytes)
    under the new name; a stream, which names the old object, was aborted."""

    generation: int
    base_size: int | None  # see WriteRecord
    size: int

    def enter(self, old: Phase) -> Phase:
        return Clean()

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        streamed = now.phase.of if isinstance(now.phase, Closing) else now.phase
        size = self.size if isinstance(streamed, Streaming) else now.size  # else the copy's or the same
        return now._replace(phase=phase, size=size, base_generation=self.generation, base_size=self.base_size)


@dataclass(slots=True, eq=False)
class Recreated(Event):
    """create(2) made the file anew as ``generation`` (0: not stored yet)."""

    generation: int

    def after(self, now: WriteRecord, phase: Phase) -> WriteRecord:
        return now._replace(phase=phase, base_generation=self.generation)


@dataclass(slots=True, eq=False)
class CloseStarted(Event):
    """The last writing handle was released (or a truncate(2) of a file no handle writes began)."""

    def enter(self, old: Phase) -> Phase:
        if isinstance(old, Closing):
            raise IllegalTransition("a closing file cannot start closing again")
        return Closing(old)


@dataclass(slots=True, eq=False)
class CloseEnded(Event):
    """The final upload or close is over, whatever happened."""

    def enter(self, old: Phase) -> Phase:
        if not isinstance(old, Closing):
            raise IllegalTransition(f"write state {type(old).__name__} is not closing")
        return Closed(old.of.error if isinstance(old.of, Failed) else None)
