"""Where a read's bytes may also go in the kernel: the FUSE layer's side of
the storage seam's opaque :class:`~rapidmount.storage.seam.Answer`.

The core and the seam pass an answer along without looking inside; the
data-plane store, which hands the bytes to a worker holding ``/dev/fuse``,
asks :func:`spec_of` what to write, and the worker writes the reply.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidmount.storage.seam import Answer


@dataclass(slots=True)
class ReadAnswer:
    """READ ``unique`` of the kernel's, answered by the bytes ``[skip, skip +
    length)`` of one read (``length`` None: all of them from ``skip``); ``sent``
    once the kernel took that reply."""

    unique: int
    skip: int = 0
    length: int | None = None
    sent: bool = False


def spec_of(answer: Answer | None) -> tuple[int, int, int | None] | None:
    """``(unique, skip, length)`` of a READ's answer, as a worker's call carries
    it; None for anything that is no READ of the kernel's."""
    if isinstance(answer, ReadAnswer):
        return answer.unique, answer.skip, answer.length
    return None
