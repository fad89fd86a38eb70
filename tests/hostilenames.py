"""Hostile object names, and what a mount must make of them.

:func:`hostile_names` gives a fixed catalogue of names that have broken file
systems over object stores (``..``, empty segments, control characters,
names that collide with directories, unicode normalization twins ...)
followed by random mixes of such segments from a seeded generator.

:func:`refusal` says which names the service refuses to create, and
:func:`expected_view` what a mount of the names it accepts shows, following
docs/semantics.md ("Hidden names") on its own, without rapidmount's code:
the files and directories shown, and the names hidden, each under the key
its one log line names.
"""

from __future__ import annotations

import random
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field

MAX_OBJECT_NAME_BYTES = 1024  # the service's limit
MAX_FOLDER_NAME_BYTES = 512  # buckets with hierarchical namespace: the longest folder a name implies
MAX_FOLDER_DEPTH = 50
NAME_MAX = 255  # Linux: the longest file name


def utf8_length(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def catalogue() -> list[str]:
    """Names chosen one by one; some the service refuses (see :func:`refusal`)."""
    accented = "café-déjà-vu"
    nfc, nfd = unicodedata.normalize("NFC", accented), unicodedata.normalize("NFD", accented)
    assert nfc != nfd
    at_folder_limit = "F" * 255 + "/" + "G" * 255 + "/"  # 512 bytes: the longest folder
    names = [
        # dots
        ".", "..", "...", ".hidden", "..double-dot-prefix", "dots/.", "dots/..", "dots/./x", "dots/../x",
        "dots/.../x", "dots/ok", "./lead-dot", "../lead-dotdot", "a/../../etc/passwd", "../../etc/shadow",
        "etc/passwd",
        # empty segments, slashes
        "a//b", "empty//", "empty/x", "//", "/", "/leading", "//leading-two", "trail/", "trail/x",
        "lonely-placeholder/", "deep/er/placeholder/", "mid//dle/x",
        # files and directories of the same name
        "a", "a/b", "a/b/c", "a/b/", "clash", "clash/", "clash2", "clash2/child",
        # control characters
        "tab\there", "soh\x01", "del\x7f", "esc\x1b[31mred", "bell\x07", "ctl/\x1f/x", "\t", "\x01",
        "line\nfeed", "carriage\rreturn", "\n", "dir/line\nfeed",
        # NUL
        "nul\x00name", "nul-dir/\x00/x", "\x00", "nul-last/x\x00",
        # backslashes, look-alikes
        "back\\slash", "\\", "..\\..\\windows", "c:\\x", "dots\\..\\up", "\u2215fraction-slash",
        "\u2024one-dot-leader", "\uff0efullwidth-dot", "%2e%2e", "%2F", "a%2Fb",
        # unicode
        nfc, nfd, f"twins/{nfc}", f"twins/{nfd}", "emoji-😀", "日本語/ファイル", "\u202eright-to-left",
        "\ufeffbom", "zero\u200bwidth", "\u0085next-line", "\u2028line-sep", " ", "  two spaces",
        "trailing-space ", "-", "--", "~", "*", "?", "[x]", "'quote'", '"double"',
        # lengths
        "N" * 255, "O" * 256, "long/" + "P" * 300, "é" * 127, "é" * 128, "😀" * 63 + "xyz", "😀" * 64,
        at_folder_limit + "H" * 255,  # 767 bytes, every segment within NAME_MAX: shown
        at_folder_limit + "I" * (1024 - 512),  # 1,024 bytes: a segment too long
        "J" * 1024, "K" * 1025, "k/" + "K" * 1023,
        "L" * 256 + "/" + "M" * 255 + "/x",  # a folder longer than 512 bytes
        "deep-tree/" + "d/" * 49 + "x", "deeper-tree/" + "d/" * 50 + "x",
        # not UTF-8: a str can only carry it as a lone surrogate
        "\udcff", "bad-\udce9-utf8",
    ]
    return list(dict.fromkeys(names))


_WORDS = ["data", "x", "train", "a", "b", "README", "img.png", "..", ".", "", "con", "nul"]
_CONTROL = [chr(c) for c in range(0x01, 0x20)] + ["\x7f"]
_UNICODE = ["é", "e\u0301", "Å", "A\u030a", "😀", "ß", "ﬁ", "\u200d", "\u202e", "\ufeff", "\u00a0", "日"]


def _segment(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.25:
        return rng.choice(_WORDS) + str(rng.randrange(100))
    if pick < 0.40:
        return rng.choice([".", "..", "", "...", ". ", " .."])
    if pick < 0.55:
        return "".join(rng.choice(_CONTROL + ["x", "y"]) for _ in range(rng.randint(1, 6)))
    if pick < 0.60:
        return rng.choice(["\x00", "a\x00", "\x00b"])
    if pick < 0.70:
        return "".join(rng.choice(["\\", "..", ".", "\\..", "x"]) for _ in range(rng.randint(1, 4)))
    if pick < 0.85:
        text = "".join(rng.choice(_UNICODE + ["x"]) for _ in range(rng.randint(1, 8)))
        return unicodedata.normalize(rng.choice(["NFC", "NFD", "NFKC", "NFKD"]), text) \
            if rng.random() < 0.5 else text
    # long: around NAME_MAX, in one- to four-byte characters
    char = rng.choice(["z", "é", "日", "😀"])
    target = rng.choice([NAME_MAX - 3, NAME_MAX, NAME_MAX + 1, NAME_MAX + 40, 600])
    return char * max(1, target // utf8_length(char))


def random_name(rng: random.Random) -> str:
    depth = rng.choices([1, 2, 3, 4, 6], weights=[3, 4, 3, 2, 1])[0]
    # A few top-level directories, so names collide with each other's directories.
    top = rng.choice(["mix", "mix2", "a", "clash", "dots", "twins", ""])
    segments = ([top] if top else []) + [_segment(rng) for _ in range(depth)]
    name = "/".join(segments)
    if rng.random() < 0.05:
        name = "/" + name
    if rng.random() < 0.10:
        name += "/"
    return name


def hostile_names(count: int, seed: int = 5) -> list[str]:
    """``count`` distinct names: the catalogue, then random mixes."""
    names = catalogue()[:count]
    seen = set(names)
    rng = random.Random(seed)
    while len(names) < count:
        name = random_name(rng)
        if name not in seen:
            seen.add(name)
            names.append(name)
    return names


def refusal(name: str, *, hierarchical: bool = True) -> str | None:
    """Why the service refuses to create ``name``, or None if it accepts it."""
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    if not name or name in (".", ".."):
        return "empty, '.' or '..'"
    if "\r" in name or "\n" in name:
        return "carriage return or line feed"
    if len(encoded) > MAX_OBJECT_NAME_BYTES:
        return "longer than 1,024 bytes"
    if hierarchical:
        if name.count("/") > MAX_FOLDER_DEPTH:
            return "folders nested too deep"
        if utf8_length(name[:name.rfind("/") + 1]) > MAX_FOLDER_NAME_BYTES:
            return "a folder longer than 512 bytes"
    return None


def bad_segment(segment: str) -> bool:
    """A segment that cannot be a file name: docs/semantics.md, "Hidden names"."""
    return segment in ("", ".", "..") or "\x00" in segment or utf8_length(segment) > NAME_MAX


@dataclass
class View:
    """What a mount of some objects shows. Paths are relative to the mount root."""

    files: dict[str, str] = field(default_factory=dict)  # path -> object name
    directories: set[str] = field(default_factory=set)  # paths, without a trailing "/"
    #: objects "d/" shown as the directory "d" (their bytes are not shown)
    placeholders: set[str] = field(default_factory=set)
    #: the name one log line gives -> the objects hidden under it: an object
    #: itself, or the prefix up to a bad directory segment ("a/../"), which
    #: hides every object below it
    hidden: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    @property
    def hidden_objects(self) -> set[str]:
        return {name for names in self.hidden.values() for name in names}

    @property
    def shown_objects(self) -> set[str]:
        return set(self.files.values()) | self.placeholders


def expected_view(names: list[str]) -> View:
    view = View()

    def walk(prefix: str, members: list[str]) -> None:
        files: dict[str, str] = {}
        directories: dict[str, list[str]] = defaultdict(list)
        for name in members:
            rest = name[len(prefix):]
            if not rest:
                view.placeholders.add(name)  # the directory's own placeholder
                continue
            segment, slash, _ = rest.partition("/")
            if bad_segment(segment):
                view.hidden[prefix + segment + slash].add(name)
            elif slash:
                directories[segment].append(name)
            else:
                files[segment] = name
        for segment, name in files.items():
            if segment in directories:
                view.hidden[name].add(name)  # shadowed by the directory
            else:
                view.files[prefix + segment] = name
        for segment, group in directories.items():
            view.directories.add(prefix + segment)
            walk(prefix + segment + "/", group)

    walk("", names)
    return view


def content(index: int, name: str) -> bytes:
    """The bytes of the ``index``-th name: unique, and naming the object."""
    return b"%d:" % index + name.encode("utf-8", "backslashreplace")


def names_it(line: str, key: str) -> bool:
    """Whether a log line ("<time> WARNING <logger>: <message>") is the one
    hiding ``key``: an object, or a prefix ending in "/" that hides every
    object below it."""
    message = line.partition(": ")[2]
    if key.endswith("/"):
        return message.startswith(f"hiding {key!r} and every object below it: ")
    return message.startswith(f"hiding object {key!r}: ")
