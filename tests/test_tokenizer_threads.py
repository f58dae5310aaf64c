"""The Rust tokenizer's settings: batch encoding in parallel unless the environment says, set before it loads.

Both tokenizer loaders (encoders, LLM rerankers) and ``serve`` (before any engine, vLLM's own
tokenizer included, loads) set ``TOKENIZERS_PARALLELISM``; the pool's size is rayon's own
(``RAYON_NUM_THREADS``): a cap of 8 threads was measured but not made a default (report
gpu-h200-2026-12-03, calls 7 and 8).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters.families.layout import load_fast_tokenizer, prepare_rust_tokenizers
from adapters.families.llm import load_hf_tokenizer
from tests.tiny_encoders import build_tiny_cross_encoder
from tests.tiny_qwen3 import build_tiny_qwen3


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    return monkeypatch


def test_parallel_unless_the_environment_says(clean_env):
    prepare_rust_tokenizers()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert "RAYON_NUM_THREADS" not in os.environ  # rayon's own size: one thread per CPU
    clean_env.setenv("TOKENIZERS_PARALLELISM", "false")
    prepare_rust_tokenizers()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.parametrize("loader", ["encoder", "llm"])
def test_both_tokenizer_loaders_set_it_before_loading(clean_env, tmp_path: Path, loader):
    if loader == "encoder":
        load_fast_tokenizer(str(build_tiny_cross_encoder(tmp_path / "m")), None)
    else:
        load_hf_tokenizer(str(build_tiny_qwen3(tmp_path / "m")))
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_serve_sets_it_before_any_engine_loads(clean_env, tmp_path: Path):
    """``serve`` sets it before the server (and with it every engine and worker) starts."""
    from gateway import cli
    from gateway.launch import servers

    config = tmp_path / "gateway.toml"
    config.write_text('[[models]]\nname = "s"\nengine = "static"\n')
    seen: list[str | None] = []

    def run_uvicorn(settings, config_path):
        seen.append(os.environ.get("TOKENIZERS_PARALLELISM"))
        return False  # "not served": _serve returns 1 without ending the test process

    clean_env.setattr(servers, "run_uvicorn", run_uvicorn)
    assert cli.main(["serve", "--config", str(config)]) == 1
    assert seen == ["true"]
