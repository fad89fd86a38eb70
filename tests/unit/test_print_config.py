"""``--print-config``: the settings in force as TOML, each with where it came
from, and a file that ``--config-file`` takes back to the same settings."""

from __future__ import annotations

import re
import tomllib

from rapidmount.daemon import cli, config


def _config(*argv: str) -> config.MountConfig:
    return config.config_from_args(cli.build_parser().parse_args([*argv, "my-bucket", "/nonexistent/mnt"]))


def _sources(text: str) -> dict[str, str]:
    """key -> the source its line names (unset keys included)."""
    found = {}
    for line in text.splitlines()[1:]:
        match = re.match(r"#? ?([a-z0-9-]+)(?: = .*| is unset)  # (.+)$", line)
        assert match, f"not a setting line: {line!r}"
        found[match[1]] = match[2]
    return found


def test_every_setting_says_where_it_came_from(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('cache-size = "1GiB"\nmetadata-ttl = 10\noptions = ["ro"]\n')
    chosen = _config("--config-file", str(path), "--metadata-ttl", "-1", "-o", "allow_other,negative_ttl=2",
                     "--file-mode", "640")
    text = config.effective_toml(chosen)
    sources = _sources(text)
    assert sources["cache-size"] == f"config file {path}"
    assert sources["metadata-ttl"] == "flag"  # the flag won over the file
    assert sources["file-mode"] == "flag"
    assert sources["negative-ttl"] == "-o"
    assert sources["options"] == f"-o, config file {path}"
    assert sources["read-streams"] == "default" and sources["workers"] == "default"
    assert set(sources) == {"options", *(flag.name.lstrip("-") for flag in config.FLAGS)}
    document = tomllib.loads(text)
    assert document["cache-size"] == 1 << 30 and document["metadata-ttl"] == -1.0
    assert document["file-mode"] == "0640" and document["options"] == ["ro", "allow_other"]
    assert "workers" not in document  # unset: a comment


def test_the_printed_file_gives_back_the_same_settings(tmp_path):
    chosen = _config("--anonymous", "--endpoint", "127.0.0.1:9", "-o", "ro,allow_other", "--cache-size", "96M",
                     "--dir-mode", "0750", "--only-dir", 'a "quoted" \\ dir', "--log-format", "json",
                     "--read-streams", "8", "--preserve-mode")
    path = tmp_path / "printed.toml"
    path.write_text(config.effective_toml(chosen))
    again = _config("--config-file", str(path))
    for flag in config.FLAGS:
        assert getattr(again, flag.dest) == getattr(chosen, flag.dest), flag.name
    assert (again.read_only, again.allow_other, again.default_permissions) == (True, True, False)
