"""Instructions per request through the gateway's ASGI app, counted by valgrind (callgrind).

Wall and CPU times on a shared 2-vCPU box move by tens of percent from minute to minute, so a
change of a few percent in the per-request cost cannot be seen with wrk. Instruction counts do
not depend on the load: this drives the app in-process (no ASGI server) with the passthrough
benchmark's request (``pool`` engine, protocol ``cohere``, logging at WARNING, 100 documents,
56 kB, ``top_n`` 10) against ``benchmarks/stub_upstream.py`` on loopback, so the count covers
our middleware, Litestar, the service, the pool engine and aiohttp (the stub is another process
and is not counted), and compares variants side by side in one run:

- ``direct``: ``POST /v2/rerank``, served by ``gateway.http.direct``;
- ``routed``: ``POST /v2/rerank/``, the same route through Litestar's router (it normalizes
  the trailing slash), i.e. the path every request took before ``gateway.http.direct``;
- ``before`` (with ``--before DIR``, a checkout of an earlier commit: ``git archive COMMIT |
  tar -x -C DIR``): ``POST /v2/rerank`` served by that checkout's code.

Each variant runs in its own ``valgrind --tool=callgrind --instr-atstart=no`` process; counting
is switched on (``callgrind_control -i on``) after the warm-up requests and off after the
counted ones. Needs Debian's ``valgrind`` package.

    .venv/bin/python -m benchmarks.instructions --out docs/benchmarks/cpu-$(date +%F)

Writes ``instructions.json`` and ``instructions.md`` (per variant: instructions per request,
and the functions with the most instructions of their own).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_overhead import ROOT, _free_port

VARIANTS = {"direct": "/v2/rerank", "routed": "/v2/rerank/"}


# -- the measured process -------------------------------------------------------------------
async def _drive(path: str, stub_url: str, requests: int, warmup: int, documents: int, top_n: int) -> None:
    from benchmarks.cpu_overhead import _asgi_call
    from benchmarks.passthrough_wrk import _body
    from gateway.app import create_app
    from gateway.config.settings import load_settings

    body = _body(documents, top_n)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gateway.toml"
        config.write_text(
            '[logging]\nlevel = "WARNING"\n\n[[models]]\nname = "rerank"\nengine = "pool"\nprotocol = "cohere"\n'
            f'urls = ["{stub_url}"]\nmodel = "stub"\nmax_connections = 64\n'
        )
        app = create_app(load_settings(config))
    # An earlier checkout's _asgi_call may not take a path; it posts to /v2/rerank.
    where = {} if path == "/v2/rerank" else {"path": path}
    async with app.lifespan():
        for _ in range(200):  # bounded: the stub is up before this process starts
            if app.state.registry.ready:
                break
            await app.state.registry.refresh_health()
            await asyncio.sleep(0.05)
        for _ in range(warmup):
            await _asgi_call(app, body, **where)  # raises unless 200
        # Blocking on purpose: nothing else may run while counting is switched on or off.
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221
        for _ in range(requests):
            await _asgi_call(app, body, **where)
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)  # noqa: ASYNC221


# -- the parent: one valgrind run per variant --------------------------------------------------
def _annotate(callgrind_out: Path) -> str:
    return subprocess.run(["callgrind_annotate", str(callgrind_out)], check=True, capture_output=True, text=True).stdout


def _totals(annotated: str) -> int:
    for line in annotated.splitlines():
        if "PROGRAM TOTALS" in line:
            return int(line.split()[0].replace(",", ""))
    raise ValueError("no PROGRAM TOTALS in callgrind_annotate's output")


def _top_functions(annotated: str, requests: int, count: int) -> list[dict[str, Any]]:
    rows = []
    for line in annotated.splitlines():
        match = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(\S+)", line)
        if match and "PROGRAM TOTALS" not in line:
            name = match.group(2)
            name = re.sub(r"^.*?/(Python|Objects|Modules|Include)/", r"\1/", name)  # CPython's own sources
            name = re.sub(r"^\./[^:]*:", "libc:", name)
            rows.append({"function": name, "per_request": int(match.group(1).replace(",", "")) / requests})
        if len(rows) >= count:
            break
    return rows


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("litestar", "msgspec", "aiohttp", "uvloop"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:  # not installed: not part of this run
            continue
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return {**out, "valgrind": valgrind}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "instructions")
    ap.add_argument("--requests", type=int, default=200, help="counted requests per variant")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--documents", type=int, default=100)
    ap.add_argument("--top-n", type=int, default=10)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--before", type=Path, help="a checkout of an earlier commit: adds the variant 'before'")
    ap.add_argument("--top", type=int, default=12, help="functions listed per variant")
    ap.add_argument("--child-path", help=argparse.SUPPRESS)
    ap.add_argument("--child-stub", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child_path:  # inside valgrind
        import uvloop

        uvloop.install()
        asyncio.run(_drive(args.child_path, args.child_stub, args.requests, args.warmup, args.documents, args.top_n))
        return 0

    if not shutil.which("valgrind"):
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    args.out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    stub = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(port), "--keep-alive-s", "600"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    results: dict[str, Any] = {}
    try:
        import httpx

        for _ in range(100):  # bounded wait for the stub
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        variants = {name: (VARIANTS[name], ROOT) for name in args.variants.split(",")}
        if args.before is not None:
            variants["before"] = ("/v2/rerank", args.before.resolve())
        with tempfile.TemporaryDirectory() as tmp:
            for name, (path, code) in variants.items():
                out_file = Path(tmp) / f"callgrind.{name}"
                started = time.perf_counter()
                # This file as a script, importing gateway (and benchmarks' helpers) from `code`.
                subprocess.run(
                    ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}",
                     sys.executable, str(Path(__file__).resolve()), "--child-path", path,
                     "--child-stub", f"http://127.0.0.1:{port}", "--requests", str(args.requests),
                     "--warmup", str(args.warmup), "--documents", str(args.documents), "--top-n", str(args.top_n)],
                    cwd=code, env={**os.environ, "PYTHONPATH": str(code)}, check=True, capture_output=True,
                )
                annotated = _annotate(out_file)
                results[name] = {
                    "path": path,
                    "code": "this checkout" if code == ROOT else str(code),
                    "instructions_per_request": _totals(annotated) / args.requests,
                    "top_functions": _top_functions(annotated, args.requests, args.top),
                    "run_s": round(time.perf_counter() - started, 1),
                }
                print(f"{name:8s} {path:14s} {results[name]['instructions_per_request'] / 1e6:.3f} M instructions/request")
    finally:
        stub.terminate()
        stub.wait()

    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "versions": _versions(),
        "workload": {"documents": args.documents, "top_n": args.top_n, "requests": args.requests, "warmup": args.warmup},
        "variants": results,
    }
    (args.out / "instructions.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "instructions.md").write_text(render(report))
    print(f"wrote {args.out / 'instructions.md'}")
    return 0


def render(report: dict[str, Any]) -> str:
    variants = report["variants"]
    w = report["workload"]
    lines = [
        f"# Instructions per request ({report['date']})",
        "",
        f"valgrind callgrind, {w['requests']} counted requests after {w['warmup']} warm-up, {w['documents']} documents, "
        f"`top_n` {w['top_n']}, `pool` engine -> stub upstream on loopback; versions: "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "| variant | path | code | instructions / request |",
        "|---|---|---|---|",
    ]
    base = variants.get("routed", {}).get("instructions_per_request")
    for name, v in variants.items():
        ratio = f" ({v['instructions_per_request'] / base:.3f}× routed)" if base and name != "routed" else ""
        lines.append(f"| {name} | `{v['path']}` | {v['code']} | {v['instructions_per_request'] / 1e6:.3f} M{ratio} |")
    for name, v in variants.items():
        lines += ["", f"## {name}: functions with the most instructions of their own", "", "| function | per request |", "|---|---|"]
        lines += [f"| `{row['function']}` | {row['per_request'] / 1e3:,.0f} k |" for row in v["top_functions"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
