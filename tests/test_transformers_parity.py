"""bf16 / fp16 on a CPU in the transformers engine: a reduced precision the parity gate admits
only where it keeps fp32's top-10 order (adapters/runtimes/parity.py, as OpenVINO's bf16 / int8).

Tiny random checkpoints: bf16 reorders their bunched scores (refused), fp16 keeps them (admitted),
so both verdicts are seen. Small golden sets keep each start to seconds on 2 cores. The cross-encoder
has a vocabulary that is the same in every process (``fixed_vocab``) and a seed whose fp16 verdict
is not on the default tie's edge: the closest pair fp16 must keep in order stays 1.9e-3 apart, more
than fp16's largest score change (1.5e-3). A trained tokenizer differs per process (its trainer
breaks ties in hash order), so the checkpoint -- and the verdict -- differed between runs
(tests/test_parity_determinism.py starts it repeatedly, beside load and in fresh processes).
"""

from __future__ import annotations

import pytest

from adapters.base import EngineConfigError, ScoreJob
from adapters.runtimes.parity import graded_golden_set
from adapters.runtimes.transformers import TransformersEngine, _golden_scores
from schemas.config import DEFAULT_INSTRUCTION, PARITY_TIE, TransformersEngineConfig
from tests import reference
from tests.tiny_encoders import build_tiny_cross_encoder

pytestmark = pytest.mark.anyio

SMALL = {"parity_queries": 8, "parity_documents": 12}
GATED_SEED = 2  # see the module doc: fp16's verdict clear of the default tie's edge


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-ce") / "m", fixed_vocab=True, seed=GATED_SEED)


def _cfg(path, **kw) -> TransformersEngineConfig:
    return TransformersEngineConfig(name="m", path=str(path), **{**SMALL, **kw})


async def _started(cfg: TransformersEngineConfig) -> TransformersEngine:
    engine = TransformersEngine(cfg)
    await engine.start()
    return engine


async def _scores(engine: TransformersEngine, query: str, docs: list[str]) -> list[float]:
    tok = engine.tokenizer
    assert tok is not None
    shared = tok.encode_shared(query, "")
    job = ScoreJob(query=query, instruction="", shared_ids=shared, item_ids=tok.encode_documents(docs))
    return list((await engine.score(job)).scores)


async def test_bf16_that_moves_the_ranking_is_refused_in_one_line(cross_encoder):
    engine = TransformersEngine(_cfg(cross_encoder, dtype="bfloat16"))
    with pytest.raises(EngineConfigError) as info:
        await engine.start()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("model 'm': precision 'bfloat16' keeps the fp32 top-10 order of ")
    assert 'below parity_min_agreement 99%; refused: use dtype = "float32"' in msg
    await engine.stop()


async def test_a_precision_the_gate_admits_serves_in_that_dtype(cross_encoder):
    query = "which documents mention apple and river?"
    docs = [d.documents[0] for d in graded_golden_set(queries=4, documents=12)] + ["apple river apple river"]
    fp32 = await _started(_cfg(cross_encoder, dtype="float32"))
    try:
        want = await _scores(fp32, query, docs)
        assert "parity" not in fp32.stats()  # fp32 is the reference: no gate
    finally:
        await fp32.stop()
    fp16 = await _started(_cfg(cross_encoder, dtype="float16"))  # the default tie
    try:
        got = await _scores(fp16, query, docs)
        parity = fp16.stats()["parity"]
        assert fp16.describe()["dtype"] == "float16"
    finally:
        await fp16.stop()
    assert parity["precision"] == "float16" and parity["golden"] == "generated" and parity["tie"] == PARITY_TIE
    assert parity["queries"] == parity["kept"] == SMALL["parity_queries"] and parity["agreement"] == 1.0
    assert got != want and got == pytest.approx(want, abs=5e-3)  # served in fp16, not in the fp32 the gate loaded first


async def test_warn_serves_a_failed_precision_and_reports_the_gate(tiny_qwen3_dir):
    engine = await _started(_cfg(tiny_qwen3_dir, dtype="bfloat16", precision_gate="warn", parity_queries=16))
    try:
        parity = engine.stats()["parity"]
        assert engine.describe()["dtype"] == "bfloat16"
        assert len(await _scores(engine, "capital?", ["Paris.", "qubits"])) == 2
    finally:
        await engine.stop()
    assert parity["agreement"] < 0.99 and parity["queries"] == 16 and parity["max_score_change"] > 0


@pytest.mark.parametrize("instruction", [None, "Find similar text."])
async def test_the_gate_scores_the_golden_set_as_a_request_is_scored(tiny_qwen3_dir, instruction):
    """The gate's fp32 pass against the independent reference: same prompts (the model's configured
    instruction, else the default one, as a request without one gets), same score rule, batched
    as requests are."""
    cfg = _cfg(tiny_qwen3_dir, dtype="float32", batch_tokens=600, max_batch_size=4, instruction=instruction)
    engine = await _started(cfg)
    try:
        golden = graded_golden_set(queries=2, documents=12)
        got = _golden_scores(engine._family, cfg, golden)
    finally:
        await engine.stop()
    for g, scores in zip(golden, got, strict=True):
        want = reference.score_texts(tiny_qwen3_dir, g.query, g.documents, instruction or DEFAULT_INSTRUCTION)
        assert scores == pytest.approx(want, abs=1e-4)


async def test_a_listwise_family_is_gated_through_its_blocks(tmp_path_factory):
    from tests.tiny_jina import build_tiny_jina

    path = build_tiny_jina(tmp_path_factory.mktemp("tiny-jina"))
    engine = await _started(
        _cfg(path, dtype="bfloat16", precision_gate="warn", parity_queries=3, block_size=5, trust_remote_code=True)
    )
    try:
        parity = engine.stats()["parity"]
    finally:
        await engine.stop()
    assert parity["queries"] == 3 and parity["precision"] == "bfloat16"


async def test_a_bad_parity_set_refuses_before_any_weights_load(cross_encoder, tmp_path, monkeypatch):
    golden = tmp_path / "golden.jsonl"
    golden.write_text("not json\n")
    monkeypatch.setattr("adapters.families.encoder.EncoderFamily.load_torch", lambda *a: pytest.fail("weights loaded"))
    engine = TransformersEngine(_cfg(cross_encoder, dtype="bfloat16", parity_set=str(golden)))
    with pytest.raises(EngineConfigError) as info:
        await engine.start()
    assert str(info.value) == f'model \'m\': parity_set: {golden}:1: expected {{"query": ..., "documents": [...]}}'


def test_a_parity_set_with_fp32_is_refused_at_config_load(cross_encoder):
    with pytest.raises(ValueError, match="parity_set is the golden set of the parity gate of dtype = 'bfloat16'"):
        _cfg(cross_encoder, dtype="float32", parity_set="/tmp/golden.jsonl")
