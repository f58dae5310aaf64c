"""What the suites share to run servers on loopback: the checkout's root, a free port, waiting for
an HTTP 200, a gateway as its own process (``Gateway``), ``rerank-gateway bench`` for one level
(``bench_level``), GPU memory. Stdlib only at import. Latency percentiles, summaries, the environment
record and the bench's own JSON / Markdown are ``gateway.bench.report``'s; ``table`` writes the
suites' Markdown tables from rows, ``serve`` runs one gateway through a measurement.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

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


def in_order(results: list[dict[str, Any]], n: int) -> list[float]:
    """A Cohere-shaped answer's ``results`` as scores in the documents' order (0 for one left out)."""
    out = [0.0] * n
    for item in results:
        out[item["index"]] = float(item["relevance_score"])
    return out


def bench_level(url: str, model: str, tokenizer: Path, out: Path, **opts: Any) -> dict[str, Any]:
    """``rerank-gateway bench`` for one level, a separate client process (its CPU is not the gateway's);
    ``opts`` are its options (``doc_tokens="50-150"``: ``--doc-tokens 50-150``). The level's summary,
    every request counted."""
    import json
    import sys

    argv = [sys.executable, "-m", "gateway", "bench", url, "--model", model, "--tokenizer", str(tokenizer)]
    options: dict[str, Any] = {"query_tokens": "10", "warmup": 4, **opts}
    for k, v in options.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    subprocess.run([*argv, "--no-progress", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    (s,) = json.loads((out / "bench.json").read_text())["summaries"]
    return dict(s)


def toml_value(value: Any) -> str:
    """``value`` in TOML: a scalar or a list as JSON spells it (the same in TOML), a dict as an
    inline table (``engine_args = {block_size = 32}``)."""
    import json

    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table's lines: a cell is written as given (``str``), a row shorter than the header is padded."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in r + [""] * (len(header) - len(r))) + " |" for r in rows]


def serve(
    name: str,
    models: list[dict[str, Any]],
    work: Path,
    results: dict[str, Any],
    measure: Any,
    *,
    need_s: float,
    deadline: float,
    log: Any,
    env: dict[str, str] | None = None,
) -> None:
    """One gateway process serving ``models``, entered as ``results["runs"][name]`` and measured by
    ``measure(gw, entry, ready_body)``: skipped and listed where ``need_s`` would pass ``deadline``;
    its start time and GPU memory once ready; an error recorded, not raised (one runtime failing
    must not lose the others' figures); the log's tail."""
    if deadline - time.time() < need_s:
        results["skipped"].append(f"{name}: {deadline - time.time():.0f}s left, needs ~{need_s:.0f}s")
        log("SKIP", results["skipped"][-1])
        results["runs"].pop(name, None)
        return
    gw = Gateway(name, models, work, env=env)
    entry: dict[str, Any] = results["runs"].setdefault(name, {})
    try:
        body = gw.ready(timeout=max(30.0, min(300.0, deadline - time.time() - 20)))
        entry["start_s"] = time.time() - gw.t0
        entry["gpu_ready_mib"] = gpu_mem_mib() - gw.base_mib if gw.base_mib >= 0 else None
        log(f"{name}: ready in {entry['start_s']:.0f}s, GPU {entry['gpu_ready_mib']} MiB")
        measure(gw, entry, body)
    except Exception as exc:  # noqa: BLE001
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        log(f"ERROR {name}: {entry['error']}")
    finally:
        entry["log_tail"] = gw.stop()


def cpu_machine() -> str:
    """This machine's CPUs for a report: count and model (from /proc/cpuinfo), shared with others."""
    model = "unknown"
    try:
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            model,
        )
    except OSError:  # not Linux
        pass
    return f"{os.cpu_count()} CPUs ({model}), shared"


def smi(*args: str) -> str:
    """``nvidia-smi ARGS``' output; empty where there is no NVIDIA driver (a run on CPU)."""
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return ""


def gpu_mem_mib() -> int:
    """GPU memory in use on the first GPU (MiB), -1 without one."""
    out = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").split()
    return int(out[0]) if out else -1


class Gateway:
    """``python -m gateway serve`` with ``models`` on a free port, its log in ``work``; ``env`` adds variables.
    The benchmark's own process never touches CUDA: an engine starts as it would in production."""

    def __init__(self, name: str, models: list[dict[str, Any]], work: Path, env: dict[str, str] | None = None) -> None:
        import json
        import os
        import sys

        self.port = free_port()
        self.name, self.url = name, f"http://127.0.0.1:{self.port}"
        cfg, self.log_path = (work / f"{name.replace(' ', '_')}.{ext}" for ext in ("toml", "log"))
        tables = {"server": {"host": "127.0.0.1", "port": self.port}, "logging": {"level": "WARNING"}}
        lines = [
            line for t, kv in tables.items() for line in [f"[{t}]", *(f"{k} = {json.dumps(v)}" for k, v in kv.items())]
        ]
        for m in models:
            lines += ["[[models]]", *(f"{k} = {toml_value(v)}" for k, v in m.items())]
        cfg.write_text("\n".join(lines) + "\n")
        self.base_mib = gpu_mem_mib()
        self.t0 = time.time()
        self.log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(cfg)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "true", **(env or {})},
            cwd=ROOT,
        )

    def ready(self, timeout: float) -> dict[str, Any]:
        """``/ready``'s body once every model is ready; raises when one failed or the process exited."""
        import json

        while time.time() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: gateway exited {self.proc.returncode}")
            body = self.status()
            if body and body.get("status") == "ready":
                return body
            if body and any(m.get("state") == "failed" for m in body.get("models", [])):
                raise RuntimeError(f"{self.name}: {json.dumps(body['models'])[:1500]}")
            time.sleep(0.5)
        raise TimeoutError(f"{self.name}: not ready after {timeout:.0f}s")

    def status(self) -> dict[str, Any] | None:
        import json
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/ready", timeout=5) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:
            return dict(json.loads(e.read()))
        except OSError:
            return None

    def rerank(self, model: str, query: str, docs: list[str], timeout: float = 120) -> list[float]:
        """``/v1/rerank``'s scores in the documents' order."""
        import json
        import urllib.request

        body = json.dumps({"model": model, "query": query, "documents": docs}).encode()
        req = urllib.request.Request(self.url + "/v1/rerank", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return in_order(json.loads(r.read())["results"], len(docs))

    def stop(self) -> str:
        """Stop it; the log's tail."""
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return self.log_path.read_text()[-3000:]


class Proc:
    """A child process (from the checkout's root) with its log file; its process tree's CPU time
    from /proc; stopped with TERM, then KILL."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path = ROOT) -> None:
        self.name, self.log = log.stem, log
        self._fh = log.open("wb")
        env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=self._fh, stderr=subprocess.STDOUT, env=env)

    def wait_http(self, url: str, timeout: float = 180.0, headers: dict[str, str] | None = None) -> None:
        wait_http(url, self.proc, timeout, name=self.name, headers=headers, interval=0.3)

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process and its descendants."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in tree(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
        return total

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> float:
        """Signal the process and wait; seconds it took to exit."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._fh.close()
        return time.monotonic() - start


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (uvicorn's workers, LiteLLM's children) from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out
