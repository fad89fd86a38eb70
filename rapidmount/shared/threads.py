"""Threads named for the kernel too, so per-thread CPU (``/proc/PID/task``,
``top -H``) says which is which."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Callable

_PR_SET_NAME = 15
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def start_named(target: Callable[[], None], name: str) -> threading.Thread:
    """Start a daemon thread running ``target``, named ``name`` (at most 15
    bytes reach the kernel)."""
    def run() -> None:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
