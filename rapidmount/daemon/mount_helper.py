"""``mount.rapidmount``: the helper mount(8) runs for ``-t rapidmount``.

mount(8) calls ``mount.rapidmount BUCKET MOUNTPOINT [-sfnv] [-o OPTIONS]``, so
an fstab line works::

    mybucket  /mnt/data  rapidmount  rw,_netdev,allow_other,uid=1000,file_mode=0644  0 0

Here user 1000 owns the files and every other user may only read them: with
``allow_other`` the kernel checks modes, owner and group (``gid=...,
file_mode=0660`` shares writes with a group).

Options that only mean something to mount(8) or systemd are dropped; every
other option goes to rapidmount's ``-o`` (``ro``, ``allow_other``, and any
flag as ``name=value``).
"""

from __future__ import annotations

import sys

from rapidmount.daemon import cli

# Understood by mount(8), fstab or systemd, not by rapidmount.
_MOUNT_ONLY = {"_netdev", "defaults", "auto", "noauto", "nofail", "user", "users", "nouser", "owner",
               "group", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "sync", "async", "atime",
               "noatime", "relatime", "norelatime", "strictatime", "diratime", "nodiratime", "loud", "silent"}


def translate(argv: list[str]) -> list[str]:
    """mount(8)'s arguments → rapidmount's (raises SystemExit with a usage line)."""
    positional: list[str] = []
    options: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "-o":
            options.extend(next(args, "").split(","))
        elif arg.startswith("-o") and len(arg) > 2:
            options.extend(arg[2:].split(","))
        elif arg in ("-s", "-f", "-n", "-v"):
            continue  # sloppy, fake, no-mtab, verbose: nothing to do for a FUSE daemon
        elif arg.startswith("-"):
            raise SystemExit(f"mount.rapidmount: unknown argument {arg!r}")
        else:
            positional.append(arg)
    if len(positional) != 2:
        raise SystemExit("usage: mount.rapidmount BUCKET MOUNTPOINT [-o OPTIONS]")
    kept = [o for o in (option.strip() for option in options)
            if o and o not in _MOUNT_ONLY and not o.startswith(("x-", "comment="))]
    return (["-o", ",".join(kept)] if kept else []) + positional


def main(argv: list[str] | None = None) -> int:
    return cli.main(translate(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
