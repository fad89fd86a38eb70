"""Shared fixtures: a fresh emulator per test, and Google's official client for it."""

from __future__ import annotations

import os
from typing import Callable, Iterator

import pytest

from rapidmount.emulator import Emulator

#: ``make soak``: the reliability checks run at their long sizes.
SOAK = os.environ.get("RAPIDMOUNT_SOAK") == "1"
_REPORTED: list[str] = []

ZONAL_BUCKET = "test-bucket"
HNS_BUCKET = "hns-bucket"
FLAT_BUCKET = "flat-bucket"


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    """A fresh in-memory emulator with a zonal, an HNS and a flat bucket."""
    with Emulator(buckets={ZONAL_BUCKET: "zonal", HNS_BUCKET: "hns", FLAT_BUCKET: "flat"}) as emu:
        yield emu


def bidi_streams(emulator: Emulator) -> dict[str, int]:
    """The bidi streams running at ``emulator`` now, by method: those clients hold open."""
    return {method: count for method, count in emulator.running_calls.items() if method.startswith("Bidi")}


def make_official_client(endpoint: str):
    """Google's AsyncGrpcClient for an emulator endpoint (§7.2 of the protocol brief).

    Call it inside the coroutine that uses it: the client's grpc.aio channel
    belongs to the event loop that is running when it is created.
    """
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient

    return AsyncGrpcClient(credentials=AnonymousCredentials(),
                           client_options=ClientOptions(api_endpoint=endpoint))


@pytest.fixture
def official_client(emulator: Emulator) -> Callable[[], object]:
    """A factory of official AsyncGrpcClients bound to ``emulator``.

    The official async client needs an asyncio loop: build it inside the
    scenario run with ``asyncio.run`` (the emulator has its own thread).
    """
    return lambda: make_official_client(emulator.endpoint)


def report_line(check: str, line: str) -> None:
    """One line of a reliability check (``"R2"``, ``"..."``), in the run's summary."""
    text = f"{check} {line}"
    _REPORTED.append(text)
    print(text)


@pytest.fixture
def report():
    """:func:`report_line`, for a test."""
    return report_line


def pytest_terminal_summary(terminalreporter):
    if _REPORTED:
        terminalreporter.section("reliability checks" + (" (soak)" if SOAK else " (short)"))
        for line in _REPORTED:
            terminalreporter.write_line(line)
