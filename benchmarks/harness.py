"""What the suites share to run servers on loopback: the checkout's root, a free port, waiting for
an HTTP 200. Stdlib only at import (httpx is imported when waiting). Latency percentiles,
summaries, the environment record and the JSON / Markdown reports are ``gateway.bench.report``'s.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

# The repository root: children run from there so that ``-m benchmarks.X`` and ``-m gateway`` resolve.
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback port free now (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str,
    proc: subprocess.Popen[bytes],
    timeout: float,
    *,
    name: str | None = None,
    headers: dict[str, str] | None = None,
    interval: float = 0.2,
) -> None:
    """Poll ``url`` until it answers 200; raise if ``proc`` exits first or ``timeout`` passes."""
    import httpx

    who = name or url
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{who}: process exited with {proc.returncode}; see its log")
        try:
            if httpx.get(url, timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{who} not ready in {timeout} s")
