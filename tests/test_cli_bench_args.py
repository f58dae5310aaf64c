"""``bench --rate R --max-in-flight 0`` hung forever: ``asyncio.Semaphore(0)`` never admits a
request, so the open loop waited on its gate with no timeout. It must be refused at parse time."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT, free_port


def test_max_in_flight_zero_is_refused_not_a_hang() -> None:
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway",
                "bench",
                f"http://127.0.0.1:{free_port()}",
                "--rate",
                "50",
                "--max-in-flight",
                "0",
                "--requests",
                "2",
                "--warmup",
                "0",
                "--no-progress",
                "--no-plot",
                "--timeout",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("bench --max-in-flight 0 hung") from None
    assert proc.returncode == 2 and "--max-in-flight" in proc.stderr, proc.stderr
