"""The filesystem core: POSIX operations over one bucket, split by concern
(namespace, reads, writes), dispatched by :class:`Filesystem`."""

from rapidmount.core.errors import FSError
from rapidmount.core.filesystem import Filesystem

__all__ = ["FSError", "Filesystem"]
