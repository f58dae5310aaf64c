"""The vLLM engines' arguments and error mapping, without a vLLM engine start (vLLM's engine is faked)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("vllm")

from adapters.runtimes.vllm_base import build_engine_args
from adapters.runtimes.vllm_score import VllmScoreEngine
from schemas.config import VllmScoreEngineConfig


def test_trust_remote_code_reaches_vllm() -> None:
    """A model configured with trust_remote_code = true (its tokenizer is loaded with it) must
    start vLLM with it too: vLLM loads the config, tokenizer and weights itself."""
    cfg = VllmScoreEngineConfig(name="m", path="/models/custom-ce", trust_remote_code=True)
    args = build_engine_args(cfg, {"runner": "pooling"})
    assert args.get("trust_remote_code") is True


def test_vllm_admission_rejection_is_a_503_not_a_502() -> None:
    """vLLM's admission control (engine_args max_num_queued_reqs / max_num_queued_tokens, passed
    through as documented) rejects with a 503-class error so clients retry; the gateway has
    EngineOverloadedError (503 + Retry-After) for this, but answered 502 ("vLLM failed")."""
    exceptions = pytest.importorskip("vllm.exceptions")
    overflow = getattr(exceptions, "QueueOverflowError", None)
    if overflow is None:
        pytest.skip("this vLLM has no admission control")
    from adapters.base import EngineOverloadedError
    from adapters.families.base import Row

    class Busy:
        errored = False

        def encode(self, *args: Any, **kwargs: Any) -> Any:
            async def gen() -> Any:
                raise overflow()
                yield  # an async generator, as AsyncLLM.encode is

            return gen()

    engine = VllmScoreEngine(VllmScoreEngineConfig(name="m"))
    with pytest.raises(EngineOverloadedError):
        asyncio.run(engine._run_all(Busy(), [Row([1, 2, 3])]))  # type: ignore[arg-type]
