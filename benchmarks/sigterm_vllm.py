"""How long a gateway with a vLLM engine takes to exit on SIGTERM, and what it logs meanwhile.

Starts ``rerank-gateway serve`` (from ``--root``, so two checkouts can be compared in one run)
with one ``vllm-score`` model on the tiny random Qwen3 checkpoint, waits until it is ready,
scores one request, sends SIGTERM and measures the time to exit, the exit status and whether
the output after the signal holds a traceback or ``EngineDeadError``. The time is split by the
gateway's own log lines: draining (signal to ``gateway_stopping``), stopping the engines (to
``gateway_stopped``) and the rest (process teardown, to exit). Engine processes (vLLM's engine
core and worker) still alive once the gateway has exited are counted. Writes JSON + Markdown.

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
import psutil


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure(root: Path, tiny: Path, work: Path) -> dict[str, object]:
    port = _free_port()
    config = work / f"g-{port}.toml"
    config.write_text(
        f'[logging]\nformat = "json"\n\n[[models]]\nname = "vs"\nengine = "vllm-score"\npath = "{tiny}"\nmax_length = 256\n'
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
        # vLLM's engine core and its worker (named VLLM::EngineCore, VLLM::Worker), by pid and name.
        engines = [(p, p.name()) for p in psutil.Process(proc.pid).children(recursive=True) if "VLLM" in p.name()]
        mark = log.stat().st_size
        t0, wall0 = time.monotonic(), time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        took = time.monotonic() - t0
        left = [name for p, name in engines if _alive(p)]
    after = log.read_bytes()[mark:].decode(errors="replace")
    at = _event_times(after)
    phases = {}
    if "gateway_stopping" in at and "gateway_stopped" in at:
        phases = {
            "drain_s": round(at["gateway_stopping"] - wall0, 2),
            "engines_stop_s": round(at["gateway_stopped"] - at["gateway_stopping"], 2),
            "after_stopped_s": round(wall0 + took - at["gateway_stopped"], 2),
        }
    return {
        "exit_s": round(took, 2),
        **phases,
        "engine_processes": [name for _, name in engines],
        "engine_processes_left_after_exit": left,
        "returncode": rc,
        "traceback_after_sigterm": "Traceback" in after or '"exception"' in after,
        "engine_dead_error_after_sigterm": "EngineDeadError" in after,
        "lines_after_sigterm": len(after.splitlines()),
        "output_after_sigterm_tail": after[-1500:],
    }


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _event_times(text: str) -> dict[str, float]:
    """Wall-clock time of each gateway event in the JSON log (first occurrence)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("{") and '"event"' in line:
            try:
                rec = json.loads(line)
                when = dt.datetime.fromisoformat(rec["timestamp"]).timestamp()
            except (ValueError, KeyError):
                continue
            out.setdefault(str(rec["event"]), when)
    return out


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
        "checkouts": ", ".join(args.label),
        "results": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sigterm_vllm.json").write_text(json.dumps(doc, indent=1))
    rows = [
        f"| {name} | {r['exit_s']} | {r.get('drain_s')} | {r.get('engines_stop_s')} | {r.get('after_stopped_s')} | "
        f"{r['returncode']} | {len(r['engine_processes_left_after_exit'])} of {len(r['engine_processes'])} | "
        f"{r['engine_dead_error_after_sigterm']} | {r['traceback_after_sigterm']} |"
        for name, rs in results.items() for r in rs
    ]
    (out / "sigterm_vllm.md").write_text(
        f"# SIGTERM with a vLLM engine ({doc['date']})\n\n{doc['machine']}, vllm {doc['vllm']}; "
        f"`{doc['command']}`\n\n{doc['checkouts']}\n\nSIGTERM after one scored request, no request in flight. Phases from the gateway's "
        "log: drain (signal to `gateway_stopping`), engines (to `gateway_stopped`), after (to process exit).\n\n"
        "| checkout | exit s | drain s | engines s | after s | exit status | engine processes left | EngineDeadError | traceback |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
    )
    print((out / "sigterm_vllm.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
