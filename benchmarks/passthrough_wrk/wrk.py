"""The client side: the request body, wrk's Lua script, one bounded wrk run and its output read."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> dict[str, Any]:
    """Completed requests, req/s, latency percentiles and errors from ``wrk --latency`` output."""
    res: dict[str, Any] = {}
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
    if not m:
        raise ValueError(f"wrk printed no request count:\n{out}")
    res["requests"] = int(m.group(1))
    res["req_s"] = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    for pct in ("50", "90", "99"):
        lm = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", out, re.MULTILINE)
        if lm:
            res[f"p{pct}_ms"] = _ms(lm.group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    res["errors"] = (int(non2xx.group(1)) if non2xx else 0) + (sum(map(int, sock.groups())) if sock else 0)
    return res


def _body(documents: int, top_n: int, seed: int = 7) -> bytes:
    from gateway.bench.workload import WorkloadSpec, build_workload

    req = build_workload(WorkloadSpec(requests=1, documents=documents, model="rerank", seed=seed))[0]
    payload = json.loads(req.body)
    payload["model"], payload["top_n"] = "rerank", top_n
    return json.dumps(payload).encode()


def _lua(body_path: Path, headers: dict[str, str]) -> str:
    lines = ['wrk.method = "POST"', f'local f = io.open("{body_path}", "rb")', "wrk.body = f:read('*a')", "f:close()"]
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def _wrk(url: str, script: Path, clients: int, seconds: float, timeout_s: float = 10.0) -> dict[str, Any]:
    cmd = [
        "wrk",
        "-t1",
        f"-c{clients}",
        f"-d{max(1, round(seconds))}s",
        f"--timeout={round(timeout_s)}s",
        "--latency",
        "-s",
        str(script),
        url,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    return parse_wrk(out)
