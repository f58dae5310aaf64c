"""A py-spy profile of one target's process tree, its samples grouped by component."""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path


def _profile(pid: int, seconds: float, out_path: Path) -> dict[str, float] | None:
    """py-spy samples of a process tree grouped by component (share of samples), or None."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        return None
    subprocess.run(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--duration",
            str(int(seconds)),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(out_path),
        ],
        capture_output=True,
        check=False,
        timeout=seconds + 60,
    )
    if not out_path.exists():
        return None
    buckets: collections.Counter[str] = collections.Counter()
    for line in out_path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            buckets[_component(stack.split(";"))] += int(count)
    total = sum(buckets.values()) or 1
    return {k: v / total for k, v in buckets.most_common()}


# A sample is charged to its innermost frame's package (py-spy frames: "func (path:line)").
_COMPONENTS = (
    ("aiohttp (upstream client)", ("aiohttp/", "yarl/", "multidict/")),
    ("httpx / httpcore / h11 / anyio", ("httpx/", "httpcore/", "h11/", "anyio/", "sniffio/")),
    ("msgspec", ("msgspec",)),
    ("uvicorn (server, httptools)", ("uvicorn/", "httptools")),
    ("Litestar", ("litestar/",)),
    ("structlog / logging", ("structlog/", "logging/")),
    ("prometheus_client", ("prometheus_client/",)),
    ("limits / redis", ("limits/", "redis/")),
    ("adapters/upstreams (pool engine)", ("adapters/upstreams/",)),
    ("gateway/serving/service.py + jobs.py", ("gateway/serving/service.py", "gateway/serving/jobs.py")),
    ("gateway (middleware, access, routes)", ("gateway/",)),
    ("asyncio / uvloop event loop", ("asyncio/", "uvloop/")),
)
_FRAME = re.compile(r"\((.*):\d+\)$")


def _component(frames: list[str]) -> str:
    for frame in reversed(frames):
        m = _FRAME.search(frame)
        path = m.group(1) if m else frame
        for name, needles in _COMPONENTS:
            if any(n in path for n in needles):
                return name
    leaf = frames[-1] if frames else "?"
    return f"other ({leaf.split(' (')[0][:40]})"
