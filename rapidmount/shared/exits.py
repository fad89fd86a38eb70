"""Exit statuses and the one-line mount failure, shared by the CLI and the daemon.

Documented in docs/configuration.md ("Exit codes").
"""

EXIT_OK = 0  # unmounted cleanly (SIGTERM, SIGINT, fusermount -u)
EXIT_RUNTIME = 1  # failed while serving, or an internal error
EXIT_USAGE = 2  # bad flag, -o option, config file or log file
EXIT_CANNOT_MOUNT = 3  # mountpoint, /dev/fuse, endpoint, credentials, bucket or metrics port


class MountError(Exception):
    """A failure to mount, reported as one line, e.g. 'bucket "x" does not exist'."""

    exit_code = EXIT_CANNOT_MOUNT
