"""``bench`` mistakes end in one line and exit 2, not a traceback.

- ``--out`` that cannot be created (a path under a file, no permission) was found only after
  the whole run, by ``mkdir`` outside any handler: a traceback, exit 1, the results lost.
- A URL with a port outside 0-65535 passed ``_endpoint_url`` and blew up in the socket layer
  with an OverflowError (not an httpx error) inside the driver: a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, free_port


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway",
            "bench",
            *args,
            "--no-progress",
            "--no-plot",
            "--requests",
            "1",
            "--warmup",
            "0",
            "--documents",
            "2",
            "--timeout",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    return lines[0]


def test_out_dir_that_cannot_be_made_is_one_line_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    proc = bench(f"http://127.0.0.1:{free_port()}", "--out", str(blocker / "out"))
    assert str(blocker / "out") in _one_line(proc)


def test_port_out_of_range_is_one_line() -> None:
    proc = bench("http://u:pw-must-not-leak@127.0.0.1:99999")
    line = _one_line(proc)
    assert "99999" in line and "pw-must-not-leak" not in line
