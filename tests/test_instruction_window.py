"""A long request `instruction` that fills the window is named in the 422.

The query is capped at max_query_tokens, the instruction is not: a client-sent instruction is
what leaves a document no room, and the 422 must say so (it said "the query leaves no room").
"""

from __future__ import annotations

import time

from litestar.testing import TestClient

from gateway.app import create_app
from schemas.config import Settings, TransformersEngineConfig


def test_an_instruction_that_fills_the_window_is_named_in_the_422(tiny_qwen3_dir):
    settings = Settings(
        models=(
            TransformersEngineConfig(
                name="tiny", path=str(tiny_qwen3_dir), dtype="float32", max_length=160, max_query_tokens=32
            ),
        )
    )
    with TestClient(create_app(settings, configure_logs=False)) as c:
        deadline = time.monotonic() + 60
        while c.get("/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        body = {
            "model": "tiny",
            "query": "capital",  # one word: far below max_query_tokens
            "documents": ["Paris is the capital of France."],
            "instruction": "Given a web search query retrieve relevant passages " * 40,
        }
        resp = c.post("/v1/rerank", json=body)
        assert resp.status_code == 422, resp.text
        assert "instruction" in resp.json()["message"], resp.json()["message"]
