"""Every hand-written module stays small enough to hold one concern: at most
600 lines. The generated protobuf modules are exempt."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rapidmount"
MAX_LINES = 600


def _hand_written() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "_proto" not in path.relative_to(PACKAGE).parts[:1]
                  or path.name == "generate.py")


def test_no_hand_written_module_is_over_600_lines():
    sizes = {str(path.relative_to(PACKAGE.parent)): len(path.read_text(encoding="utf-8").splitlines())
             for path in _hand_written()}
    assert len(sizes) > 50
    over = {path: lines for path, lines in sizes.items() if lines > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"
