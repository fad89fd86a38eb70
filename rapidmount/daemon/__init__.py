"""The FUSE process's top (trio): the command line, the settings, and one mount's run.

``cli`` parses the command and daemonizes; ``config`` and ``profiles`` turn
flags, the TOML file and ``-o`` options into one ``MountConfig``; ``serve``
runs the mount (the request loop, the workers, the caches) until a signal.
``mount_helper`` is ``mount.rapidmount`` for fstab; ``demo`` is ``make run``.
"""
