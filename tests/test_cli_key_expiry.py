"""``keys create`` refuses an expiry that makes a dead key, in one line with exit 2.

An ``--expires-at`` in the past printed a key and an entry the gateway refuses with 401 from the
first request. An expiry past the year 9999 (``--expires-in-days 3000000``, or an offset that
pushes 9999-12-31 over in UTC) ended in an OverflowError traceback.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def create(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "create", "--name", "ci", "--models", "m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert proc.stdout == ""  # no key is printed for an entry that is not usable
    return lines[0]


@pytest.mark.parametrize("when", ["2020-01-01", "2020-01-01T12:00:00+02:00"])
def test_expiry_in_the_past_is_refused(when: str) -> None:
    assert "in the past" in refused(create("--expires-at", when))


@pytest.mark.parametrize(
    ("when", "written"),
    [
        ("2999-01-01", "2999-01-01T00:00:00Z"),  # no offset: UTC, as --help says
        ("2999-01-01T02:00:00+02:00", "2999-01-01T00:00:00Z"),
    ],
)
def test_future_expiry_is_written_in_utc(when: str, written: str) -> None:
    proc = create("--expires-at", when)
    assert proc.returncode == 0, proc.stderr
    assert f"expires_at = {written}" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("--expires-in-days", "3000000"),  # past the year 9999: was an OverflowError traceback
        ("--expires-at", "9999-12-31T23:59:59-01:00"),  # a valid moment whose UTC time is past 9999
    ],
)
def test_expiry_past_the_calendar_is_one_line(args: tuple[str, str]) -> None:
    assert "9999" in refused(create(*args))
