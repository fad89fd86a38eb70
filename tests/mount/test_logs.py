"""Logs: one line per record (text or JSON), one line per failed operation
with the object and the gRPC code, no tracebacks below debug, and SIGHUP
reopening the log file after logrotate moved it."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys

import pytest

from rapidmount.shared import logs
from rapidmount.workers.client.errors import StorageError
from rapidmount.emulator import Emulator
from tests.mountutil import HangGuard
from tests.polling import until

BUCKET = "logs-bucket"
OBJECT = "dir/unreadable.bin"
TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")

guard = HangGuard(120)
hang_guard = guard.autouse_fixture()


def _fail_one_read(emu: Emulator, mount) -> None:
    """A read whose stream stays UNAVAILABLE past the retry deadline: EIO."""
    emu.add_fault(f"outage:method=BidiReadObject,object={OBJECT}")
    with pytest.raises(OSError):
        (mount.path / OBJECT).read_bytes()
    emu.clear_faults()


@pytest.fixture
def emu():
    with Emulator(buckets={BUCKET: "zonal"}) as emulator:
        emulator.seed(BUCKET, OBJECT, b"z" * 100_000)
        emulator.seed(BUCKET, "fine.txt", b"fine")
        yield emulator


def test_json_logs_one_object_per_line_with_fields(emu):
    with guard.mount(emu, BUCKET, "--log-format", "json", "--log-level", "info", "--retry-deadline", "1") as m:
        assert (m.path / "fine.txt").read_bytes() == b"fine"
        _fail_one_read(emu, m)
        until(lambda: '"level": "error"' in m.log())
        records = [json.loads(line) for line in m.log().splitlines()]
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record["time"])
        assert "exception" not in record and "Traceback" not in record["message"]
    # One record per failed read (the kernel may retry a failed read once).
    errors = [r for r in records if r["level"] == "error"]
    assert errors
    for error in errors:
        assert error["object"] == OBJECT and error["grpc_code"] == "UNAVAILABLE", error
        assert error["errno"] == "EIO" and OBJECT in error["message"]
    broken = [r for r in records if "broke" in r["message"]]
    assert broken and all(r["object"] == OBJECT and r["grpc_code"] == "UNAVAILABLE" for r in broken)


def test_text_logs_one_line_per_error_without_tracebacks(emu):
    with guard.mount(emu, BUCKET, "--log-level", "info", "--retry-deadline", "1") as m:
        _fail_one_read(emu, m)
        until(lambda: " ERROR " in m.log())
        lines = m.log().splitlines()
    assert all(TEXT_LINE.match(line) for line in lines), [bad for bad in lines if not TEXT_LINE.match(bad)]
    errors = [line for line in lines if " ERROR " in line]
    assert errors
    for error in errors:
        assert repr(OBJECT) in error and "grpc_code=UNAVAILABLE" in error and f"object={OBJECT}" in error


def test_debug_logs_never_carry_request_metadata(emu):
    with guard.mount(emu, BUCKET, "--log-level", "debug", "--retry-deadline", "1") as m:
        assert (m.path / "fine.txt").read_bytes() == b"fine"
        _fail_one_read(emu, m)
        text = m.log()
    assert "x-goog-request-params" not in text and "authorization" not in text.lower()
    assert "bucket=projects" not in text  # the routing header's value


def test_sighup_reopens_the_log_file(emu):
    with guard.mount(emu, BUCKET, "--log-level", "info") as m:
        rotated = m.log_path.with_name("daemon.log.1")
        os.rename(m.log_path, rotated)
        os.kill(m.pid, signal.SIGHUP)
        until(lambda: m.log_path.exists() and "log file reopened" in m.log())
        emu.add_fault(f"outage:method=BidiReadObject,object={OBJECT}")
        m.process.send_signal(signal.SIGTERM)
        assert m.process.wait(timeout=30) == 0
        new_text = m.log()
    old_text = rotated.read_text()
    assert "mounted gs://" in old_text and "log file reopened" not in old_text
    assert "received SIGTERM" in new_text and "mounted gs://" not in new_text


def _record(message: str, *args, exc_info=None, **fields) -> logging.LogRecord:
    record = logging.LogRecord("rapidmount.fs", logging.ERROR, __file__, 1, message, args, exc_info)
    record.__dict__.update(fields)
    return record


def _exc_info():
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        return sys.exc_info()


def test_formatters_keep_one_line_unless_debug():
    error = StorageError("read 'a b': UNAVAILABLE: x", code=None, object_name="a b")
    record = _record("%s\nsecond line", error, exc_info=_exc_info(), **error.log_fields())
    text = logs.TextFormatter(tracebacks=False).format(record)
    assert "\n" not in text
    assert text.endswith("read 'a b': UNAVAILABLE: x second line object=\"a b\" errno=EIO (ValueError: bad thing)")
    document = json.loads(logs.JsonFormatter(tracebacks=False).format(record))
    assert document["object"] == "a b" and document["errno"] == "EIO" and "grpc_code" not in document
    assert document["exception"] == "ValueError: bad\nthing" and document["level"] == "error"
    assert "Traceback" in logs.TextFormatter(tracebacks=True).format(record)
    assert "Traceback" in json.loads(logs.JsonFormatter(tracebacks=True).format(record))["exception"]


def test_unwritable_log_file_is_a_usage_error(tmp_path):
    import subprocess

    result = subprocess.run([sys.executable, "-m", "rapidmount.daemon.cli", "--log-file", str(tmp_path / "no" / "log"),
                             "bucket-name", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stderr.strip() == f"rapidmount: error: --log-file: cannot open {tmp_path}/no/log: " \
                                    "No such file or directory"


def test_describe_and_rpc_error_are_one_line():
    import grpc

    from rapidmount.workers.client.errors import describe, rpc_error

    err = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                               details="backend\n  went away")
    assert "\n" in str(err)  # grpc's own text spans lines
    assert describe(err) == "UNAVAILABLE: backend went away"
    failure = rpc_error(err, "read 'a'", object_name="a")
    assert str(failure) == "read 'a': UNAVAILABLE: backend went away"
    assert failure.log_fields() == {"object": "a", "grpc_code": "UNAVAILABLE", "errno": "EIO"}
    assert describe(ValueError("two\nlines")) == "two lines" and describe(TimeoutError()) == "TimeoutError"
