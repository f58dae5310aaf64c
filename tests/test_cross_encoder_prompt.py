"""sentence-transformers 6.x CrossEncoder: a default prompt in config_sentence_transformers.json.

``CrossEncoder.predict`` (and ``rank``) put ``prompts[default_prompt_name]`` before the query of
every pair (``prepend_prompt_to_texts``); a gateway that ignored it would serve other scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.base import ScoreJob
from adapters.runtimes.transformers import TransformersEngine
from schemas.config import TransformersEngineConfig
from tests.corpus import DOCS, Q
from tests.tiny_st import save_st_cross_encoder

pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.anyio


async def test_a_cross_encoders_default_prompt_is_put_before_the_query(tmp_path: Path):
    from sentence_transformers import CrossEncoder

    out = tmp_path / "ce"
    save_st_cross_encoder(out)
    settings = out / "config_sentence_transformers.json"
    config = json.loads(settings.read_text())
    config.update(prompts={"query": "query: "}, default_prompt_name="query")
    settings.write_text(json.dumps(config))
    expected = [float(s) for s in CrossEncoder(str(out), device="cpu").predict([(Q, d) for d in DOCS])]

    engine = TransformersEngine(TransformersEngineConfig(name="m", path=str(out), dtype="float32", device="cpu"))
    await engine.start()
    try:
        tok = engine.tokenizer
        assert tok is not None
        job = ScoreJob(
            query=Q, instruction="", shared_ids=tok.encode_shared(Q, ""), item_ids=tok.encode_documents(DOCS)
        )
        assert list((await engine.score(job)).scores) == pytest.approx(expected, abs=1e-5)
    finally:
        await engine.stop()
