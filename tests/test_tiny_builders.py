"""The tests' tiny checkpoints build the same files every time: a tolerance measured on one build
holds on the next (tokenizers' Unigram trainer orders tied pieces differently run to run, which
gave every XLM-R test new token ids, so new scores, per build: ``tiny_encoders.fix_unigram_order``)."""

from __future__ import annotations

from pathlib import Path

from tests.tiny_encoders import _xlmr_tokenizer
from tests.tiny_gguf import build_tiny_xlmr


def test_the_xlmr_tokenizer_builds_the_same_bytes(tmp_path: Path) -> None:
    built = []
    for i in range(3):
        _xlmr_tokenizer(tmp_path / str(i))
        built.append((tmp_path / str(i) / "tokenizer.json").read_bytes())
    assert built[0] == built[1] == built[2]


def test_the_gguf_xlmr_builds_the_same_tokenizer(tmp_path: Path) -> None:
    a, b = (Path(build_tiny_xlmr(tmp_path / n)) / "tokenizer.json" for n in ("a", "b"))
    assert a.read_bytes() == b.read_bytes()
