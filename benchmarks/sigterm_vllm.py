"""How long a gateway with a vLLM engine takes to exit on SIGTERM, and what it logs meanwhile.

Starts ``rerank-gateway serve`` (from ``--root``, so two checkouts can be compared in one run)
with one ``vllm-score`` model on the tiny random Qwen3 checkpoint, waits until it is ready,
scores one request, sends SIGTERM and measures the time to exit, the exit status and whether
the output after the signal holds a traceback or ``EngineDeadError``. Writes JSON + Markdown.

    python -m benchmarks.sigterm_vllm --label before=/tmp/base --label after=. --out docs/benchmarks/X
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(root: Path, tiny: Path, work: Path) -> dict[str, object]:
    port = _free_port()
    config = work / f"g-{port}.toml"
    config.write_text(
        f'[[models]]\nname = "vs"\nengine = "vllm-score"\npath = "{tiny}"\nmax_length = 256\n'
        "max_query_tokens = 32\nenforce_eager = true\ngpu_memory_utilization = 0.1\n"
    )
    log = work / f"g-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
                                cwd=root, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            proc.kill()
            raise RuntimeError(log.read_text()[-3000:])
        r = httpx.post(f"{url}/v1/rerank", json={"model": "vs", "query": "q", "documents": ["a", "b"]}, timeout=60)
        r.raise_for_status()
        mark = log.stat().st_size
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        took = time.monotonic() - t0
    after = log.read_bytes()[mark:].decode(errors="replace")
    return {
        "exit_s": round(took, 2),
        "returncode": rc,
        "traceback_after_sigterm": "Traceback" in after or '"exception"' in after,
        "engine_dead_error_after_sigterm": "EngineDeadError" in after,
        "lines_after_sigterm": len(after.splitlines()),
        "output_after_sigterm_tail": after[-1500:],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--label", action="append", required=True, help="NAME=ROOT (a checkout to run)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    from tests.tiny_qwen3 import build_tiny_qwen3

    results: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_qwen3(Path(tmp) / "tiny")
        for _ in range(args.runs):
            for item in args.label:  # alternate checkouts run by run
                name, _, root = item.partition("=")
                results.setdefault(name, []).append(measure(Path(root).resolve(), tiny, Path(tmp)))
    import vllm

    doc = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} CPU cores, no GPU",
        "vllm": vllm.__version__,
        "command": "python -m benchmarks.sigterm_vllm " + " ".join(sys.argv[1:]),
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sigterm_vllm.json").write_text(json.dumps(doc, indent=1))
    rows = [
        f"| {name} | {r['exit_s']} | {r['returncode']} | {r['engine_dead_error_after_sigterm']} | {r['traceback_after_sigterm']} |"
        for name, rs in results.items() for r in rs
    ]
    (out / "sigterm_vllm.md").write_text(
        f"# SIGTERM with a vLLM engine ({doc['date']})\n\n{doc['machine']}, vllm {doc['vllm']}; "
        f"`{doc['command']}`\n\n| checkout | exit s | exit status | EngineDeadError | traceback |\n|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
    )
    print((out / "sigterm_vllm.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
