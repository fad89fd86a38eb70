"""Every code name the docs mention exists: module paths, classes, functions,
attributes and metrics, as written in backticks.

docs/benchmarks.md is not checked: it quotes the kernel's and libraries'
symbols from profiles. Names of other programs that the docs mention on
purpose are listed in ``EXTERNAL``.
"""

from __future__ import annotations

import functools
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKED = ["README.md", "docs/architecture.md", "docs/semantics.md", "docs/configuration.md",
           "docs/reliability.md", "docs/ml.md", "docs/gke.md"]
#: Names that are not rapidmount's: the kernel's, Python's, Kubernetes', Prometheus', fuse.conf's,
#: and files the reader writes (the README tour's script, gke.md's config file).
EXTERNAL = {
    "fuse_notify_store_out", "st_atime", "st_ctime", "st_mtime", "user_allow_other", "OnDelete",
    "kubernetes_sd_configs", "RuntimeWarning", "readback.py", "rapidmount.toml",
}

_PATH = re.compile(r"[\w./-]+\.(?:py|pyi|proto|service|toml)")
_CAMEL = re.compile(r"_?[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
_SNAKE = re.compile(r"_?[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
_DOTTED = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+")


@functools.cache
def _tracked() -> tuple[str, ...]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return tuple(listed.split())


@functools.cache
def _source() -> str:
    wanted = (".py", ".pyi", ".proto", ".toml", ".service", ".cfg", "Makefile", "run")
    this = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()  # its own examples of missing names
    return "\n".join((ROOT / name).read_text(errors="replace") for name in _tracked()
                     if name.endswith(wanted) and name != this and not name.startswith("docs/")
                     and (ROOT / name).is_file())


def _defined(name: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", _source()) is not None


def _metric_exists(name: str) -> bool:
    """Prometheus adds ``_total`` to counters and ``_bucket``/``_sum``/``_count`` to histograms."""
    for suffix in ("_total", ""):
        if name.endswith(suffix) and _defined(name.removesuffix(suffix) if suffix else name):
            return True
    return False


def _path_exists(path: str) -> bool:
    path = path.lstrip("./")
    return any(name == path or name.endswith("/" + path) for name in _tracked())


def _missing(token: str) -> list[str]:
    """The names in one backticked span that the tree does not have."""
    token = token.strip().rstrip("()")
    if token in EXTERNAL or " " in token or token.startswith(("-", "$", "/")):
        return []
    if _PATH.fullmatch(token):
        return [] if _path_exists(token) else [token]
    if token.startswith("rapidmount_"):
        name = token.split("{", 1)[0]  # labels: rapidmount_fuse_requests_total{path="other"}
        return [] if _metric_exists(name) else [token]
    if _DOTTED.fullmatch(token):
        parts = token.split(".")
        if parts[0] == "rapidmount":  # a module: rapidmount.fuse.operations
            module = "/".join(parts)
            return [] if _path_exists(module + ".py") or _path_exists(module + "/__init__.py") else [token]
        return [part for part in parts if (_CAMEL.fullmatch(part) or _SNAKE.fullmatch(part))
                and part not in EXTERNAL and not _defined(part)]
    if (_CAMEL.fullmatch(token) or _SNAKE.fullmatch(token)) and not token.startswith("_") or \
            token.startswith("_") and _SNAKE.fullmatch(token.lstrip("_")):
        if token.startswith("_") and token.endswith("_total"):
            return []  # a suffix of the metric named before it: `rapidmount_x_hits_total`, `_misses_total`
        return [] if _defined(token) else [token]
    return []


@pytest.mark.parametrize("doc", CHECKED)
def test_every_code_name_a_doc_mentions_exists(doc: str) -> None:
    text = (ROOT / doc).read_text()
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    missing = sorted({name for span in spans for name in _missing(span)})
    assert not missing, f"{doc} names what the code does not have: {missing}"


def test_the_check_finds_a_name_that_does_not_exist() -> None:
    assert _missing("NoSuchClassAnywhere") == ["NoSuchClassAnywhere"]
    assert _missing("rapidmount/core/no_such_module.py") == ["rapidmount/core/no_such_module.py"]
    assert _missing("rapidmount_no_such_metric_total") == ["rapidmount_no_such_metric_total"]
    assert _missing("Filesystem.no_such_method") == ["no_such_method"]
    assert _missing("no_such_function_here()") == ["no_such_function_here"]
    assert _missing("rapidmount.no_such_package") == ["rapidmount.no_such_package"]
    assert _missing("core/filesystem.py") == [] and _missing("Filesystem.open") == []
