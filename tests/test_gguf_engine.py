"""The gguf runtime (llama.cpp rank pooling) against a plain transformers forward of the same model.

``tests/tiny_gguf.py`` builds a tiny random XLM-R cross-encoder (the architecture of
bge-reranker GGUFs) and writes it as GGUF F32 and F16, plus a copy without its rerank head.
The reference is the straightforward Hugging Face computation: ``tokenizer(query, doc)`` ->
``XLMRobertaForSequenceClassification`` -> one logit -> sigmoid. It shares no code with the
engine (not even the tokenizer: llama.cpp tokenizes from the GGUF's own vocabulary).

Why not 1e-3 against plain transformers: llama.cpp's CPU GELU is the tanh approximation read
from a table indexed by the fp16-rounded input (ggml-cpu/vec.h, ``GGML_GELU_FP16``) where
XLM-R uses the exact erf GELU. Measured on this (deterministic) model: scores move by up to
1.6e-3 (F32) and 1.8e-3 (F16, whose matmuls also round weights and activations to fp16);
logits by up to 8.8e-3 and 1.8e-2. So the tests check, per dtype: scores within 2.5e-3 of plain
transformers and the same order, and, for F32, scores within 1e-3 of the same transformers
forward with llama.cpp's GELU swapped in (measured 1.4e-4), which shows the gap is almost all
that activation.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("llama_cpp", reason="the gguf extra (llama-cpp-python) is not installed")

from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.runtimes.gguf import GgufEngine, NoRerankHeadError, inspect_gguf, plan_decodes
from gateway.app import create_app
from schemas.config import GgufEngineConfig, Settings
from tests.loopback import wait_loaded
from tests.tiny_gguf import build_tiny_xlmr, write_gguf

QUERIES = ["what is the capital of the united states", "how do i change my password", "qubits"]
DOCS = [
    "carson city is the capital city of the american state of nevada",
    "washington is the capital of the united states and a federal district",
    "capital punishment has existed in the united states",
    "quantum computing uses qubits",
    "click settings then security " * 6,
    "no",
    "Unknown Words: Zebra!",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-gguf")
    hf = build_tiny_xlmr(root / "hf")
    return {
        "hf": hf,
        "f32": write_gguf(hf, root / "tiny-f32.gguf"),
        "f16": write_gguf(hf, root / "tiny-f16.gguf", dtype="f16"),
        "nohead": write_gguf(hf, root / "tiny-nohead.gguf", with_rerank_head=False),
    }


def _ggml_gelu(x):
    """ggml-cpu's GELU: tanh approximation, looked up by the fp16-rounded input, stored as fp16."""
    import torch

    xh = x.half().float()
    y = (0.5 * xh * (1 + torch.tanh(math.sqrt(2 / math.pi) * xh * (1 + 0.044715 * xh * xh)))).half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, y))


@pytest.fixture(scope="module")
def reference(tiny):
    """(ids, logit) of each (query, doc) pair by a plain transformers forward.

    ``run(..., ggml_gelu=True)`` swaps each layer's GELU for llama.cpp's (the only change).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny["hf"])
    model = AutoModelForSequenceClassification.from_pretrained(tiny["hf"], dtype=torch.float32).eval()
    ggml_model = AutoModelForSequenceClassification.from_pretrained(tiny["hf"], dtype=torch.float32).eval()

    class GgmlGelu(torch.nn.Module):
        def forward(self, x):
            return _ggml_gelu(x)

    for layer in ggml_model.roberta.encoder.layer:
        layer.intermediate.intermediate_act_fn = GgmlGelu()

    def run(query: str, docs: list[str], *, ggml_gelu: bool = False) -> tuple[list[list[int]], list[float]]:
        ids, logits = [], []
        with torch.inference_mode():
            for d in docs:
                enc = tok(query, d, return_tensors="pt")
                ids.append(enc["input_ids"][0].tolist())
                logits.append(float((ggml_model if ggml_gelu else model)(**enc).logits[0, 0]))
        return ids, logits

    def chunked(query: str, doc: str, window: int, max_query: int) -> list[float]:
        """Logits of each window-sized chunk of ``doc``: <s> q[:max_query] </s></s> chunk </s>."""
        q = tok(query, add_special_tokens=False)["input_ids"][:max_query]
        d = tok(doc, add_special_tokens=False)["input_ids"]
        head = [tok.cls_token_id, *q, tok.sep_token_id, tok.sep_token_id]
        room = window - len(head) - 1
        out = []
        with torch.inference_mode():
            for start in range(0, len(d), room):
                ids = torch.tensor([[*head, *d[start : start + room], tok.sep_token_id]])
                out.append(float(model(input_ids=ids).logits[0, 0]))
        return out

    run.chunked = chunked  # type: ignore[attr-defined]
    return run


async def _engine(path, **kw) -> GgufEngine:
    engine = GgufEngine(GgufEngineConfig(name="g", path=str(path), **kw))
    await engine.start()
    return engine


@pytest.fixture(scope="module")
async def f32(tiny):
    engine = await _engine(tiny["f32"], max_batch_size=3, batch_tokens=512)
    yield engine
    await engine.stop()


@pytest.fixture(scope="module")
async def f16(tiny):
    engine = await _engine(tiny["f16"], max_batch_size=3, batch_tokens=512)
    yield engine
    await engine.stop()


@pytest.fixture(scope="module")
def engines(f32, f16):
    return {"f32": f32, "f16": f16}


# Raw-logit tolerance per file type (measured maxima 8.8e-3 and 1.8e-2, see the module docstring).
_RAW_TOL = {"f32": 2e-2, "f16": 4e-2}


def _job(engine: GgufEngine, query: str, docs: list[str], *, raw: bool = False) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    return ScoreJob(
        query=query,
        instruction="",
        shared_ids=tok.encode_shared(query, ""),
        item_ids=tok.encode_documents(docs),
        raw_scores=raw,
    )


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_prompt_ids_equal_the_hf_pair_encoding(f32, reference, query):
    """llama.cpp's default rerank layout on the GGUF vocab = XLM-R's <s> q </s></s> d </s>."""
    tok = f32.tokenizer
    shared = tok.encode_shared(query, "")
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(DOCS)]
    assert prompts == reference(query, DOCS)[0]


@pytest.mark.anyio
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("query", QUERIES)
async def test_scores_equal_transformers(engines, reference, dtype, query):
    engine = engines[dtype]
    assert engine.describe()["dtype"] == dtype
    result = await engine.score(_job(engine, query, DOCS))
    logits = reference(query, DOCS)[1]
    # Not 1e-3 against the erf GELU (module docstring): within 2.5e-3, and the order must not change.
    assert result.scores == pytest.approx([_sigmoid(x) for x in logits], abs=2.5e-3)
    expected_order = sorted(range(len(DOCS)), key=lambda i: -logits[i])
    assert sorted(range(len(DOCS)), key=lambda i: -result.scores[i]) == expected_order
    assert max(logits) - min(logits) > 1.0  # the tiny model really discriminates
    raw = await engine.score(_job(engine, query, DOCS, raw=True))
    assert raw.scores == pytest.approx(logits, abs=_RAW_TOL[dtype])
    assert result.input_tokens == sum(len(ids) for ids in reference(query, DOCS)[0])


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_f32_scores_equal_transformers_with_llama_cpp_gelu_within_1e_3(f32, reference, query):
    """With llama.cpp's GELU in the reference, the F32 GGUF agrees within the issue's 1e-3."""
    result = await f32.score(_job(f32, query, DOCS))
    logits = reference(query, DOCS, ggml_gelu=True)[1]
    assert result.scores == pytest.approx([_sigmoid(x) for x in logits], abs=1e-3)


@pytest.mark.anyio
async def test_concurrent_requests_interleave_and_stay_exact(f32, reference):
    import asyncio

    # max_batch_size=3: each request takes several decode batches; they share one context.
    results = await asyncio.gather(*(f32.score(_job(f32, q, DOCS)) for q in QUERIES))
    for query, result in zip(QUERIES, results, strict=True):
        assert result.scores == pytest.approx([_sigmoid(x) for x in reference(query, DOCS)[1]], abs=2.5e-3)


@pytest.mark.anyio
async def test_a_gguf_without_rerank_head_is_refused_at_load(tiny):
    info = inspect_gguf(str(tiny["nohead"]))
    assert not info.has_cls_out and not info.has_cls
    engine = GgufEngine(GgufEngineConfig(name="g", path=str(tiny["nohead"])))
    with pytest.raises(NoRerankHeadError, match="has no rerank head.*near zero"):
        await engine.start()
    await engine.stop()


@pytest.mark.anyio
async def test_a_missing_file_is_refused_without_the_hub_hint(tmp_path):
    engine = GgufEngine(GgufEngineConfig(name="g", path=str(tmp_path / "absent.gguf")))
    with pytest.raises(ValueError, match="no such file; engine 'gguf' needs the path of a local .gguf file"):
        await engine.start()
    await engine.stop()


@pytest.mark.anyio
async def test_family_that_does_not_match_the_file_is_refused(tiny):
    engine = GgufEngine(GgufEngineConfig(name="g", path=str(tiny["f32"]), family="qwen3"))
    with pytest.raises(ValueError, match="is a cross-encoder GGUF"):
        await engine.start()
    await engine.stop()


@pytest.mark.anyio
async def test_decodes_are_planned_at_batch_tokens_not_at_the_context(tiny, f32):
    # Every sequence of one llama_decode attends over the whole call's tokens, so the runtime
    # groups prompts up to batch_tokens while the context keeps the window (512 here): a call
    # planned at the context's size was 5x slower (docs/engines-gguf.md).
    engine = await _engine(tiny["f32"], max_batch_size=64, batch_tokens=64)
    calls: list[list[int]] = []
    decode = engine._decode

    def spy(prompts):
        calls.append([len(p) for p in prompts])
        return decode(prompts)

    engine._decode = spy  # type: ignore[method-assign]
    try:
        result = await engine.score(_job(engine, QUERIES[0], DOCS))
    finally:
        await engine.stop()
    assert engine._n_batch >= 512 and len(calls) > 1
    assert all(len(c) == 1 or sum(c) <= 64 for c in calls), calls
    expected = await f32.score(_job(f32, QUERIES[0], DOCS))
    assert result.scores == pytest.approx(expected.scores, abs=1e-5)


def test_plan_decodes_respects_both_bounds():
    lengths = [5, 5, 5, 9, 2, 2, 2, 2]
    batches = plan_decodes(lengths, batch_tokens=10, max_batch_size=3)
    assert [i for b in batches for i in b] == list(range(len(lengths)))
    assert all(len(b) <= 3 and (len(b) == 1 or sum(lengths[i] for i in b) <= 10) for b in batches)
    assert batches == [[0, 1], [2], [3], [4, 5, 6], [7]]


def test_gateway_serves_gguf_with_chunking_and_ready(tiny, reference):
    settings = Settings(
        models=(
            GgufEngineConfig(name="gguf", path=str(tiny["f32"]), max_length=40, max_query_tokens=12),
            GgufEngineConfig(name="nohead", path=str(tiny["nohead"])),
        )
    )
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client, 60)
        models = {m["name"]: m for m in client.get("/ready").json()["models"]}
        ready = models["gguf"]
        assert (ready["state"], ready["family"], ready["runtime"], ready["device"], ready["dtype"]) == (
            "ready",
            "cross-encoder",
            "gguf",
            "cpu",
            "f32",
        )
        assert models["nohead"]["state"] == "failed"
        assert "no rerank head" in models["nohead"]["error"]

        query = QUERIES[0]
        docs = DOCS[:4]
        resp = client.post("/v2/rerank", json={"model": "gguf", "query": query, "documents": docs})
        assert resp.status_code == 200, resp.text
        # The 40-token window (query cut to 12 tokens) splits most documents: each scores as its best chunk.
        expected = [_sigmoid(max(reference.chunked(query, d, 40, 12))) for d in docs]
        got = {r["index"]: r["relevance_score"] for r in resp.json()["results"]}
        assert [got[i] for i in range(len(docs))] == pytest.approx(expected, abs=2.5e-3)

        # A document longer than the 40-token window is split into chunks, each scored, max kept.
        long_doc = " ".join(DOCS[1:4] * 2)
        resp = client.post("/v2/rerank", json={"model": "gguf", "query": query, "documents": [long_doc]})
        assert resp.status_code == 200, resp.text
        chunk_logits = reference.chunked(query, long_doc, 40, 12)
        assert len(chunk_logits) >= 3
        assert resp.json()["results"][0]["relevance_score"] == pytest.approx(_sigmoid(max(chunk_logits)), abs=2.5e-3)

        failed = client.post("/v2/rerank", json={"model": "nohead", "query": query, "documents": docs})
        assert failed.status_code == 503
        assert "no rerank head" in failed.json()["message"]
        bad = client.post("/v2/rerank", json={"model": "gguf", "query": "", "documents": docs})
        assert bad.status_code == 422
