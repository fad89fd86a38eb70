"""The FUSE process's top (trio): the command line, the settings, and one mount's run.

``cli`` parses the command and daemonizes. ``flags`` (the flag table),
``flag_values``, ``config_file`` and ``profiles`` are read by ``config``,
which builds one frozen ``MountConfig`` (``mount_config``); ``core_settings``
takes the core's settings from it. ``serve`` runs the mount (the request
loop, the workers, the caches) until a signal. ``mount_helper`` is
``mount.rapidmount`` for fstab; ``demo`` is ``make run``.
"""
