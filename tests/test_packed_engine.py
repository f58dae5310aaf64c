"""The packed engine (CPU: exact per-prompt SDPA fallback) and its scheduler.

- parity: packed = the independent reference within 1e-5 (fp32), = the transformers engine, with
  each request's shared prefix computed once per step (the default) and without;
- scheduling: concurrent requests share steps; a lone request starts without waiting for company;
  a cancelled request's pending items are never computed; two CPU replicas both serve and
  ``/ready`` reports each.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.families.qwen3 import Qwen3PromptTokenizer
from adapters.runtimes.packed.engine import PackedQwen3Engine
from adapters.runtimes.packed.scheduler import PackedScheduler
from adapters.runtimes.transformers import TransformersQwen3Engine
from gateway.app import create_app
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig, Settings, TransformersEngineConfig
from tests import reference

QUERIES = ["What is the capital of the United States?", "How do I change my password?", "qubits?"]
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
    "no",
    "Click Settings. " * 12,
    "What?\n",
    "",
]


def _job(tok: Qwen3PromptTokenizer, query: str, docs: list[str], instruction: str = DEFAULT_INSTRUCTION) -> ScoreJob:
    return ScoreJob(
        query=query,
        instruction=instruction,
        shared_ids=tok.encode_shared(query, instruction),
        item_ids=tok.encode_documents(docs),
    )


def _config(tiny_dir, **kw) -> PackedEngineConfig:
    return PackedEngineConfig(name="p", path=str(tiny_dir), dtype="float32", max_length=512, max_query_tokens=64, **kw)


@pytest.fixture(scope="module", params=[True, False], ids=["shared-prefix", "whole-prompts"])
async def engine(tiny_qwen3_dir, request):
    # A 300-token budget: a request's items span several steps, steps hold prompts of mixed length.
    eng = PackedQwen3Engine(_config(tiny_qwen3_dir, batch_tokens=300, share_prefix=request.param))
    await eng.start()
    yield eng
    await eng.stop()


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_scores_equal_reference(engine, tiny_qwen3_dir, query):
    result = await engine.score(_job(engine.tokenizer, query, DOCS))
    expected = reference.score_texts(tiny_qwen3_dir, query, DOCS)
    assert result.scores == pytest.approx(expected, abs=1e-5)
    assert len({round(s, 6) for s in expected}) > 3  # the tiny model really discriminates
    stats = engine.stats()
    assert stats["attention"] == "sdpa per prompt" and stats["compiled"] is False
    assert (
        stats["share_prefix"] is engine._config.share_prefix and stats["prefix_sharing"]["not_shared_because"] is None
    )
    # a request's items span several steps (the budget), with sharing each recomputes the prefix once
    assert stats["steps"] > stats["requests"]
    if stats["share_prefix"]:
        assert stats["computed_tokens"] < 0.8 * stats["prompt_tokens"]
    else:
        assert stats["computed_tokens"] == stats["prompt_tokens"]


@pytest.mark.anyio
async def test_equals_transformers_engine(engine, tiny_qwen3_dir):
    padded = TransformersQwen3Engine(
        TransformersEngineConfig(
            name="t", path=str(tiny_qwen3_dir), dtype="float32", max_length=512, max_query_tokens=64
        )
    )
    await padded.start()
    try:
        instruction = "Retrieve semantically similar text."
        for query in QUERIES:
            ours = await engine.score(_job(engine.tokenizer, query, DOCS, instruction))
            theirs = await padded.score(_job(padded.tokenizer, query, DOCS, instruction))
            assert ours.scores == pytest.approx(theirs.scores, abs=1e-5)
            assert ours.input_tokens == theirs.input_tokens
    finally:
        await padded.stop()


@pytest.mark.anyio
async def test_concurrent_requests_share_steps(engine, tiny_qwen3_dir):
    """Items of different requests are computed in the same forward pass; one at a time never are."""
    tok = engine.tokenizer

    def shared_steps() -> int:
        return sum(n for k, n in engine.stats()["steps_by_requests"].items() if int(k) > 1)

    start = shared_steps()
    for query in QUERIES:  # sequential: every step holds one request
        await engine.score(_job(tok, query, DOCS[:2]))
    assert shared_steps() == start
    pairs = [(q, d) for q in QUERIES for d in DOCS[:3]]
    results = await asyncio.gather(*(engine.score(_job(tok, q, [d])) for q, d in pairs))
    assert shared_steps() > start
    # ... and sharing a step does not change anyone's score.
    for (q, d), res in zip(pairs, results, strict=True):
        assert res.scores == pytest.approx(reference.score_texts(tiny_qwen3_dir, q, [d]), abs=1e-5)


class _GatedRunner:
    """A runner whose steps wait for the test: shows what the scheduler hands it, and when."""

    device = "test"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.steps: list[int] = []

    def score(self, prompts, segments=None):
        self.steps.append(len(prompts))
        self.entered.set()
        assert self.gate.wait(10), "test never opened the gate"
        return [0.5] * len(prompts)


@pytest.mark.anyio
async def test_lone_request_starts_without_waiting_for_company():
    runner = _GatedRunner()
    runner.gate.set()
    scheduler = PackedScheduler([runner], batch_tokens=1000, max_items=64)
    try:
        req = scheduler.submit([1, 2], [[3], [4, 5]], [6])
        # No other request will ever come: a batching window would hold this step back.
        entered = await asyncio.get_running_loop().run_in_executor(None, runner.entered.wait, 5)
        assert entered, "the worker did not start a lone request's step"
        assert await asyncio.wait_for(req.future, 5) == [0.5, 0.5]
        assert runner.steps == [2]
        assert scheduler.stats()["steps_by_requests"] == {"1": 1}
    finally:
        scheduler.stop()


@pytest.mark.anyio
async def test_cancelled_request_drops_its_pending_items(tiny_qwen3_dir):
    """Cancelling (client gone, timeout) removes the items no step has taken; the engine keeps serving."""
    eng = PackedQwen3Engine(_config(tiny_qwen3_dir, batch_tokens=1))  # one prompt per step
    await eng.start()
    try:
        replica = eng._replicas[0]
        real = replica.score_groups
        calls: list[int] = []
        entered, gate = threading.Event(), threading.Event()

        def gated(groups):
            calls.append(sum(len(tails) for _, tails in groups))
            entered.set()
            gate.wait(10)
            return real(groups)

        replica.score_groups = gated  # the scheduler calls the runner's score_groups at each step (share_prefix)
        task = asyncio.create_task(eng.score(_job(eng.tokenizer, QUERIES[0], DOCS)))
        assert await asyncio.get_running_loop().run_in_executor(None, entered.wait, 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()
        deadline = time.monotonic() + 5
        while eng.stats()["steps"] < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # a worker that ignored the cancel would start step 2 now
        assert calls == [1], f"steps run after the cancel: {calls}"
        assert eng.stats()["dropped_items"] == len(DOCS) - 1
        assert eng.stats()["waiting_requests"] == 0
        replica.score_groups = real
        after = await eng.score(_job(eng.tokenizer, QUERIES[1], DOCS[:2]))
        assert after.scores == pytest.approx(reference.score_texts(tiny_qwen3_dir, QUERIES[1], DOCS[:2]), abs=1e-5)
    finally:
        gate.set()
        await eng.stop()


@pytest.mark.anyio
async def test_two_cpu_replicas_share_the_work(tiny_qwen3_dir):
    eng = PackedQwen3Engine(_config(tiny_qwen3_dir, devices=("cpu", "cpu"), batch_tokens=200))
    await eng.start()
    try:
        jobs = [(q, _job(eng.tokenizer, q, DOCS)) for q in QUERIES * 3]
        results = await asyncio.gather(*(eng.score(j) for _, j in jobs))
        for (q, _), res in zip(jobs, results, strict=True):
            assert res.scores == pytest.approx(reference.score_texts(tiny_qwen3_dir, q, DOCS), abs=1e-5)
        stats = eng.stats()
        # One queue, two workers: whichever replica is idle takes the next step.
        assert [d["device"] for d in stats["devices"]] == ["cpu", "cpu"]
        assert all(d["steps"] > 0 for d in stats["devices"]), stats
    finally:
        await eng.stop()


def test_ready_reports_each_device(tiny_qwen3_dir):
    model = _config(tiny_qwen3_dir, devices=("cpu", "cpu"))
    app = create_app(Settings(models=(model,)), configure_logs=False)
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, client.get("/ready").text
            time.sleep(0.05)
        body = client.post("/v1/rerank", json={"model": "p", "query": QUERIES[0], "documents": DOCS[:3]}).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(3)] == pytest.approx(
            reference.score_texts(tiny_qwen3_dir, QUERIES[0], DOCS[:3]), abs=1e-5
        )
        status = client.get("/ready").json()["models"][0]
        assert status["engine"] == "packed"
        assert [d["device"] for d in status["engine_stats"]["devices"]] == ["cpu", "cpu"]
        assert status["engine_stats"]["requests"] == 1


class _PipelinedRunner:
    """Launch returns at once, collect delivers: the CUDA replica's split, without a GPU."""

    device = "test"
    pipelined = True

    def __init__(self) -> None:
        self.launched: list[int] = []
        self.collected = 0

    def launch(self, prompts, segments=None, idle=False, eager=False):
        self.launched.append(len(prompts))
        return [float(len(p)) / 100 for p in prompts]

    def collect(self, handle):
        self.collected += 1
        return handle


@pytest.mark.anyio
async def test_pipelined_runner_delivers_every_step():
    """Step k+1 is launched before step k is collected; every step is still collected and delivered once."""
    runner = _PipelinedRunner()
    scheduler = PackedScheduler([runner], batch_tokens=6, max_items=64)
    try:
        lone = scheduler.submit([1], [[2, 3]], [4])
        assert await asyncio.wait_for(lone.future, 5) == [0.04]  # alone: collected without a next step
        reqs = [scheduler.submit([1], [[2] * k for k in range(1, 4)], [9]) for _ in range(4)]
        results = await asyncio.wait_for(asyncio.gather(*(r.future for r in reqs)), 5)
        assert results == [[0.03, 0.04, 0.05]] * 4
        assert runner.collected == len(runner.launched) == scheduler.stats()["steps"]
    finally:
        scheduler.stop()


class _HeldRunner(_PipelinedRunner):
    """Collect waits until the test lets the device "finish"."""

    def __init__(self) -> None:
        super().__init__()
        self.device_done = threading.Event()

    def collect(self, handle):
        self.device_done.wait(10)
        return super().collect(handle)


@pytest.mark.anyio
async def test_work_queued_while_a_step_computes_is_launched_without_waiting_for_it():
    """The idle two-part request: its second part arrives while the first part's step computes.
    It must be launched then (the device gets it right behind), not after that step is collected."""
    runner = _HeldRunner()
    scheduler = PackedScheduler([runner], batch_tokens=1000, max_items=64)
    try:
        first = scheduler.submit([1], [[2, 3]], [4])
        assert await _until(lambda: runner.launched == [1])
        second = scheduler.submit([1], [[5]], [4])
        assert await _until(lambda: runner.launched == [1, 1]), "the second step waited for the first's collect"
        assert runner.collected == 0 and not first.future.done()
        runner.device_done.set()
        assert await asyncio.wait_for(asyncio.gather(first.future, second.future), 5) == [[0.04], [0.03]]
    finally:
        runner.device_done.set()
        scheduler.stop()


async def _until(check, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.01)):
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()


class _SlowRunner(_PipelinedRunner):
    """Launch (host prep) takes 20 ms, collect (the device) 60 ms: the stats must tell them apart."""

    def launch(self, prompts, segments=None, idle=False, eager=False):
        time.sleep(0.02)
        return super().launch(prompts, segments, idle=idle, eager=eager)

    def collect(self, handle):
        time.sleep(0.06)
        return super().collect(handle)


@pytest.mark.anyio
@pytest.mark.parametrize("pipelined", [True, False])
async def test_stats_split_a_step_into_host_prep_and_device_wait(pipelined):
    runner = _SlowRunner()
    runner.pipelined = pipelined  # whole steps: score() is the wait, assembling the prep
    runner.score = lambda prompts, segments=None: runner.collect(runner.launch(prompts, segments))
    scheduler = PackedScheduler([runner], batch_tokens=1000, max_items=64)
    try:
        for _ in range(2):
            await asyncio.wait_for(scheduler.submit([1], [[2, 3], [4]], [5]).future, 5)
        stats = scheduler.stats()
        assert stats["steps"] == 2
        # Sleeps only overshoot (a loaded CI box): lower bounds, and which side each sleep landed on.
        recent = stats["recent_steps_ms"]  # the same split, as percentiles of the latest steps
        if pipelined:
            assert stats["prep_ms_mean"] >= 19 and stats["wait_ms_mean"] >= 59
            assert stats["prep_ms_mean"] < stats["wait_ms_mean"] - 20
            assert 19 <= recent["prep"]["p50"] <= recent["prep"]["p99"] <= recent["prep"]["max"] < recent["wait"]["p50"]
        else:  # the whole forward is the wait; assembling is all the prep
            assert stats["wait_ms_mean"] >= 79 and stats["prep_ms_mean"] < stats["wait_ms_mean"] / 4
            assert recent["wait"]["p50"] >= 79 and recent["prep"]["max"] < recent["wait"]["p50"] / 4
    finally:
        scheduler.stop()


@pytest.mark.parametrize("mode", ["fused", "modules"])
def test_replica_modes_equal_reference(tiny_qwen3_dir, mode):
    """Both forward modes (fused q/k/v and gate/up GEMMs; transformers' modules) = the reference, fp32 CPU."""
    import torch

    from adapters.families.qwen3 import load_hf_tokenizer
    from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone

    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir), None), max_length=512, max_query_tokens=64)
    shared = tok.encode_shared(QUERIES[0], DEFAULT_INSTRUCTION)
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(DOCS)]
    backbone, head = load_backbone(str(tiny_qwen3_dir), None, torch.float32, (tok.no_id, tok.yes_id))
    replica = PackedQwen3Replica(backbone, head, torch.device("cpu"), attention="sdpa", compile=False, mode=mode)
    got = replica.score(prompts)
    want = reference.score_ids(str(tiny_qwen3_dir), prompts)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
    assert replica.score(prompts[:1]) == pytest.approx(want[:1], abs=1e-5)  # a step of one prompt


class _MiscountingRunner(_PipelinedRunner):
    """The first step's collect returns one score too few: a runner bug, not a device fault."""

    def collect(self, handle):
        out = super().collect(handle)
        return out[:-1] if self.collected == 1 else out


@pytest.mark.anyio
@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "whole-steps"])
async def test_a_step_whose_result_does_not_fit_fails_its_requests_and_the_device_keeps_serving(pipelined):
    """Whole steps fail such a step's requests and go on; the collector thread must too, or its
    device is wedged: the request never answers and the launcher stops once its lane is full."""
    runner = _MiscountingRunner()
    runner.pipelined = pipelined
    runner.score = lambda prompts, segments=None: runner.collect(runner.launch(prompts, segments))
    scheduler = PackedScheduler([runner], batch_tokens=1000, max_items=64)
    try:
        bad = scheduler.submit([1], [[2, 3], [4]], [5])
        with pytest.raises(RuntimeError, match="IndexError"):
            await asyncio.wait_for(bad.future, 5)
        for _ in range(3):  # more steps than the lane holds
            assert await asyncio.wait_for(scheduler.submit([1], [[2]], [5]).future, 5) == [0.03]
    finally:
        scheduler.stop()
