"""The run: the stub, the gateways and LiteLLM started, wrk rounds over every target and
concurrency level (the others stopped meanwhile), then the report written.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Proc, free_port, tree
from benchmarks.passthrough_wrk.report import TARGETS, render, summarize
from benchmarks.passthrough_wrk.wrk import _body, _lua, _wrk


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _switches(proc: Proc) -> int:
    """Voluntary context switches of every thread of the process tree: how often it went to sleep
    (waiting for a socket, another thread, the GIL). One client's request costs a wake-up per sleep."""
    total = 0
    for pid in tree(proc.proc.pid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", (task / "status").read_text(), re.MULTILINE)
                total += int(m.group(1)) if m else 0
    return total


def _signal_tree(proc: Proc, sig: int) -> None:
    for pid in tree(proc.proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# --client python: the aiohttp client in a process of its own (its CPU is not the target's).


def _pyclient(url: str, body: Path, clients: int, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.passthrough_wrk.pyclient", url, str(body), str(clients), str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 60, cwd=ROOT).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# The package's docstring is the run's description (``--help`` shows it).
_SUITE_DOC = sys.modules[__package__].__doc__


def main() -> int:
    ap = argparse.ArgumentParser(description=_SUITE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/passthrough-wrk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="wrk duration per run")
    ap.add_argument("--clients", default="1,32")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="N of the N-worker gateway")
    ap.add_argument("--documents", type=int, default=100)
    ap.add_argument("--top-n", type=int, default=10)
    ap.add_argument(
        "--before",
        help="a checkout of an earlier commit (git archive COMMIT | tar -x -C DIR): "
        "its gateway, one worker, joins the comparison as gateway-before",
    )
    ap.add_argument("--litellm-venv", default=os.environ.get("LITELLM_VENV", "/tmp/litellm-venv"))
    ap.add_argument(
        "--no-pause",
        action="store_true",
        help="leave the other targets running during each run (by default they are stopped with "
        "SIGSTOP: an idle LiteLLM proxy keeps using CPU, which moved the 1-client figures of the others)",
    )
    ap.add_argument(
        "--chain",
        action="store_true",
        help='add gateway-chain-1w: the same pool model behind a fallback chain (engine = "chain", a '
        "second replica target), side by side with gateway-1w: a healthy chain's overhead",
    )
    ap.add_argument("--targets", default="", help="comma-separated targets to run (default: all); the stub always runs")
    ap.add_argument(
        "--client",
        choices=("wrk", "python"),
        default="wrk",
        help="python: benchmarks.passthrough_wrk.pyclient (aiohttp) where wrk is not installed; "
        "compare only figures taken with the same client",
    )
    args = ap.parse_args()
    if args.client == "wrk" and shutil.which("wrk") is None:
        print("wrk is missing: apt-get install -y wrk (or --client python)", file=sys.stderr)
        return 2
    out = Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out
    logs = ROOT / "bench-out" / "passthrough-wrk-logs"
    out.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    body = logs / "body.json"
    body.write_bytes(_body(args.documents, args.top_n))
    key = "sk-bench-" + secrets.token_hex(16)
    scripts = {"plain": logs / "plain.lua", "litellm": logs / "litellm.lua"}
    scripts["plain"].write_text(_lua(body, {"Content-Type": "application/json"}))
    scripts["litellm"].write_text(_lua(body, {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}))

    procs: dict[str, Proc] = {}
    urls: dict[str, str] = {}
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "workload": {
            "documents": args.documents,
            "top_n": args.top_n,
            "body_bytes": body.stat().st_size,
            "seconds_per_run": args.seconds,
            "rounds": args.rounds,
            "clients": clients,
            "workers": args.workers,
        },
        "command": " ".join(["python -m benchmarks.passthrough_wrk", *sys.argv[1:]]),
        "client": args.client,
        "runs": [],
    }
    try:
        sp = free_port()
        procs["stub"] = Proc(
            [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp), "--keep-alive-s", "600"],
            logs / "stub.log",
        )
        urls["stub"] = f"http://127.0.0.1:{sp}/v2/rerank"
        gateways = [("gateway-1w", 1, ROOT), ("gateway-Nw", args.workers, ROOT)]
        if args.before:
            gateways.insert(0, ("gateway-before", 1, Path(args.before).resolve()))
        if args.chain:
            gateways.append(("gateway-chain-1w", 1, ROOT))
        if args.targets:
            wanted = set(args.targets.split(","))
            gateways = [g for g in gateways if g[0] in wanted]
        for name, workers, cwd in gateways:
            port = free_port()
            cfg = logs / f"{name}.toml"
            server = [f"workers = {workers}"] if workers > 1 else []
            pool = f'engine = "pool"\nprotocol = "cohere"\nurls = ["http://127.0.0.1:{sp}"]\nmodel = "stub"\nmax_connections = 64\n'
            # The chain: the same pool model as its first target (a second replica behind it, never
            # used while the first is healthy), so the pair differs by the chain's routing alone.
            models = (
                '[[models]]\nname = "rerank"\nengine = "chain"\ntargets = ["rerank-local", "rerank-spare"]\n'
                f'accepts = "replicas"\n\n[[models]]\nname = "rerank-local"\n{pool}\n[[models]]\nname = "rerank-spare"\n{pool}'
                if name == "gateway-chain-1w"
                else f'[[models]]\nname = "rerank"\n{pool}'
            )
            cfg.write_text(
                ("[server]\n" + "\n".join(server) + "\n\n" if server else "")
                + '[logging]\nlevel = "WARNING"\n\n'
                + models
            )
            procs[name] = Proc(
                [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)],
                logs / f"{name}.log",
                cwd=cwd,
            )
            urls[name] = f"http://127.0.0.1:{port}/v2/rerank"
        exe = Path(args.litellm_venv) / "bin" / "litellm"
        if exe.exists() and args.client == "wrk":  # the python client sends no LiteLLM key
            lp = free_port()
            (logs / "litellm.yaml").write_text(
                "model_list:\n  - model_name: rerank\n    litellm_params:\n      model: cohere/rerank-v3.5\n"
                f"      api_base: http://127.0.0.1:{sp}\n      api_key: sk-stub\n"
            )
            procs["litellm"] = Proc(
                [str(exe), "--config", str(logs / "litellm.yaml"), "--port", str(lp), "--num_workers", "1"],
                logs / "litellm.log",
                # The bundled cost map: no network fetch at start (this box has none).
                env={"LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            )
            urls["litellm"] = f"http://127.0.0.1:{lp}/v2/rerank"
            ver = subprocess.run(
                [
                    str(Path(args.litellm_venv) / "bin" / "python"),
                    "-c",
                    "import importlib.metadata as m; print(m.version('litellm'))",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            results["litellm_version"] = ver.stdout.strip()
        else:
            print(f"no LiteLLM at {exe}: gateway only", flush=True)
        procs["stub"].wait_http(f"http://127.0.0.1:{sp}/health")
        for name, *_ in gateways:
            procs[name].wait_http(urls[name].replace("/v2/rerank", "/ready"))
        if "litellm" in procs and (not args.targets or "litellm" in args.targets.split(",")):
            procs["litellm"].wait_http(urls["litellm"].replace("/v2/rerank", "/health/liveliness"), timeout=900)
        targets = ["stub", *[t for t in TARGETS if t in procs and (not args.targets or t in args.targets.split(","))]]

        def load(t: str, c: int, seconds: float) -> dict[str, Any]:
            if args.client == "python":
                return _pyclient(urls[t], body, c, seconds)
            return _wrk(urls[t], scripts["litellm" if t == "litellm" else "plain"], c, seconds)

        for t in targets:  # warm-up: connections, lazy imports, first-request paths
            load(t, 4, 1.0)

        idle0 = {t: procs[t].cpu_s() for t in targets}  # share of a core each uses while nobody sends it anything
        time.sleep(3)
        results["idle_cpu_share"] = {t: round((procs[t].cpu_s() - idle0[t]) / 3, 4) for t in targets}
        results["other_targets_paused"] = not args.no_pause
        print(f"idle CPU (share of a core): {results['idle_cpu_share']}", flush=True)

        for rnd in range(args.rounds):
            for c in clients:
                order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
                for t in order:
                    # The stub serves every target, so it always runs; the other proxies wait stopped.
                    paused = [] if args.no_pause else [procs[o] for o in targets if o not in (t, "stub")]
                    for other in paused:
                        _signal_tree(other, signal.SIGSTOP)
                    load0 = _loadavg()
                    cpu0, sw0 = procs[t].cpu_s(), _switches(procs[t])
                    try:
                        res = load(t, c, args.seconds)
                    finally:
                        cpu1, sw1 = procs[t].cpu_s(), _switches(procs[t])
                        for other in paused:
                            _signal_tree(other, signal.SIGCONT)
                    res.update(
                        round=rnd,
                        clients=c,
                        target=t,
                        loadavg_before=load0,
                        loadavg_after=_loadavg(),
                        cpu_ms_per_request=(cpu1 - cpu0) / max(1, res["requests"]) * 1e3,
                        switches_per_request=(sw1 - sw0) / max(1, res["requests"]),
                    )
                    results["runs"].append(res)
                    print(
                        f"round {rnd} c={c:>2} {t:<18} {res['req_s']:8.1f} req/s  p50 {res.get('p50_ms', 0):6.2f} ms  "
                        f"cpu {res['cpu_ms_per_request']:.3f} ms/req  sleeps {res['switches_per_request']:.1f}/req  errors {res['errors']}  load {load0[0]}",
                        flush=True,
                    )

    finally:
        for p in procs.values():
            p.stop()
    results["summary"] = summarize(results["runs"], clients)
    (out / "passthrough_wrk.json").write_text(json.dumps(results, indent=1))
    (out / "passthrough_wrk.md").write_text(render(results))
    print(json.dumps(results["summary"], indent=1))
    print(f"wrote {out}")
    return 0
