"""``split = "pipeline"``: one Qwen3 model's layers over several devices, on CPU "devices".

- the split replica (2 and 3 stages, even and uneven layer counts) = the unsplit replica = the
  independent reference within 1e-5 in fp32, FP8 (emulated) included;
- each stage holds only its layers (the embeddings on the first only);
- through the engine and its scheduler, concurrent requests get the reference's scores and
  ``/ready``'s stats name the stages;
- a bad split is refused in one line (config check, or at load for the model's layer count);
- the scheduler keeps one step in flight per stage (a pipelined runner without a GPU).
"""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest
import torch

from adapters.base import EngineConfigError, ScoreJob
from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
from adapters.runtimes.packed import pipeline
from adapters.runtimes.packed.engine import PackedQwen3Engine
from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone
from adapters.runtimes.packed.scheduler import PackedScheduler
from schemas.config import DEFAULT_INSTRUCTION, PackedEngineConfig, Settings
from tests import reference
from tests.tiny_qwen3 import build_tiny_qwen3

QUERIES = ["What is the capital of the United States?", "How do I change my password?", "qubits?"]
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
    "no",
    "Click Settings. " * 12,
    "",
]
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory):
    """The tiny Qwen3 with 4 layers: room for 3 stages of unequal size."""
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3-4l"), layers=4)


@pytest.fixture(scope="module")
def prompts(tiny4):
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny4), None), max_length=512, max_query_tokens=64)
    shared = tok.encode_shared(QUERIES[0], DEFAULT_INSTRUCTION)
    return [tok.assemble(shared, d) for d in tok.encode_documents(DOCS)]


@pytest.fixture(scope="module")
def want(tiny4, prompts):
    return reference.score_ids(str(tiny4), prompts)


def _model(tiny4):
    tok = load_hf_tokenizer(str(tiny4), None)
    rows = (tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes"))
    return load_backbone(str(tiny4), None, torch.float32, rows)


def test_stage_ranges():
    assert pipeline.stage_ranges(36, 2) == [range(18), range(18, 36)]
    assert pipeline.stage_ranges(28, 3) == [range(10), range(10, 19), range(19, 28)]  # remainder first
    assert pipeline.stage_ranges(4, 3, [1, 2, 1]) == [range(1), range(1, 3), range(3, 4)]
    for args, match in [
        ((4, 1), "at least 2 devices"),
        ((2, 3), "3 devices for a model of 2 layers"),
        ((4, 2, [1, 2]), r"sums to 3; the model has 4"),
        ((4, 2, [4]), "1 entries for 2 devices"),
    ]:
        with pytest.raises(pipeline.SplitError, match=match) as info:
            pipeline.stage_ranges(*args)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("layers", [None, [1, 3], [3, 1], [1, 2, 1]], ids=["2x2", "1+3", "3+1", "1+2+1"])
def test_split_equals_unsplit_and_reference(tiny4, prompts, want, layers):
    backbone, head = _model(tiny4)
    whole = PackedQwen3Replica(backbone, head, CPU, attention="sdpa", compile=False).score(prompts)
    n = 2 if layers is None else len(layers)
    backbone, head = _model(tiny4)
    first = pipeline.build_pipeline(backbone, head, [CPU] * n, layers, attention="sdpa", compile=False)
    stages = first.chain()
    assert len(stages) == n and first.in_flight == n and first.label == ">".join(["cpu"] * n)
    counts = layers or [2, 2]
    assert [len(s.backbone.layers) for s in stages] == counts
    assert [s["layers"] for s in pipeline.describe(first)] == [
        [sum(counts[:i]), sum(counts[: i + 1])] for i in range(n)
    ]
    # every layer in exactly one stage, in order; the embeddings on the first stage only
    assert [id(m) for s in stages for m in s.backbone.layers] == [id(m) for m in backbone.layers]
    assert first.backbone.embed_tokens is not None and all(s.backbone.embed_tokens is None for s in stages[1:])
    got = first.score(prompts)
    assert max(abs(a - b) for a, b in zip(got, whole, strict=True)) < 1e-5
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
    assert first.score(prompts[:1]) == pytest.approx(want[:1], abs=1e-5)  # a step of one prompt
    assert len({round(s, 6) for s in want}) > 3  # the tiny model really discriminates


def test_split_fp8_equals_unsplit_fp8(tiny4, prompts):
    """FP8 (emulated on CPU): every stage is quantized, and the split computes the unsplit's numbers."""
    backbone, head = _model(tiny4)
    whole = PackedQwen3Replica(backbone, head, CPU, attention="sdpa", compile=False)
    whole.to_fp8()
    backbone, head = _model(tiny4)
    first = pipeline.build_pipeline(backbone, head, [CPU, CPU], [3, 1], attention="sdpa", compile=False)
    first.to_fp8()
    assert all(s.precision.startswith("fp8") and all(w.f8 for w in s._layers) for s in first.chain())
    assert first.score(prompts) == pytest.approx(whole.score(prompts), abs=1e-5)


def test_split_refuses_modules_mode(tiny4):
    backbone, head = _model(tiny4)
    with pytest.raises(pipeline.SplitError, match="fused mode only"):
        pipeline.build_pipeline(backbone, head, [CPU, CPU], attention="sdpa", compile=False, mode="modules")


def _job(tok: Qwen3PromptTokenizer, query: str, docs: list[str]) -> ScoreJob:
    return ScoreJob(
        query=query,
        instruction=DEFAULT_INSTRUCTION,
        shared_ids=tok.encode_shared(query, DEFAULT_INSTRUCTION),
        item_ids=tok.encode_documents(docs),
    )


def _config(path, **kw) -> PackedEngineConfig:
    return PackedEngineConfig(name="p", path=str(path), dtype="float32", max_length=512, max_query_tokens=64, **kw)


@pytest.mark.slow
@pytest.mark.anyio
async def test_engine_split_over_cpus_scores_concurrent_requests(tiny4):
    # A 1000-token budget (computed tokens: a request computes ~340): concurrent requests share steps.
    eng = PackedQwen3Engine(
        _config(tiny4, devices=("cpu", "cpu", "cpu"), split="pipeline", split_layers=(1, 2, 1), batch_tokens=1000)
    )
    await eng.start()
    try:
        jobs = [(q, _job(eng.tokenizer, q, DOCS)) for q in QUERIES * 2]
        results = await asyncio.gather(*(eng.score(j) for _, j in jobs))
        for (q, _), res in zip(jobs, results, strict=True):
            assert res.scores == pytest.approx(reference.score_texts(tiny4, q, DOCS), abs=1e-5)
        stats = eng.stats()
        assert stats["split"] == {
            "mode": "pipeline",
            "stages": [
                {"device": "cpu", "layers": [0, 1]},
                {"device": "cpu", "layers": [1, 3]},
                {"device": "cpu", "layers": [3, 4]},
            ],
        }
        assert [d["device"] for d in stats["devices"]] == ["cpu>cpu>cpu"]  # one runner, three stages
        assert any(int(k) > 1 for k in stats["steps_by_requests"]), stats["steps_by_requests"]
    finally:
        await eng.stop()


@pytest.mark.slow
@pytest.mark.anyio
async def test_engine_refuses_a_split_the_model_cannot_take(tiny4):
    eng = PackedQwen3Engine(_config(tiny4, devices=("cpu", "cpu"), split="pipeline", split_layers=(1, 1)))
    with pytest.raises(
        EngineConfigError, match=r"^model 'p': split_layers \[1, 1\] sums to 2; the model has 4 layers$"
    ):
        await eng.start()


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ({"split": "pipeline"}, r"split = 'pipeline' needs at least 2 devices, got devices = \['auto'\]"),
        ({"split_layers": [1, 1], "devices": ["cpu", "cpu"]}, "split_layers is only read with split = 'pipeline'"),
        (
            {"split": "pipeline", "devices": ["cpu", "cpu"], "split_layers": [4]},
            "split_layers has 1 entries for 2 devices",
        ),
    ],
)
def test_config_check_refuses_bad_splits(model, match):
    with pytest.raises(msgspec.ValidationError, match=match + r".*models\[0\]") as info:
        msgspec.convert({"models": [{"name": "p", "engine": "packed", "path": "/m", **model}]}, Settings)
    assert "\n" not in str(info.value)


class _StageRunner:
    """A pipelined runner of three stages without a GPU: records launches and collects, in order."""

    device = "test"
    pipelined = True
    in_flight = 3

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []
        self.outstanding = self.most_outstanding = 0
        self.lock = threading.Lock()

    def launch(self, prompts, segments=None, idle=False, eager=False):
        with self.lock:
            k = sum(1 for e in self.events if e[0] == "launch")
            self.events.append(("launch", k))
            self.outstanding += 1
            self.most_outstanding = max(self.most_outstanding, self.outstanding)
        return k, [len(p) / 100 for p in prompts]

    def collect(self, handle):
        k, scores = handle
        time.sleep(0.02)  # the device's time: a collect waits for it, launches do not
        with self.lock:
            self.events.append(("collect", k))
            self.outstanding -= 1
        return scores


@pytest.mark.anyio
async def test_scheduler_keeps_one_step_in_flight_per_stage():
    runner = _StageRunner()
    scheduler = PackedScheduler([runner], batch_tokens=3, max_items=64)  # one 3-token prompt per step
    try:
        req = scheduler.submit([1], [[2]] * 8, [3])  # 8 steps queued at once
        assert await asyncio.wait_for(req.future, 5) == [0.03] * 8
        # 3 steps stay in flight; the 4th is launched before the 1st is collected, then one for one
        assert runner.events[:5] == [("launch", 0), ("launch", 1), ("launch", 2), ("launch", 3), ("collect", 0)]
        assert runner.most_outstanding == 4 and runner.outstanding == 0
        assert [k for e, k in runner.events if e == "collect"] == list(range(8))  # oldest first, each once
        lone = scheduler.submit([1], [[2]], [3])  # alone: collected without a next step
        assert await asyncio.wait_for(lone.future, 5) == [0.03]
    finally:
        scheduler.stop()


class _IdleRunner(_StageRunner):
    """Records each launch's ``idle``: whether no request waited behind that step."""

    def __init__(self) -> None:
        super().__init__()
        self.idle: list[bool] = []
        self.eager: list[bool] = []

    def launch(self, prompts, segments=None, idle=False, eager=False):
        self.idle.append(idle)
        self.eager.append(eager)
        return super().launch(prompts, segments)


@pytest.mark.anyio
async def test_a_step_is_idle_only_when_no_request_waits_behind_it():
    """What a CUDA graph capture waits on (graphs.py): a step that others queue behind may
    capture; the last step of a backlog, and a request alone, run with ``idle``."""
    runner = _IdleRunner()
    scheduler = PackedScheduler([runner], batch_tokens=3, max_items=64)  # one 3-token prompt per step
    try:
        req = scheduler.submit([1], [[2]] * 5, [3])  # 5 steps queued at once
        assert await asyncio.wait_for(req.future, 5) == [0.03] * 5
        assert runner.idle == [False] * 4 + [True]
        lone = scheduler.submit([1], [[2]], [3])
        assert await asyncio.wait_for(lone.future, 5) == [0.03]
        assert runner.idle[-1] is True
    finally:
        scheduler.stop()


class _FailingRunner(_StageRunner):
    """Its first step fails, as a device fault would."""

    def collect(self, handle):
        if handle[0] == 0:
            raise RuntimeError("device fell over")
        return super().collect(handle)


@pytest.mark.anyio
async def test_a_failed_step_counts_its_requests_untaken_items_as_dropped():
    """The request fails with the step's error, and the items no step took are never computed:
    ``dropped_items`` counts them, as it counts a cancelled request's."""
    runner = _FailingRunner()
    runner.in_flight = 1  # two steps out at most: the rest of the request is still queued
    scheduler = PackedScheduler([runner], batch_tokens=3, max_items=64)  # one 3-token prompt per step
    try:
        req = scheduler.submit([1], [[2]] * 8, [3])
        with pytest.raises(RuntimeError, match="device fell over"):
            await asyncio.wait_for(req.future, 5)
        scheduler.stop()  # joins the threads: every launch taken is recorded
        launched = sum(1 for e in runner.events if e[0] == "launch")
        assert launched < 8 and scheduler.stats()["dropped_items"] == 8 - launched
    finally:
        scheduler.stop()


@pytest.mark.anyio
async def test_a_request_submitted_eager_has_its_steps_launched_eagerly():
    """The packed engine's second try of non-finite logits: no CUDA graph for its steps."""
    runner = _IdleRunner()
    scheduler = PackedScheduler([runner], batch_tokens=6, max_items=64)  # two 3-token prompts per step
    try:
        plain = scheduler.submit([1], [[2]] * 2, [3])
        assert await asyncio.wait_for(plain.future, 5) == [0.03] * 2
        retry = scheduler.submit([1], [[2]] * 3, [3], eager=True)
        assert await asyncio.wait_for(retry.future, 5) == [0.03] * 3
        assert runner.eager == [False, True, True]
    finally:
        scheduler.stop()


@pytest.mark.anyio
async def test_split_runner_launched_ahead_keeps_every_score(tiny4):
    """The CUDA path's scheduling with the real split replica: two steps launched ahead of collects
    (``pipelined`` forced on CPU, where launch computes), concurrent requests, the reference's scores."""
    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny4), None), max_length=512, max_query_tokens=64)
    backbone, head = _model(tiny4)
    first = pipeline.build_pipeline(backbone, head, [CPU, CPU], attention="sdpa", compile=False)
    first.pipelined = True
    scheduler = PackedScheduler([first], batch_tokens=300, max_items=64)
    try:
        reqs = [
            (q, scheduler.submit(tok.encode_shared(q, DEFAULT_INSTRUCTION), tok.encode_documents(DOCS), tok.suffix_ids))
            for q in QUERIES * 2
        ]
        for q, req in reqs:
            assert await asyncio.wait_for(req.future, 30) == pytest.approx(
                reference.score_texts(tiny4, q, DOCS), abs=1e-5
            )
        assert scheduler.stats()["steps"] > len(reqs)  # requests spanned several steps
    finally:
        scheduler.stop()


def test_stage_with_per_prompt_attention_after_a_varlen_one(tiny4, prompts, want):
    """cuda:0 then cpu: the first stage's varlen kernel takes no prompt lengths, the CPU stage's SDPA
    does -- it derives them from the boundaries (emulated here with a varlen-like first stage)."""
    from adapters.runtimes.packed import varlen

    backbone, head = _model(tiny4)
    first = pipeline.build_pipeline(backbone, head, [CPU, CPU], attention="sdpa", compile=False)
    first._per_prompt = False  # as on CUDA: launch passes no lengths
    first._attend = lambda q, k, v, cu_q, cu_k, max_q, max_k, lens_q, lens_k: varlen.sdpa_per_prompt(
        q, k, v, cu_q, cu_k, max_q, max_k, cu_q.diff().tolist(), cu_k.diff().tolist()
    )
    assert first.score(prompts) == pytest.approx(want, abs=1e-5)
