"""Log output: one line per record, as text or JSON, to stderr or a file.

Records stay on one line whatever they carry (multi-line gRPC details,
exceptions), so ``grep`` and log shippers see one event per line. Fields
passed with ``extra=`` (``object``, ``grpc_code``, ``errno`` ...) are shown
as ``key=value`` in text and as keys of the JSON object. Tracebacks are
only written at ``--log-level debug``; otherwise an exception is named in
one line. SIGHUP calls :func:`reopen` so logrotate can move the file away.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

LOG_FORMATS = ("text", "json")

# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD_ATTRIBUTES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "taskName"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a record carries (from ``extra=``), None values left out."""
    return {key: value for key, value in record.__dict__.items()
            if key not in _STANDARD_ATTRIBUTES and not key.startswith("_") and value is not None}


def _one_line(text: str) -> str:
    return " ".join(text.split()) if "\n" in text or "\r" in text else text


class _Formatter(logging.Formatter):
    def __init__(self, *, tracebacks: bool) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def exception_text(self, record: logging.LogRecord) -> str | None:
        if not record.exc_info or record.exc_info[0] is None:
            return None
        if self.tracebacks:
            return self.formatException(record.exc_info)
        kind, value = record.exc_info[0], record.exc_info[1]
        return f"{kind.__name__}: {value}" if str(value) else kind.__name__


class TextFormatter(_Formatter):
    """``2026-01-01T10:00:00.123Z ERROR rapidmount.fs: message key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {_one_line(record.getMessage())}"
        fields = record_fields(record)
        if fields:
            line += " " + " ".join(f"{key}={_field_text(value)}" for key, value in fields.items())
        exception = self.exception_text(record)
        if exception:
            # A traceback (debug only) keeps its lines; a one-line summary joins the record.
            line += ("\n" + exception) if self.tracebacks else f" ({_one_line(exception)})"
        return line


class JsonFormatter(_Formatter):
    """One JSON object per line: time, level, logger, message, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, object] = {"time": _timestamp(record), "level": record.levelname.lower(),
                    "logger": record.name, "message": record.getMessage()}
        for key, value in record_fields(record).items():
            document.setdefault(key, value if isinstance(value, (int, float, bool, str)) else str(value))
        exception = self.exception_text(record)
        if exception:
            document["exception"] = exception
        return json.dumps(document, ensure_ascii=False)


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"


def _field_text(value: object) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c in "\"=" for c in text) else text


class ReopenableFileHandler(logging.FileHandler):
    """Appends to a file; :meth:`reopen` starts writing to whatever is at the path now."""

    def reopen(self) -> None:
        self.acquire()
        try:
            if self.stream is not None:
                self.stream.close()
            self.stream = self._open()
        finally:
            self.release()


def setup(level: str, log_file: str | None, foreground: bool, log_format: str = "text") -> None:
    """Send every record of this process through one handler (raises OSError on a bad file)."""
    root = logging.getLogger()
    handler: logging.Handler
    if log_file:
        handler = ReopenableFileHandler(log_file, encoding="utf-8")
    elif foreground:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.NullHandler()
    numeric_level = logging.getLevelName(level.upper())
    formatter_class = JsonFormatter if log_format == "json" else TextFormatter
    handler.setFormatter(formatter_class(tracebacks=numeric_level <= logging.DEBUG))
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric_level)
    # grpc and google libraries are chatty at INFO.
    for noisy in ("grpc", "google", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, numeric_level))


def reopen() -> None:
    """Reopen the log file (after logrotate renamed it); a no-op for stderr."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ReopenableFileHandler):
            try:
                handler.reopen()
            except OSError as err:
                sys.stderr.write(f"rapidmount: cannot reopen the log file: {err.strerror}\n")
