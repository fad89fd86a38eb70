"""Kernel-wide limits the daemon may need raised (``/proc/sys``)."""

from __future__ import annotations

import logging

log = logging.getLogger("rapidmount")


def raise_limit(knob: str, wanted: int, purpose: str) -> tuple[int | None, OSError | None]:
    """The limit in ``knob``, raised to ``wanted`` when lower (root only;
    one info line says so, and ``purpose``); never lowered. Returns the
    limit now and why it could not be raised; ``(None, None)`` where the
    kernel has no such knob."""
    try:
        with open(knob) as file:
            limit = int(file.read())
    except (OSError, ValueError):
        return None, None
    if limit >= wanted:
        return limit, None
    try:
        with open(knob, "w") as file:
            file.write(f"{wanted}\n")
    except OSError as err:
        return limit, err
    name = knob.removeprefix("/proc/sys/").replace("/", ".")
    log.info("raised %s from %d to %d %s", name, limit, wanted, purpose)
    return wanted, None
