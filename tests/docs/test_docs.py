"""The documentation matches the code: flags, defaults, help texts and errno names.

``docs/configuration.md`` documents flags in Markdown tables whose rows look
like ``| `--flag METAVAR` | default | meaning |``. Rows above the
``## `rapidmount-emulator` `` heading belong to ``rapidmount``; rows below it
to ``rapidmount-emulator``. A default cell is *off* for a switch, *unset* for
a flag without a default, or a value in backticks that the flag's own parser
turns into the code's default (so ``256MiB`` matches ``256 * MiB``). A
meaning cell holds the flag's ``--help`` text, then whatever more it says;
markup (backticks, bold, links), case and line breaks aside.
"""

from __future__ import annotations

import argparse
import errno
import pathlib
import re

import pytest

from rapidmount.daemon import cli, config
from rapidmount.emulator import cli as emulator_cli

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
EMULATOR_HEADING = "## `rapidmount-emulator`"
ERRNO_HEADING = "## Operation → errno"

# | `--flag METAVAR` | default | meaning |   (also `-o OPTIONS` and `-h`, `--help`)
_FLAG = re.compile(r"`(-{1,2}[A-Za-z][\w-]*)[^`]*`")


def _flag_rows(text: str, column: int = 2) -> dict[str, str]:
    """Documented flag -> its default cell (backticks stripped), or another ``column``, from table rows."""
    rows: dict[str, str] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().split("|")]
        if len(cells) < 4 or cells[0] != "":
            continue
        flags = _FLAG.findall(cells[1])
        if not flags or not cells[1].startswith("`-"):
            continue
        for flag in flags:
            assert flag not in rows, f"{flag} is documented twice"
            rows[flag] = cells[column].strip("`").strip()
    return rows


def _sections() -> tuple[str, str]:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert EMULATOR_HEADING in text, f"configuration.md lacks the heading {EMULATOR_HEADING!r}"
    mount_part, emulator_part = text.split(EMULATOR_HEADING, 1)
    return mount_part, emulator_part


MOUNT_PART, EMULATOR_PART = _sections()
MOUNT_ROWS, EMULATOR_ROWS = _flag_rows(MOUNT_PART), _flag_rows(EMULATOR_PART)
MOUNT_MEANINGS = _flag_rows(MOUNT_PART, column=3)


def _plain(text: str) -> str:
    """Text as a reader sees it: no Markdown links, backticks or bold; case and spacing folded."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return " ".join(text.replace("`", "").replace("**", "").split()).casefold()


def _parser_options(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


# -- rapidmount ------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag", config.FLAGS, ids=lambda flag: flag.name)
def test_flag_documented_with_its_default(flag: config.Flag) -> None:
    assert flag.name in MOUNT_ROWS, f"{flag.name} is missing from docs/configuration.md"
    cell = MOUNT_ROWS[flag.name]
    if flag.is_switch:
        assert flag.default is False and cell == "off", f"{flag.name}: documented {cell!r}, code {flag.default!r}"
        return
    if flag.default is None:
        assert cell == "unset", f"{flag.name}: documented {cell!r}, code has no default"
        return
    if cell == '""':
        documented = ""
    else:
        documented = flag.parse(cell) if callable(flag.parse) else cell
    assert documented == flag.default, f"{flag.name}: documented {cell!r}, code {flag.default!r}"


def _helped_actions() -> list:
    """Every option of ``rapidmount`` that ``--help`` shows with a help text of its own (not
    argparse's -h and --version, nor the internal flags it hides)."""
    return [action for action in cli.build_parser()._actions if action.option_strings and action.help
            and action.help != argparse.SUPPRESS and not {"-h", "--version"} & set(action.option_strings)]


INTERNAL_HEADING = "### Internal flags"


def _internal_section() -> str:
    text = (DOCS / "configuration.md").read_text()
    return text.split(INTERNAL_HEADING, 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("flag", [flag for flag in config.FLAGS if flag.internal], ids=lambda flag: flag.name)
def test_an_internal_flag_is_documented_in_its_section_and_hidden_from_help(flag: config.Flag) -> None:
    rows = _flag_rows(_internal_section(), column=3)
    assert flag.name in rows, f"{flag.name} is not in configuration.md's {INTERNAL_HEADING!r} section"
    assert _plain(flag.help) in _plain(rows[flag.name]), f"{flag.name}: its help text is not documented"
    [action] = [a for a in cli.build_parser()._actions if flag.name in a.option_strings]
    assert action.help == argparse.SUPPRESS, f"{flag.name} is shown by --help"


def test_the_internal_section_holds_only_internal_flags() -> None:
    internal = {flag.name for flag in config.FLAGS if flag.internal}
    assert set(_flag_rows(_internal_section())) == internal


@pytest.mark.parametrize("action", _helped_actions(), ids=lambda action: action.option_strings[-1])
def test_help_text_documented(action) -> None:
    option = action.option_strings[-1]
    assert option in MOUNT_MEANINGS, f"{option} is missing from docs/configuration.md"
    shown = action.help.replace("%%", "%")  # as --help prints it
    assert _plain(shown) in _plain(MOUNT_MEANINGS[option]), (
        f"{option}: docs/configuration.md does not give its help text: {shown!r}")


def test_every_flag_has_a_help_text_that_is_checked() -> None:
    checked = {action.option_strings[-1] for action in _helped_actions()}
    assert {flag.name for flag in config.FLAGS if not flag.internal} <= checked
    assert {"-o", "--config-file", "--print-config"} <= checked


@pytest.mark.parametrize("option,default", [("-o", None), ("--log-file", None), ("--version", None)])
def test_cli_only_options_documented(option: str, default: object) -> None:
    assert option in MOUNT_ROWS, f"{option} is missing from docs/configuration.md"
    parser_defaults = {option_string: action.default for action in cli.build_parser()._actions
                       for option_string in action.option_strings}
    if option != "--version":
        assert parser_defaults[option] is default and MOUNT_ROWS[option] == "unset"


def test_every_cli_option_documented_and_no_stale_rows() -> None:
    options = _parser_options(cli.build_parser())
    assert options - MOUNT_ROWS.keys() == set(), "options missing from docs/configuration.md"
    assert MOUNT_ROWS.keys() - options == set(), "docs/configuration.md documents options that do not exist"


def test_mount_options_documented() -> None:
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for option in config.MOUNT_OPTIONS:
        assert re.search(rf"^\|\s*`{option}`\s*\|", text, re.MULTILINE), f"-o {option} is not documented"


# -- rapidmount-emulator ---------------------------------------------------------------------------

def _emulator_actions():
    return [action for action in emulator_cli.build_parser()._actions if action.option_strings
            and "--help" not in action.option_strings]


@pytest.mark.parametrize("action", _emulator_actions(), ids=lambda action: action.option_strings[-1])
def test_emulator_flag_documented(action) -> None:
    flag = action.option_strings[-1]
    assert flag in EMULATOR_ROWS, f"rapidmount-emulator {flag} is missing from docs/configuration.md"
    cell = EMULATOR_ROWS[flag]
    if action.default in (None, []):
        assert cell == "unset", f"{flag}: documented {cell!r}, code has no default"
    elif isinstance(action.default, (int, float)):
        assert float(cell) == float(action.default), f"{flag}: documented {cell!r}, code {action.default!r}"
    else:
        assert cell == str(action.default), f"{flag}: documented {cell!r}, code {action.default!r}"


def test_no_stale_emulator_rows() -> None:
    options = _parser_options(emulator_cli.build_parser())
    assert EMULATOR_ROWS.keys() - options == set()


# -- semantics.md ----------------------------------------------------------------------------------

def _errno_table() -> str:
    text = (DOCS / "semantics.md").read_text(encoding="utf-8")
    assert ERRNO_HEADING in text, f"semantics.md lacks the heading {ERRNO_HEADING!r}"
    section = text.split(ERRNO_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, "the errno table is empty"
    return "\n".join(rows)


def test_errno_table_names_are_real() -> None:
    names = set(re.findall(r"\bE[A-Z0-9]{2,}\b", _errno_table()))
    assert names, "no errno names found in the errno table"
    unknown = sorted(name for name in names if not isinstance(getattr(errno, name, None), int))
    assert not unknown, f"not errno names: {unknown}"


def test_every_errno_in_semantics_is_real() -> None:
    text = (DOCS / "semantics.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`(E[A-Z0-9]{2,})`", text))
    unknown = sorted(name for name in names if not isinstance(getattr(errno, name, None), int))
    assert not unknown, f"not errno names: {unknown}"
