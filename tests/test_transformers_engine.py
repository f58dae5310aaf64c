"""The transformers engine against the independent reference (full forward, softmax at the end)."""

from __future__ import annotations

import pytest

from adapters.base import ScoreJob
from adapters.families.qwen3 import Qwen3PromptTokenizer
from adapters.runtimes.transformers import TransformersQwen3Engine, plan_batches
from schemas.config import DEFAULT_INSTRUCTION, TransformersEngineConfig
from tests import reference

QUERIES = [
    "What is the capital of the United States?",
    "How do I change my password?",
    "qubits?",
]
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


@pytest.fixture(scope="module")
async def engine(tiny_qwen3_dir):
    # Small budgets force several batches per request with mixed padding.
    cfg = TransformersEngineConfig(
        name="t", path=str(tiny_qwen3_dir), dtype="float32", batch_tokens=300, max_batch_size=3
    )
    eng = TransformersQwen3Engine(cfg)
    await eng.start()
    yield eng
    await eng.stop()


def _job(tok: Qwen3PromptTokenizer, query: str, docs: list[str], instruction: str = DEFAULT_INSTRUCTION) -> ScoreJob:
    return ScoreJob(
        query=query,
        instruction=instruction,
        shared_ids=tok.encode_shared(query, instruction),
        item_ids=tok.encode_documents(docs),
    )


@pytest.mark.anyio
@pytest.mark.parametrize("query", QUERIES)
async def test_scores_equal_reference(engine, tiny_qwen3_dir, query):
    tok = engine.tokenizer
    result = await engine.score(_job(tok, query, DOCS))
    expected = reference.score_texts(tiny_qwen3_dir, query, DOCS)
    assert result.scores == pytest.approx(expected, abs=1e-5)
    assert len({round(s, 6) for s in expected}) > 3  # the tiny model really discriminates


@pytest.mark.anyio
async def test_custom_instruction_and_duplicates(engine, tiny_qwen3_dir):
    instruction = "Retrieve semantically similar text."
    docs = [DOCS[0], DOCS[3], DOCS[0], DOCS[3], DOCS[5]]
    result = await engine.score(_job(engine.tokenizer, QUERIES[0], docs, instruction))
    expected = reference.score_texts(tiny_qwen3_dir, QUERIES[0], docs, instruction)
    assert result.scores == pytest.approx(expected, abs=1e-5)
    assert result.scores[0] == result.scores[2] and result.scores[1] == result.scores[3]
    default = await engine.score(_job(engine.tokenizer, QUERIES[0], docs))
    assert default.scores[0] != pytest.approx(result.scores[0], abs=1e-7)


@pytest.mark.anyio
async def test_batching_does_not_change_scores(engine, tiny_qwen3_dir):
    """The same items scored one per batch and packed with padding give the same numbers."""
    tok = engine.tokenizer
    packed = await engine.score(_job(tok, QUERIES[1], DOCS))
    alone = [(await engine.score(_job(tok, QUERIES[1], [d]))).scores[0] for d in DOCS]
    assert packed.scores == pytest.approx(alone, abs=1e-5)


def test_piecewise_tokenization_equals_full_prompt(engine, tiny_qwen3_dir):
    tok = engine.tokenizer
    for query in QUERIES:
        shared = tok.encode_shared(query, DEFAULT_INSTRUCTION)
        for doc, ids in zip(DOCS, tok.encode_documents(DOCS), strict=True):
            full = reference.tokenize(tiny_qwen3_dir, reference.prompt_text(DEFAULT_INSTRUCTION, query, doc))
            assert tok.assemble(shared, ids) == full


@pytest.mark.anyio
async def test_input_tokens_counts_every_prompt_token(engine):
    tok = engine.tokenizer
    job = _job(tok, QUERIES[0], DOCS[:3])
    expected = sum(len(tok.assemble(job.shared_ids, i)) for i in job.item_ids)
    assert (await engine.score(job)).input_tokens == expected


def test_plan_batches_respects_budgets():
    lengths = [10, 50, 20, 50, 5, 400, 30]
    batches = plan_batches(lengths, batch_tokens=100, max_batch_size=2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) <= 2
        widths = [lengths[i] for i in batch]
        assert len(batch) == 1 or max(widths) * len(batch) <= 100
    assert [5] in batches  # longer than the budget: alone


def test_window_too_small_fails_clearly(tiny_qwen3_dir):
    from adapters.families.qwen3 import load_hf_tokenizer

    with pytest.raises(ValueError, match="max_length=64 leaves no room"):
        Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir)), max_length=64, max_query_tokens=32)


def test_long_query_is_truncated_in_tokens(engine, tiny_qwen3_dir):
    from adapters.families.qwen3 import load_hf_tokenizer

    tok = Qwen3PromptTokenizer(load_hf_tokenizer(str(tiny_qwen3_dir)), max_length=512, max_query_tokens=8)
    long_query = "What is the capital of the United States and of France and of Spain?"
    shared = tok.encode_shared(long_query, DEFAULT_INSTRUCTION)
    head = tok.encode_shared("x", DEFAULT_INSTRUCTION)
    # head = instruction head + " x" + "\n<Document>:"; the long query keeps exactly 8 tokens.
    assert len(shared) - len(head) == 8 - len(tok._encode(" x"))
