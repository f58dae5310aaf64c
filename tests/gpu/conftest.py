"""The GPU suite's device: CUDA, or -- with ``RR_GPU_SUITE_ON_CPU=1`` -- the CPU, to check the
suite's own plumbing on a machine without a GPU (the CUDA-only checks skip there; nothing of the
CUDA paths is tested that way)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ON_CPU = os.environ.get("RR_GPU_SUITE_ON_CPU") == "1"


def cuda_only(what: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not torch.cuda.is_available(), reason=f"{what} runs on CUDA only")


@pytest.fixture(scope="session")
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if ON_CPU:
        return torch.device("cpu")
    pytest.skip("the GPU suite needs CUDA (RR_GPU_SUITE_ON_CPU=1 runs its plumbing on the CPU)")


@pytest.fixture(scope="session")
def spread_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """tests/tiny_qwen3_spread.py's checkpoint: P(yes) spread over ~0.1-0.99, so a wrong step moves scores far."""
    from tests.tiny_qwen3_spread import build_tiny_qwen3_spread

    yield build_tiny_qwen3_spread(tmp_path_factory.mktemp("gpu-qwen3-spread") / "m")


def replica(path: Path, device: torch.device, *, compile: bool) -> tuple[Any, Any]:
    """A bf16 ``PackedQwen3Replica`` of the checkpoint at ``path`` on ``device`` (kernels "auto"), and its prompt tokenizer."""
    from adapters.families.qwen3 import Qwen3PromptTokenizer, load_hf_tokenizer
    from adapters.runtimes.packed.forward import PackedQwen3Replica, load_backbone

    tok: Any = Qwen3PromptTokenizer(load_hf_tokenizer(str(path), None), max_length=512, max_query_tokens=64)
    backbone, head = load_backbone(str(path), None, torch.bfloat16, (tok.no_id, tok.yes_id))
    rep: Any = PackedQwen3Replica(backbone, head, device, attention="auto", compile=compile)
    return rep, tok
