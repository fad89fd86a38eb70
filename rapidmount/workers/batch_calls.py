"""A worker's side of scan-ahead's batches: small objects read whole or
through a composed object (:mod:`~rapidmount.workers.scan_batches`), each
written into its arena region.
"""

from __future__ import annotations

import errno

from rapidmount.storage.errors import StorageError
from rapidmount.workers import scan_batches as batches
from rapidmount.workers.state import WorkerState


class BatchCalls(WorkerState):
    """The ``whole`` and ``composed`` calls."""

    async def op_whole(self, items: list[tuple[str, int, int]], concurrency: int,
                       targets: list[int | None]) -> list[object]:
        answers = await batches.read_objects_whole(
            self.client, items, zonal=self.layout.bidi_reads, concurrency=concurrency, retry=self.retry,
            stall_timeout=self.settings.stall_timeout, on_event=self._on_read_event)
        return self._land(answers, [length for _, _, length in items], targets)

    async def op_composed(self, items: list[tuple[str, int, int, int | None]], concurrency: int,
                          temporary_names: list[str], targets: list[int | None]) -> list[object]:
        names = iter(temporary_names)
        answers = await batches.read_objects_composed(
            self.client, items, concurrency=concurrency, retry=self.retry, temporary_name=lambda: next(names),
            stall_timeout=self.settings.stall_timeout, on_event=self._on_read_event)
        return self._land(answers, [size for _, _, size, _ in items], targets)

    def _land(self, answers: list[bytes | memoryview | StorageError], lengths: list[int],
              targets: list[int | None]) -> list[object]:
        """A batch's answers for the FUSE process: each item's bytes written into
        its arena region (``targets``, of its length) and counted; in the answer
        when it has no region; a failure as it is."""
        landed: list[object] = []
        for answer, length, target in zip(answers, lengths, targets):
            if isinstance(answer, StorageError):
                landed.append(answer)
            elif len(answer) > length:  # never past its region
                landed.append(StorageError(f"a batch read got {len(answer)} bytes for {length}", errno_=errno.EIO))
            elif target is None:
                landed.append(bytes(answer))
            else:
                landed.append(self.arena.write(target, answer))
        return landed
