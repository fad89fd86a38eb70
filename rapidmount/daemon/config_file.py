"""The TOML config file, both ways: ``--config-file`` reads one, and
``--print-config`` writes the settings in force as one it takes back.

Every flag is a key of the same name (without ``--``); ``options`` holds
``-o`` options.
"""

from __future__ import annotations

import json
from typing import Any

from rapidmount.daemon.flag_values import parse_mode
from rapidmount.daemon.flags import FLAG_BY_DEST, FLAGS, ConfigError, Flag
from rapidmount.daemon.mount_config import MOUNT_SWITCHES, MountConfig


# -- reading (--config-file) -------------------------------------------------------------------------

def load_config_file(path: str) -> dict[str, Any]:
    """Flag values from a TOML file: every flag has a key of the same name.

    Keys are flag names without ``--`` (``cache-size``); ``cache_size`` is
    accepted too, as in ``-o``, but not both for one flag. ``options`` takes a
    list (or a string) of ``-o`` options. An unknown key or a bad value is an
    error naming the key.
    """
    import tomllib

    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as err:
        raise ConfigError(f"--config-file: cannot read {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"--config-file: {path} is not valid TOML: {err}") from None
    values: dict[str, Any] = {}
    for key, value in document.items():
        dest = key.replace("-", "_")
        if dest in values:
            raise ConfigError(f"{path}: key {key!r} is given twice (with - and with _)")
        if dest == "options":
            values["options"] = [value] if isinstance(value, str) else [str(v) for v in value]
            continue
        flag = FLAG_BY_DEST.get(dest)
        if flag is None or isinstance(value, dict):
            raise ConfigError(f"{path}: unknown key {key!r}")
        if flag.is_switch:
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: key {key!r} must be true or false")
            values[dest] = value
        else:
            try:
                values[dest] = flag.parse(str(value)) if callable(flag.parse) else str(value)
            except ValueError as err:
                raise ConfigError(f"{path}: key {key!r}: {err}") from None
    return values


# -- the effective configuration, as TOML (--print-config) -------------------------------------------

#: (MountConfig field, the -o option that turns it on), as ``options`` lists them
_MOUNT_SWITCHES = tuple((name, option) for option, (name, value) in MOUNT_SWITCHES.items() if value)


def _toml_value(flag: Flag, value: object) -> str:
    """``value`` as the config file takes it back (modes as octal strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if flag.parse is parse_mode:
        return f'"{value:04o}"'
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


def effective_toml(config: MountConfig) -> str:
    """Every setting in force, as a TOML config file that ``--config-file``
    takes back, each line saying where its value came from."""
    lines = [f"# rapidmount {config.bucket} {config.mountpoint}: the settings in force, and where each came from"]
    options = [option for dest, option in _MOUNT_SWITCHES if getattr(config, dest)]
    option_sources = sorted({config.source_of(dest) for dest, _ in _MOUNT_SWITCHES if getattr(config, dest)})
    lines.append(f"options = {json.dumps(options)}  # {', '.join(option_sources) or 'default'}")
    for flag in FLAGS:
        value = getattr(config, flag.dest)
        key = flag.name.lstrip("-")
        source = config.source_of(flag.dest)
        if value is None:
            lines.append(f"# {key} is unset  # {source}")
        else:
            lines.append(f"{key} = {_toml_value(flag, value)}  # {source}")
    return "\n".join(lines) + "\n"
