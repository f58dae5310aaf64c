"""The Rust tokenizer's thread pool: at most 8 threads on machines of more CPUs, unless the environment says.

One thread per CPU pushed the threads that launch GPU work off their cores (report
gpu-h200-2026-12-03, call 7: 8 of 16 tokenized as fast and cut the idle p99). Both tokenizer
loaders (encoders, LLM rerankers) set it before the tokenizer's first parallel batch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters.families import layout
from adapters.families.layout import load_fast_tokenizer, prepare_rust_tokenizers
from adapters.families.llm import load_hf_tokenizer
from tests.tiny_encoders import build_tiny_cross_encoder
from tests.tiny_qwen3 import build_tiny_qwen3


def _machine(monkeypatch: pytest.MonkeyPatch, cpus: int, rayon: str | None = None) -> None:
    monkeypatch.setattr(layout.os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    if rayon is None:
        monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("RAYON_NUM_THREADS", rayon)


@pytest.mark.parametrize(("cpus", "rayon", "want"), [
    (16, None, "8"),  # the H200 host
    (64, None, "8"),
    (9, None, "8"),
    (8, None, None),  # rayon's own default: one per CPU
    (2, None, None),  # the CI box
    (16, "12", "12"),  # the operator's setting wins
])
def test_the_pool_is_capped_at_8_threads_on_larger_machines(monkeypatch, cpus, rayon, want):
    _machine(monkeypatch, cpus, rayon)
    prepare_rust_tokenizers()
    assert os.environ.get("RAYON_NUM_THREADS") == want
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


@pytest.mark.parametrize("loader", ["encoder", "llm"])
def test_both_tokenizer_loaders_set_it_before_loading(monkeypatch, tmp_path: Path, loader):
    _machine(monkeypatch, 32)
    if loader == "encoder":
        load_fast_tokenizer(str(build_tiny_cross_encoder(tmp_path / "m")), None)
    else:
        load_hf_tokenizer(str(build_tiny_qwen3(tmp_path / "m")))
    assert os.environ.get("RAYON_NUM_THREADS") == "8"


def test_serve_sets_it_before_any_engine_loads(monkeypatch, tmp_path: Path):
    """``serve`` sets it before the server (and with it every engine and worker) starts."""
    from gateway import cli
    from gateway.launch import servers

    _machine(monkeypatch, 16)
    config = tmp_path / "gateway.toml"
    config.write_text('[[models]]\nname = "s"\nengine = "static"\n')
    seen: list[str | None] = []

    def run_uvicorn(settings, config_path):
        seen.append(os.environ.get("RAYON_NUM_THREADS"))
        return False  # "not served": _serve returns 1 without ending the test process

    monkeypatch.setattr(servers, "run_uvicorn", run_uvicorn)
    assert cli.main(["serve", "--config", str(config)]) == 1
    assert seen == ["8"]
