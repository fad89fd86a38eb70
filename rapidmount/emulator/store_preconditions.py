"""GCS generation and metageneration preconditions, checked against records."""

from __future__ import annotations

from dataclasses import dataclass

from .store_errors import FailedPrecondition
from .store_records import FolderRecord, ObjectRecord


@dataclass(frozen=True)
class Preconditions:
    """GCS generation/metageneration conditions; None means "not set"."""

    if_generation_match: int | None = None
    if_generation_not_match: int | None = None
    if_metageneration_match: int | None = None
    if_metageneration_not_match: int | None = None

    def check(self, record: ObjectRecord | None) -> None:
        generation = record.generation if record else 0
        if self.if_generation_match is not None and generation != self.if_generation_match:
            raise FailedPrecondition(
                f"if_generation_match={self.if_generation_match} but the live generation is "
                f"{generation or 'absent'}")
        if self.if_generation_not_match is not None and generation == self.if_generation_not_match:
            raise FailedPrecondition(f"if_generation_not_match={self.if_generation_not_match} matched")
        metageneration = record.metageneration if record else None
        if self.if_metageneration_match is not None and metageneration != self.if_metageneration_match:
            raise FailedPrecondition(
                f"if_metageneration_match={self.if_metageneration_match} but the metageneration is "
                f"{metageneration if metageneration is not None else 'absent'}")
        if self.if_metageneration_not_match is not None and (
                metageneration is None or metageneration == self.if_metageneration_not_match):
            raise FailedPrecondition(
                f"if_metageneration_not_match={self.if_metageneration_not_match} failed")

    def check_folder(self, folder: FolderRecord) -> None:
        """Folders have metagenerations only; generation conditions do not apply."""
        if (self.if_metageneration_match is not None
                and folder.metageneration != self.if_metageneration_match):
            raise FailedPrecondition(
                f"if_metageneration_match={self.if_metageneration_match} but the folder's "
                f"metageneration is {folder.metageneration}")
        if (self.if_metageneration_not_match is not None
                and folder.metageneration == self.if_metageneration_not_match):
            raise FailedPrecondition(
                f"if_metageneration_not_match={self.if_metageneration_not_match} matched")


NO_PRECONDITIONS = Preconditions()
