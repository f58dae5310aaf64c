"""``gelu_epilogue``: the packed cross-encoder's MLP activation computed in its up-projection GEMM.

On CUDA that is cuBLASLt's bias + GELU epilogue, which computes GELU's tanh approximation; on
CPU the replica does the same arithmetic in two ops. So the independent reference for
``gelu_epilogue = "on"`` is sentence-transformers on the same weights with the config's
``hidden_act`` switched to transformers' ``gelu_pytorch_tanh``: equal within float32 rounding (2e-6; the two references differ by 9e-6-1.5e-4 here).
The exact model (``"off"``, and ``"auto"`` on CPU) stays equal to sentence-transformers on the
original checkpoint, and the two references differ here by far more than the tolerance, so a
replica that ignored the setting (or always approximated) fails. ReLU's epilogue is exact; an
activation without an epilogue, ModernBERT's gated MLP and Qwen3 refuse ``"on"`` with one line.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from adapters.base import EngineConfigError, ScoreJob
from adapters.registry import build_engine
from schemas.config import PackedEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_encoders import build_tiny_cross_encoder, build_tiny_modernbert

pytestmark = pytest.mark.anyio
TOL = 2e-6  # packed float32 vs sentence-transformers agree within ~3e-7 here


def _st(path: Path, query: str, docs: list[str]) -> list[float]:
    import sentence_transformers as st

    return [float(s) for s in st.CrossEncoder(str(path), device="cpu").predict([(query, d) for d in docs])]


def _with_act(src: Path, dst: Path, act: str) -> Path:
    """A copy of ``src`` whose config names another activation (same weights)."""
    shutil.copytree(src, dst)
    cfg = dst / "config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "hidden_act": act}))
    return dst


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("epilogue")
    out = {kind: build_tiny_cross_encoder(base / kind, kind=kind) for kind in ("xlmr", "bert", "electra")}
    for kind in ("xlmr", "bert", "electra"):
        out[f"{kind}-tanh"] = _with_act(out[kind], base / f"{kind}-tanh", "gelu_pytorch_tanh")
    out["relu"] = build_tiny_cross_encoder(base / "relu", kind="bert", config_extra={"hidden_act": "relu"})
    out["silu"] = build_tiny_cross_encoder(base / "silu", kind="bert", config_extra={"hidden_act": "silu"})
    out["modernbert"] = build_tiny_modernbert(base / "modernbert")
    return out


async def _scores(path: Path, mode: str, docs: list[str] = DOCS) -> tuple[list[float], dict]:
    eng = build_engine(
        PackedEngineConfig(name="p", path=str(path), devices=("cpu",), batch_tokens=200, gelu_epilogue=mode)
    )
    await eng.start()
    try:
        tok = eng.tokenizer
        job = ScoreJob(
            query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(docs)
        )
        return (await eng.score(job)).scores, eng.stats()
    finally:
        await eng.stop()


@pytest.mark.parametrize("kind", ["xlmr", "bert", "electra"])
async def test_on_scores_as_the_tanh_gelu_model_and_off_as_the_exact_one(dirs, kind):
    exact, approx = _st(dirs[kind], Q, DOCS), _st(dirs[f"{kind}-tanh"], Q, DOCS)
    # The two references really differ here, by more than twice the tolerance: a replica computing
    # the other one than asked would be off by more than TOL. (Measured 9e-6 to 1.5e-4: the tiny
    # checkpoints are not bit-identical from build to build, so no larger margin is asked.)
    assert max(abs(a - b) for a, b in zip(exact, approx, strict=True)) > 2 * TOL
    on, on_stats = await _scores(dirs[kind], "on")
    assert on == pytest.approx(approx, abs=TOL)
    assert on_stats["gelu_epilogue"] == "gelu"
    for mode in ("off", "auto"):  # "auto" is the GPU's half precision only: exact on CPU float32
        off, off_stats = await _scores(dirs[kind], mode)
        assert off == pytest.approx(exact, abs=TOL)
        assert off_stats["gelu_epilogue"] is None
    # the approximation keeps the ranking of these documents
    assert sorted(range(len(DOCS)), key=lambda i: -on[i]) == sorted(range(len(DOCS)), key=lambda i: -exact[i])


async def test_relu_epilogue_is_exact(dirs):
    on, stats = await _scores(dirs["relu"], "on")
    assert stats["gelu_epilogue"] == "relu"
    assert on == pytest.approx(_st(dirs["relu"], Q, DOCS), abs=TOL)


async def test_on_is_refused_where_there_is_no_epilogue(dirs):
    with pytest.raises(EngineConfigError, match="hidden_act 'silu' has no GEMM epilogue"):
        await _scores(dirs["silu"], "on")
    with pytest.raises(EngineConfigError, match="ModernBERT's MLP is gated"):
        await _scores(dirs["modernbert"], "on")
    # "auto" just runs the activation on its own there
    scores, stats = await _scores(dirs["silu"], "auto")
    assert stats["gelu_epilogue"] is None
    assert scores == pytest.approx(_st(dirs["silu"], Q, DOCS), abs=TOL)


def test_on_is_refused_for_qwen3_in_the_config():
    with pytest.raises(ValueError, match="Qwen3's MLP is gated"):
        PackedEngineConfig(name="q", path="/x", family="qwen3", gelu_epilogue="on")
