"""Passthrough at 1 and 32 clients with wrk: the gateway's pool engine (1 and N workers) vs LiteLLM.

    .venv/bin/python -m benchmarks.passthrough_wrk --out docs/benchmarks/cpu-$(date +%F)

All targets sit in front of the same zero-work Cohere-shaped stub (``benchmarks.stub_upstream``)
on loopback and get the same 100-document body with ``top_n`` = 10. wrk (Debian package ``wrk``;
C, one thread, a few µs of CPU per request) is the client, so the client's own cost barely
shows. For every round, concurrency level and target (order rotated each round), one bounded
wrk run is made and the CPU seconds the target's process tree used during it are read from
/proc: CPU per request is that over the requests wrk completed. Ratios are taken per round
(the pair ran seconds apart) and the report gives their median, since the box is shared.

Targets: the bare stub (the upstream alone, for added latency), the gateway with
``server.workers = 1`` and ``= N`` under uvicorn (``gateway-1w``, ``gateway-Nw``) and, with
``--runners uvicorn,granian``, the same configs under ``server.runner = "granian"``
(``gateway-granian-1w``, ``gateway-granian-Nw``), LiteLLM proxy with one worker (``LITELLM_VENV``: a venv
holding ``litellm[proxy]``; it is not a dependency of this project). A py-spy profile of the
one-worker gateway at 32 clients (when py-spy is installed) is grouped by component.
Writes ``passthrough_wrk.json`` and ``passthrough_wrk.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_overhead import ROOT, Proc, _free_port

__all__ = ("main", "parse_wrk")

GATEWAYS = ("gateway-before", "gateway-1w", "gateway-Nw", "gateway-granian-1w", "gateway-granian-Nw")
TARGETS = (*GATEWAYS, "litellm")
# The one-worker targets whose 1-client p50 is compared with the stub's (the latency target).
ONE_WORKER = ("gateway-1w", "gateway-granian-1w")

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
        lm = re.search(rf"^\s+{pct}(?:\.000)?%\s+(\S+)", out, re.M)
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


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def _wrk(url: str, script: Path, clients: int, seconds: float, timeout_s: float = 10.0) -> dict[str, Any]:
    cmd = ["wrk", "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", f"--timeout={round(timeout_s)}s", "--latency", "-s", str(script), url]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    return parse_wrk(out)


def _profile(pid: int, seconds: float, out_path: Path) -> dict[str, float] | None:
    """py-spy samples of a process tree grouped by component (share of samples), or None."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        return None
    subprocess.run([exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
                    "--nonblocking", "--format", "raw", "--output", str(out_path)],
                   capture_output=True, check=False, timeout=seconds + 60)
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


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers, LiteLLM's children) from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _switches(proc: Proc) -> int:
    """Voluntary context switches of every thread of the process tree: how often it went to sleep
    (waiting for a socket, another thread, the GIL). One client's request costs a wake-up per sleep."""
    total = 0
    for pid in _tree(proc.proc.pid):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                status = (task / "status").read_text()
            except OSError:
                continue
            m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)
            total += int(m.group(1)) if m else 0
    return total


def _signal_tree(proc: Proc, sig: int) -> None:
    for pid in _tree(proc.proc.pid):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _idle_cpu(procs: dict[str, Proc], seconds: float = 3.0) -> dict[str, float]:
    """Share of a core each target uses while nobody sends it anything."""
    before = {n: p.cpu_s() for n, p in procs.items()}
    time.sleep(seconds)
    return {n: round((p.cpu_s() - before[n]) / seconds, 4) for n, p in procs.items()}


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench-out/passthrough-wrk")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="wrk duration per run")
    ap.add_argument("--clients", default="1,32")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="N of the N-worker gateway")
    ap.add_argument("--documents", type=int, default=100)
    ap.add_argument("--top-n", type=int, default=10)
    ap.add_argument("--profile-seconds", type=float, default=8.0, help="0: no py-spy profile")
    ap.add_argument("--before", help="a checkout of an earlier commit (git archive COMMIT | tar -x -C DIR): "
                    "its gateway, one worker, joins the comparison as gateway-before")
    ap.add_argument("--runners", default="uvicorn",
                    help="comma-separated server.runner values; granian adds gateway-granian-1w and -Nw")
    ap.add_argument("--litellm-venv", default=os.environ.get("LITELLM_VENV", "/tmp/litellm-venv"))
    ap.add_argument("--spinners", type=int, default=0,
                    help="busy loops at nice 19 during the rounds: keeps idle vCPUs from sleeping, to see how much "
                    "of the 1-client latency is wake-up cost rather than work")
    ap.add_argument("--no-pause", action="store_true",
                    help="leave the other targets running during each run (by default they are stopped with "
                    "SIGSTOP: an idle LiteLLM proxy keeps using CPU, which moved the 1-client figures of the others)")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        print("wrk is missing: apt-get install -y wrk", file=sys.stderr)
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
        "machine": {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version()},
        "workload": {"documents": args.documents, "top_n": args.top_n, "body_bytes": body.stat().st_size,
                     "seconds_per_run": args.seconds, "rounds": args.rounds, "clients": clients,
                     "workers": args.workers},
        "runners": args.runners.split(","),
        "command": " ".join(["python -m benchmarks.passthrough_wrk", *sys.argv[1:]]),
        "runs": [],
    }
    try:
        sp = _free_port()
        procs["stub"] = Proc("stub", [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp), "--keep-alive-s", "600"], logs)
        urls["stub"] = f"http://127.0.0.1:{sp}/v2/rerank"
        runners = [r.strip() for r in args.runners.split(",") if r.strip()]
        gateways = []
        for runner in runners:
            prefix = "gateway" if runner == "uvicorn" else f"gateway-{runner}"
            gateways += [(f"{prefix}-1w", 1, ROOT, runner), (f"{prefix}-Nw", args.workers, ROOT, runner)]
        if args.before:
            gateways.insert(0, ("gateway-before", 1, Path(args.before).resolve(), "uvicorn"))
        for name, workers, cwd, runner in gateways:
            port = _free_port()
            cfg = logs / f"{name}.toml"
            server = ([f"workers = {workers}"] if workers > 1 else []) + ([f'runner = "{runner}"'] if runner != "uvicorn" else [])
            cfg.write_text(
                ("[server]\n" + "\n".join(server) + "\n\n" if server else "") + "[logging]\nlevel = \"WARNING\"\n\n"
                f'[[models]]\nname = "rerank"\nengine = "pool"\nprotocol = "cohere"\n'
                f'urls = ["http://127.0.0.1:{sp}"]\nmodel = "stub"\nmax_connections = 64\n'
            )
            procs[name] = Proc(name, [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)],
                               logs, cwd=cwd)
            urls[name] = f"http://127.0.0.1:{port}/v2/rerank"
        exe = Path(args.litellm_venv) / "bin" / "litellm"
        if exe.exists():
            lp = _free_port()
            (logs / "litellm.yaml").write_text(
                "model_list:\n  - model_name: rerank\n    litellm_params:\n      model: cohere/rerank-v3.5\n"
                f"      api_base: http://127.0.0.1:{sp}\n      api_key: sk-stub\n"
            )
            procs["litellm"] = Proc("litellm", [str(exe), "--config", str(logs / "litellm.yaml"), "--port", str(lp),
                                                "--num_workers", "1"], logs,
                                    # The bundled cost map: no network fetch at start (this box has none).
                                    env={"LITELLM_MASTER_KEY": key, "LITELLM_LOG": "ERROR",
                                         "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
            urls["litellm"] = f"http://127.0.0.1:{lp}/v2/rerank"
            ver = subprocess.run([str(Path(args.litellm_venv) / "bin" / "python"), "-c",
                                  "import importlib.metadata as m; print(m.version('litellm'))"],
                                 capture_output=True, text=True, check=False)
            results["litellm_version"] = ver.stdout.strip()
        else:
            print(f"no LiteLLM at {exe}: gateway only", flush=True)
        procs["stub"].wait_http(f"http://127.0.0.1:{sp}/health")
        for name, *_ in gateways:
            procs[name].wait_http(urls[name].replace("/v2/rerank", "/ready"))
        if "litellm" in procs:
            procs["litellm"].wait_http(urls["litellm"].replace("/v2/rerank", "/health/liveliness"), timeout=900)
        targets = ["stub", *[t for t in TARGETS if t in procs]]
        for t in targets:  # warm-up: connections, lazy imports, first-request paths
            _wrk(urls[t], scripts["litellm" if t == "litellm" else "plain"], 4, 1.0)

        results["idle_cpu_share"] = _idle_cpu({t: procs[t] for t in targets})
        results["spinners"] = args.spinners
        spinners = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
                    for _ in range(args.spinners)]
        results["other_targets_paused"] = not args.no_pause
        print(f"idle CPU (share of a core): {results['idle_cpu_share']}", flush=True)

        for rnd in range(args.rounds):
            for c in clients:
                order = targets[rnd % len(targets):] + targets[: rnd % len(targets)]
                for t in order:
                    # The stub serves every target, so it always runs; the other proxies wait stopped.
                    paused = [] if args.no_pause else [procs[o] for o in targets if o not in (t, "stub")]
                    for other in paused:
                        _signal_tree(other, signal.SIGSTOP)
                    load0 = _loadavg()
                    cpu0, sw0 = procs[t].cpu_s(), _switches(procs[t])
                    try:
                        res = _wrk(urls[t], scripts["litellm" if t == "litellm" else "plain"], c, args.seconds)
                    finally:
                        cpu1, sw1 = procs[t].cpu_s(), _switches(procs[t])
                        for other in paused:
                            _signal_tree(other, signal.SIGCONT)
                    res.update(round=rnd, clients=c, target=t, loadavg_before=load0, loadavg_after=_loadavg(),
                               cpu_ms_per_request=(cpu1 - cpu0) / max(1, res["requests"]) * 1e3,
                               switches_per_request=(sw1 - sw0) / max(1, res["requests"]))
                    results["runs"].append(res)
                    print(f"round {rnd} c={c:>2} {t:<18} {res['req_s']:8.1f} req/s  p50 {res.get('p50_ms', 0):6.2f} ms  "
                          f"cpu {res['cpu_ms_per_request']:.3f} ms/req  sleeps {res['switches_per_request']:.1f}/req  errors {res['errors']}  load {load0[0]}", flush=True)

        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        if args.profile_seconds > 0 and "gateway-1w" in procs:
            prof_out = logs / "gateway-1w.pyspy.txt"
            proc = subprocess.Popen(["wrk", "-t1", "-c32", f"-d{round(args.profile_seconds) + 4}s", "-s", str(scripts["plain"]),
                                     urls["gateway-1w"]], stdout=subprocess.DEVNULL)
            time.sleep(1)
            results["profile_gateway_1w_32_clients"] = _profile(procs["gateway-1w"].proc.pid, args.profile_seconds, prof_out)
            proc.wait(timeout=60)
    finally:
        for p in procs.values():
            p.stop()
    results["summary"] = summarize(results["runs"], clients)
    (out / "passthrough_wrk.json").write_text(json.dumps(results, indent=1))
    (out / "passthrough_wrk.md").write_text(render(results))
    print(json.dumps(results["summary"], indent=1))
    print(f"wrote {out}")
    return 0


def _round_pairs(
    by: dict[tuple[str, int], list[dict[str, Any]]], a: tuple[str, int], b: tuple[str, int], rounds: list[int]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The runs of ``a`` and ``b`` (target, clients) made in the same round, round by round."""
    pairs = []
    for rnd in rounds:
        ra = [r for r in by[a] if r["round"] == rnd]
        rb = [r for r in by[b] if r["round"] == rnd]
        if ra and rb:
            pairs.append((ra[0], rb[0]))
    return pairs


def summarize(runs: list[dict[str, Any]], clients: list[int]) -> dict[str, Any]:
    """Medians per target and level, and medians of the per-round ratios."""
    by: dict[tuple[str, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in runs:
        by[(r["target"], r["clients"])].append(r)
    summary: dict[str, Any] = {}
    for (t, c), rs in sorted(by.items()):
        summary.setdefault(t, {})[str(c)] = {
            k: _median([r[k] for r in rs if k in r]) for k in ("req_s", "p50_ms", "p99_ms", "cpu_ms_per_request", "switches_per_request")
        } | {"errors": sum(r["errors"] for r in rs), "runs": len(rs)}
    ratios: dict[str, Any] = {}
    rounds = sorted({r["round"] for r in runs})
    for gw in GATEWAYS:
        for c in clients:
            pairs = _round_pairs(by, (gw, c), ("litellm", c), rounds)
            req = [a["req_s"] / b["req_s"] for a, b in pairs]
            cpu = [b["cpu_ms_per_request"] / a["cpu_ms_per_request"] for a, b in pairs]
            if req:
                ratios[f"{gw} c={c}"] = {"req_s_ratio": _median(req), "cpu_ratio": _median(cpu),
                                         "req_s_ratios": req, "cpu_ratios": cpu}
    summary["ratios_vs_litellm"] = ratios
    # Added latency at one client: median per round of (gateway p50 - stub p50).
    lo, hi = min(clients), max(clients)
    summary["added_p50_ms_1_client_by_target"], summary["cpu_growth_by_target"] = {}, {}
    summary["cpu_growth_of_medians_by_target"] = {}
    for gw in ONE_WORKER:
        added = [
            g["p50_ms"] - s["p50_ms"]
            for g, s in _round_pairs(by, (gw, 1), ("stub", 1), rounds)
            if "p50_ms" in g and "p50_ms" in s
        ]
        if added:
            summary["added_p50_ms_1_client_by_target"][gw] = _median(added)
        # CPU growth with load: the median of the per-round pairs (hi clients ÷ lo clients, the
        # two runs seconds apart), like every other ratio here; the ratio of the two medians
        # (what reports before 2026-12-01-direct gave) is kept beside it.
        growth = [
            h["cpu_ms_per_request"] / l_["cpu_ms_per_request"]
            for h, l_ in _round_pairs(by, (gw, hi), (gw, lo), rounds)
        ]
        if growth:
            summary["cpu_growth_by_target"][gw] = _median(growth)
        flat = [r["cpu_ms_per_request"] for r in by[(gw, hi)]], [r["cpu_ms_per_request"] for r in by[(gw, lo)]]
        if all(flat):
            summary["cpu_growth_of_medians_by_target"][gw] = _median(flat[0]) / _median(flat[1])
    # The names earlier reports used (uvicorn, one worker).
    summary["added_p50_ms_1_client"] = summary["added_p50_ms_1_client_by_target"].get("gateway-1w", float("nan"))
    if "gateway-1w" in summary["cpu_growth_by_target"]:
        summary["gateway_1w_cpu_growth"] = summary["cpu_growth_by_target"]["gateway-1w"]
    summary["loadavg_1min"] = {"min": min(r["loadavg_before"][0] for r in runs),
                               "median": _median([r["loadavg_before"][0] for r in runs]),
                               "max": max(r["loadavg_before"][0] for r in runs)}
    return summary


def render(results: dict[str, Any]) -> str:
    s = results["summary"]
    w = results["workload"]
    lines = [
        f"# Passthrough with wrk: gateway (pool engine) vs LiteLLM ({results['date'][:10]})",
        "",
        f"- Machine: {results['machine']['cpus']} CPUs, Python {results['machine']['python']}; shared with other work: "
        f"1-min load average during the runs {s['loadavg_1min']['min']:.2f}-{s['loadavg_1min']['max']:.2f} "
        f"(median {s['loadavg_1min']['median']:.2f}), so absolute figures are noisy; ratios are medians of per-round pairs.",
        f"- Workload: one {w['body_bytes']}-byte body, {w['documents']} documents, top_n {w['top_n']}; wrk -t1, "
        f"{w['seconds_per_run']:g} s per run, {w['rounds']} rounds, target order rotated each round; "
        f"N-worker gateway: {w['workers']} workers. LiteLLM {results.get('litellm_version', '(not run)')}, one worker.",
        f"- Command: `{results['command']}`",
        *([f"- During each run the other proxies were stopped (SIGSTOP; the stub always runs). Idle CPU, share "
           f"of a core, before the rounds: " + ", ".join(f"{k} {v:.3f}" for k, v in results["idle_cpu_share"].items())]
          if results.get("other_targets_paused") else []),
        *([f"- {results['spinners']} busy loops at nice 19 ran during the rounds (idle vCPUs kept awake)."]
          if results.get("spinners") else []),
        "",
        "| target | clients | req/s | p50 ms | p99 ms | CPU ms / request | voluntary context switches / request | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in ("stub", *TARGETS):
        for c, v in s.get(t, {}).items():
            lines.append(f"| {t} | {c} | {v['req_s']:.0f} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | "
                         f"{v['cpu_ms_per_request']:.3f} | {v.get('switches_per_request', float('nan')):.1f} | {v['errors']} |")
    lines += ["", "| gateway ÷ LiteLLM (median of rounds) | req/s | CPU per request, LiteLLM's ÷ ours |", "|---|---|---|"]
    for k, v in s["ratios_vs_litellm"].items():
        lines.append(f"| {k} | {v['req_s_ratio']:.2f}× | {v['cpu_ratio']:.2f}× |")
    lines.append("")
    for gw, v in s.get("added_p50_ms_1_client_by_target", {}).items():
        lines.append(f"Added p50 over the stub alone at 1 client ({gw}): {v:.2f} ms.")
    of_medians = s.get("cpu_growth_of_medians_by_target", {})
    for gw, v in s.get("cpu_growth_by_target", {}).items():
        extra = f" (ratio of the two medians: {of_medians[gw]:.3f})" if gw in of_medians else ""
        lines.append(
            f"{gw} CPU per request, {max(w['clients'])} clients ÷ {min(w['clients'])} client, median of per-round "
            f"pairs: {v:.3f}{extra}."
        )
    prof = results.get("profile_gateway_1w_32_clients")
    if prof:
        lines += ["", "py-spy profile of gateway-1w at 32 clients (share of samples, innermost known frame):", "",
                  "| component | share |", "|---|---|"]
        lines += [f"| {k} | {v:.1%} |" for k, v in prof.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
