# Ad-hoc exploration script kept as the record of how the exploration figures in README.md were taken.
# Run from the repository root: python docs/benchmarks/cpu-2026-12-01-granian/<this file> ...
"""Exploration: one gateway variant at a time (uvicorn or granian with kwargs) vs stub, wrk c=1 and c=32."""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.getcwd())
from benchmarks.passthrough_wrk.overhead import Proc

from benchmarks.harness import free_port as _free_port
from benchmarks.passthrough_wrk import _body, _lua, _wrk

logs = Path("/tmp/pt2x/logs")
logs.mkdir(exist_ok=True)
body = logs / "body.json"
body.write_bytes(_body(100, 10))
lua = logs / "plain.lua"
lua.write_text(_lua(body, {"Content-Type": "application/json"}))
variants = json.loads(sys.argv[1])  # {"name": {"runner": "uvicorn"} | {"runner":"granian", "kw": {...}}}
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
secs = float(sys.argv[3]) if len(sys.argv) > 3 else 3
sp = _free_port()
procs = {
    "stub": Proc(
        "stub", [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp), "--keep-alive-s", "600"], logs
    )
}
urls = {"stub": f"http://127.0.0.1:{sp}/v2/rerank"}
cfg = logs / "gw.toml"
cfg.write_text(
    '[logging]\nlevel = "WARNING"\n\n[[models]]\nname = "rerank"\nengine = "pool"\nprotocol = "cohere"\n'
    f'urls = ["http://127.0.0.1:{sp}"]\nmodel = "stub"\nmax_connections = 64\n'
)
try:
    for name, v in variants.items():
        port = _free_port()
        if v["runner"] == "uvicorn":
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)]
        else:
            kw = dict(v.get("kw", {}))
            code = (
                "import json,sys; from granian import Granian; "
                f"Granian('gateway.app:create_app', factory=True, address='127.0.0.1', port={port}, interface=json.loads(sys.argv[1]).pop('interface','asgi'), log_level='warning', **{{k:v for k,v in json.loads(sys.argv[1]).items() if k!='interface'}}).serve()"
            )
            argv = [sys.executable, "-c", code, json.dumps(kw)]
        procs[name] = Proc(name, argv, logs, env={"RERANK_CONFIG": str(cfg)})
        urls[name] = f"http://127.0.0.1:{port}/v2/rerank"
    procs["stub"].wait_http(f"http://127.0.0.1:{sp}/health")
    for n in variants:
        procs[n].wait_http(urls[n].replace("/v2/rerank", "/ready"))
    import signal

    from benchmarks.passthrough_wrk import _signal_tree

    targets = ["stub", *variants]
    for t in targets:
        _wrk(urls[t], lua, 4, 1.0)
    res = {}
    for rnd in range(rounds):
        for c in (1, 32):
            order = targets[rnd % len(targets) :] + targets[: rnd % len(targets)]
            for t in order:
                paused = [procs[o] for o in targets if o not in (t, "stub")]
                for o in paused:
                    _signal_tree(o, signal.SIGSTOP)
                c0 = procs[t].cpu_s()
                try:
                    r = _wrk(urls[t], lua, c, secs)
                finally:
                    c1 = procs[t].cpu_s()
                    for o in paused:
                        _signal_tree(o, signal.SIGCONT)
                cpu = (c1 - c0) / max(1, r["requests"]) * 1e3
                print(
                    f"r{rnd} c={c:>2} {t:<14} {r['req_s']:8.0f} req/s p50 {r['p50_ms']:6.2f} p99 {r['p99_ms']:6.2f} cpu {cpu:.3f} err {r['errors']}",
                    flush=True,
                )
finally:
    for p in procs.values():
        p.stop()
