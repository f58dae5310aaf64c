"""A Qwen3 reranker converted by llama.cpp's own converter, served by the ``gguf`` runtime.

The GGUF files are what a user gets from ``convert_hf_to_gguf.py`` (``tests/llama_convert.py``
fetches it from llama-cpp-python's sdist on PyPI, the release the runtime runs): its Qwen3 path
(``conversion/qwen.py``) recognises the reranker by the README title, keeps only the ``yes`` and
``no`` rows of ``lm_head`` as ``cls.output``, sets rank pooling and writes the ``rerank`` chat
template. F32 and Q8_0 come from the converter (``--outtype``), Q4_K_M from llama.cpp's quantizer
(``llama_model_quantize``, what ``llama-quantize`` runs) applied to the F32 file.

The reference is ``tests/reference.py``: Qwen's published recipe on plain transformers (full
causal-LM forward, softmax over the no/yes logits), sharing no code with llama.cpp. Measured on
this model (hidden 256, seed 0; ``docs/engines-gguf.md``), largest gap over 3 queries x 7
documents:

- F32: 6.7e-4 (bound 5e-3, the issue's), same order as the reference;
- Q8_0: 2.7e-2 (bound 4e-2), same order as the reference and as F32;
- Q4_K_M: 0.19 (bound 0.25); the best document stays first for every query but lower places
  swap (on random weights 4-bit rounding moves P(yes) by up to 0.19): Q4_K_M is tested for the
  top document only, and the docs say to use Q8_0 or better where the full order matters.
"""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="the gguf extra (llama-cpp-python) is not installed")

from litestar.testing import TestClient

from adapters.base import ScoreJob
from adapters.runtimes.gguf import GgufEngine, inspect_gguf
from gateway.app import create_app
from schemas.config import GgufEngineConfig, Settings
from tests import reference
from tests.llama_convert import convert, fetch_converter, quantize, qwen3_reranker_checkpoint
from tests.loopback import wait_loaded

pytestmark = pytest.mark.slow

QUERIES = ["what is the capital of the united states", "how do i change my password", "qubits"]
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Quantum computing uses qubits.",
    "Click Settings, then Security, then Change password. " * 3,
    "no",
    "Unknown Words: Zebra!",
]
# Bound per file type against the transformers reference (measured maxima in the module docstring).
TOLERANCE = {"f32": 5e-3, "q8_0": 4e-2, "q4_k_m": 0.25}


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_qwen3_dir):
    root = tmp_path_factory.mktemp("qwen3-gguf")
    converter = fetch_converter(root / "llama.cpp")
    hf = qwen3_reranker_checkpoint(tiny_qwen3_dir, root / "Qwen3-Reranker-tiny")
    f32 = convert(converter, hf, root / "f32.gguf", outtype="f32")
    return {
        "hf": hf,
        "f32": f32,
        "q8_0": convert(converter, hf, root / "q8_0.gguf", outtype="q8_0"),
        "q4_k_m": quantize(f32, root / "q4_k_m.gguf", "Q4_K_M"),
    }


@pytest.fixture(scope="module")
def expected(files):
    """The transformers reference's scores, per query."""
    return {q: reference.score_texts(files["hf"], q, DOCS) for q in QUERIES}


@pytest.fixture(scope="module")
async def engines(files):
    started = {}
    for kind in ("f32", "q8_0", "q4_k_m"):
        engine = GgufEngine(GgufEngineConfig(name=kind, path=str(files[kind]), max_batch_size=4, batch_tokens=1024))
        await engine.start()
        started[kind] = engine
    yield started
    for engine in started.values():
        await engine.stop()


def _job(engine: GgufEngine, query: str, docs: list[str]) -> ScoreJob:
    tok = engine.tokenizer
    assert tok is not None
    return ScoreJob(
        query=query, instruction="", shared_ids=tok.encode_shared(query, ""), item_ids=tok.encode_documents(docs)
    )


def _order(scores) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_k_m"])
def test_converter_writes_a_qwen3_rerank_head_the_runtime_recognises(files, kind):
    info = inspect_gguf(str(files[kind]))
    assert (info.architecture, info.family, info.file_type) == ("qwen3", "qwen3", kind)
    assert info.pooling_type == 4  # LLAMA_POOLING_TYPE_RANK
    assert info.labels == ("yes", "no") and info.has_cls_out and info.cls_out_rows == 2
    assert info.rerank_template is not None and info.rerank_template.count("{query}") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_prompt_ids_equal_qwens_published_prompt(engines, files, query):
    """The converter's rerank template, cut and tokenized by the gateway, is Qwen's prompt token for token."""
    tok = engines["f32"].tokenizer
    shared = tok.encode_shared(query, "")
    prompts = [tok.assemble(shared, d) for d in tok.encode_documents(DOCS)]
    assert prompts == [
        reference.tokenize(files["hf"], reference.prompt_text(reference.DEFAULT_INSTRUCTION, query, d)) for d in DOCS
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_k_m"])
@pytest.mark.parametrize("query", QUERIES)
async def test_scores_match_transformers(engines, expected, kind, query):
    """F32 and Q8_0 keep the reference's whole order; Q4_K_M its best document (module docstring)."""
    result = await engines[kind].score(_job(engines[kind], query, DOCS))
    ref = expected[query]
    assert result.scores == pytest.approx(ref, abs=TOLERANCE[kind])
    if kind == "q4_k_m":
        assert _order(result.scores)[0] == _order(ref)[0]
    else:
        assert _order(result.scores) == _order(ref)
    assert max(ref) - min(ref) > 0.3  # the random model really discriminates (spreads 0.38-0.63)


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_quantized_files_keep_the_f32_order(engines, query):
    f32 = (await engines["f32"].score(_job(engines["f32"], query, DOCS))).scores
    q8 = (await engines["q8_0"].score(_job(engines["q8_0"], query, DOCS))).scores
    q4 = (await engines["q4_k_m"].score(_job(engines["q4_k_m"], query, DOCS))).scores
    assert _order(q8) == _order(f32)
    assert _order(q4)[0] == _order(f32)[0]


def test_gateway_serves_the_converted_file(files, expected):
    settings = Settings(models=(GgufEngineConfig(name="qwen3-gguf", path=str(files["f32"])),))
    with TestClient(create_app(settings, configure_logs=False)) as client:
        wait_loaded(client, 60)
        ready = client.get("/ready").json()["models"][0]
        assert (ready["state"], ready["family"], ready["runtime"], ready["dtype"]) == ("ready", "qwen3", "gguf", "f32")
        query = QUERIES[0]
        resp = client.post("/v2/rerank", json={"model": "qwen3-gguf", "query": query, "documents": DOCS})
        assert resp.status_code == 200, resp.text
        results = resp.json()["results"]
        assert [r["index"] for r in results] == _order(expected[query])
        got = {r["index"]: r["relevance_score"] for r in results}
        assert [got[i] for i in range(len(DOCS))] == pytest.approx(expected[query], abs=TOLERANCE["f32"])


CUSTOM = "Given a question about a city, retrieve the passage that names its country"


@pytest.mark.anyio
async def test_a_request_instruction_replaces_the_templates_own(engines, files):
    """The converter writes Qwen3's default instruction into the rerank template; a request's
    instruction takes its place, token for token as in Qwen's prompt, and scores as the
    reference does with it (it was ignored: the same scores whatever the instruction)."""
    engine, query = engines["f32"], QUERIES[0]
    tok = engine.tokenizer
    assert tok.default_instruction == reference.DEFAULT_INSTRUCTION
    shared = tok.encode_shared(query, CUSTOM)
    items = tok.encode_documents(DOCS)
    assert [tok.assemble(shared, d) for d in items] == [
        reference.tokenize(files["hf"], reference.prompt_text(CUSTOM, query, d)) for d in DOCS
    ]
    assert tok.encode_shared(query, reference.DEFAULT_INSTRUCTION) == tok.encode_shared(query, "")
    got = (await engine.score(ScoreJob(query=query, instruction=CUSTOM, shared_ids=shared, item_ids=items))).scores
    want = reference.score_texts(files["hf"], query, DOCS, instruction=CUSTOM)
    assert got == pytest.approx(want, abs=TOLERANCE["f32"])
    default = (await engine.score(_job(engine, query, DOCS))).scores
    assert max(abs(a - b) for a, b in zip(got, default, strict=True)) > 10 * TOLERANCE["f32"]  # it matters
