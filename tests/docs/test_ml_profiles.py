"""docs/ml.md shows what each profile chooses on 2, 16 and 208 CPUs: the tables match the code."""

from __future__ import annotations

import pathlib

import pytest

from rapidmount.daemon.profiles import GiB, MiB, PROFILES, Machine, settings

ML = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ml.md"
MACHINES = [("2 CPUs, 8 GiB", Machine(2, 8 * GiB)), ("16 CPUs, 64 GiB", Machine(16, 64 * GiB)),
            ("208 CPUs, 1872 GiB (A3)", Machine(208, 1872 * GiB))]


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return "forever" if value < 0 else f"{value:g} s"
    if isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f"{value // GiB} GiB" if value % GiB == 0 else f"{value // MiB} MiB"
    return str(value)


def table(profile: str) -> str:
    keys = sorted(set().union(*(settings(profile, machine) for _, machine in MACHINES)))
    rows = ["| setting | " + " | ".join(name for name, _ in MACHINES) + " |", "|---|---|---|---|"]
    rows += [f"| `--{key.replace('_', '-')}` | "
             + " | ".join(_shown(settings(profile, machine)[key]) for _, machine in MACHINES) + " |" for key in keys]
    return "\n".join(rows)


@pytest.mark.parametrize("profile", PROFILES)
def test_ml_md_shows_what_the_profile_chooses(profile):
    text = ML.read_text()
    assert f"### `{profile}`" in text, f"docs/ml.md has no section for {profile}"
    section = text.split(f"### `{profile}`", 1)[1].split("\n### ", 1)[0]
    assert table(profile) in section, f"docs/ml.md's table of {profile} differs from the code:\n{table(profile)}"
