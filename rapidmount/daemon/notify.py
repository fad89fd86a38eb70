"""systemd's readiness protocol (sd_notify), without libsystemd.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET``; the daemon sends
``READY=1`` once the mount answers and ``STOPPING=1`` when it starts to
unmount. Outside systemd this does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("rapidmount")


def notify(message: str) -> bool:
    """Send one state line to the service manager; False if there is none."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # an abstract socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(message.encode())
    except OSError as err:
        log.warning("cannot notify the service manager at %s: %s", address, err.strerror)
        return False
    return True
