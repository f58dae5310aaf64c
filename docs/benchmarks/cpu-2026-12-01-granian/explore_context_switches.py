# Ad-hoc exploration script kept as the record of how the exploration figures in README.md were taken.
# Run from the repository root: python docs/benchmarks/cpu-2026-12-01-granian/<this file> ...
import json
import os
import sys

sys.path.insert(0, os.getcwd())
from pathlib import Path

from benchmarks.passthrough_wrk.overhead import Proc

from benchmarks.harness import free_port as _free_port
from benchmarks.passthrough_wrk import _body, _lua, _tree, _wrk

logs = Path("/tmp/pt2x/logs2")
logs.mkdir(exist_ok=True)
body = logs / "body.json"
body.write_bytes(_body(100, 10))
lua = logs / "plain.lua"
lua.write_text(_lua(body, {"Content-Type": "application/json"}))
sp = _free_port()
procs = {
    "stub": Proc(
        "stub", [sys.executable, "-m", "benchmarks.stub_upstream", "--port", str(sp), "--keep-alive-s", "600"], logs
    )
}
urls = {}


def ctx(pid):
    tot = [0, 0, 0]
    for p in _tree(pid):
        for t in Path(f"/proc/{p}/task").glob("*"):
            try:
                st = (t / "status").read_text()
            except OSError:
                continue
            tot[0] += int(st.split("voluntary_ctxt_switches:")[1].split()[0])
            tot[1] += int(st.split("nonvoluntary_ctxt_switches:")[1].split()[0])
            tot[2] += 1
    return tot


try:
    V = json.loads(sys.argv[1])
    for runner, kw in V.items():
        port = _free_port()
        cfg = logs / f"{runner}.toml"
        cfg.write_text(
            (f'[server]\nrunner = "{runner}"\n\n')
            + '[logging]\nlevel = "WARNING"\n\n[[models]]\nname = "rerank"\nengine = "pool"\nprotocol = "cohere"\n'
            f'urls = ["http://127.0.0.1:{sp}"]\nmodel = "stub"\nmax_connections = 64\n'
        )
        cfg.write_text(cfg.read_text().replace(f'[server]\nrunner = "{runner}"\n\n', ""))
        if kw is None:
            argv = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--port", str(port)]
        else:
            code = (
                "import json,sys; from granian import Granian; "
                f"Granian('gateway.app:create_app', factory=True, address='127.0.0.1', port={port}, interface='asgi', log_level='warning', **json.loads(sys.argv[1])).serve()"
            )
            argv = [sys.executable, "-c", code, json.dumps(kw)]
        procs[runner] = Proc(runner, argv, logs, env={"RERANK_CONFIG": str(cfg)})
        urls[runner] = f"http://127.0.0.1:{port}/v2/rerank"
    for r in V:
        procs[r].wait_http(urls[r].replace("/v2/rerank", "/ready"))
    for rnd in range(2):
        for r in V:
            _wrk(urls[r], lua, 1, 1)
            a = ctx(procs[r].proc.pid)
            c0 = procs[r].cpu_s()
            res = _wrk(urls[r], lua, 1, 3)
            b = ctx(procs[r].proc.pid)
            c1 = procs[r].cpu_s()
            n = res["requests"]
            print(
                f"{r:<8} threads {b[2]:>3} p50 {res['p50_ms']:.2f} cpu {(c1 - c0) / n * 1e3:.3f} ms  vol ctx/req {(b[0] - a[0]) / n:.2f}  invol/req {(b[1] - a[1]) / n:.2f}",
                flush=True,
            )
finally:
    for p in procs.values():
        p.stop()
