"""A GGUF cross-encoder whose pairs need token types (BERT: type 1 on the document).

llama.cpp's BERT graph adds row 0 of the token-type table to every token ("token types are
hardcoded to zero", src/models/bert.cpp), so such a model scores differently on gguf than the
checkpoint does on transformers (measured on this tiny model: 0.86 vs 0.040 for one pair), with
the very same token ids. The gguf runtime must refuse it rather than serve other scores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="the gguf extra (llama-cpp-python) is not installed")

from adapters.runtimes.gguf import GgufEngine, inspect_gguf
from schemas.config import GgufEngineConfig
from tests.tiny_gguf import build_tiny_xlmr, write_gguf

pytestmark = pytest.mark.anyio


def _typed_pair_model(out: Path) -> Path:
    """The tiny XLM-R with a second token-type row, its tokenizer typing the document 1 (as BERT's)."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    hf = build_tiny_xlmr(out)
    model = XLMRobertaForSequenceClassification.from_pretrained(hf)
    old = model.roberta.embeddings.token_type_embeddings.weight.data
    torch.manual_seed(3)
    table = torch.nn.Embedding(2, old.shape[1])
    table.weight.data[0] = old[0]
    table.weight.data[1] = torch.randn(old.shape[1]) * 0.5
    model.roberta.embeddings.token_type_embeddings = table
    model.config.type_vocab_size = 2
    model.save_pretrained(hf)
    tj = json.loads((hf / "tokenizer.json").read_text())
    pair = tj["post_processor"]["pair"]
    pair[-2]["Sequence"]["type_id"] = 1  # $B
    pair[-1]["SpecialToken"]["type_id"] = 1  # its </s>
    (hf / "tokenizer.json").write_text(json.dumps(tj))
    tc = json.loads((hf / "tokenizer_config.json").read_text())
    tc.update(
        tokenizer_class="PreTrainedTokenizerFast", model_input_names=["input_ids", "token_type_ids", "attention_mask"]
    )
    (hf / "tokenizer_config.json").write_text(json.dumps(tc))
    return hf


async def test_a_gguf_whose_pairs_need_token_types_is_refused(tmp_path):
    gguf = write_gguf(_typed_pair_model(tmp_path / "hf"), tmp_path / "typed.gguf")
    assert inspect_gguf(str(gguf)).family == "cross-encoder"
    engine = GgufEngine(GgufEngineConfig(name="g", path=str(gguf)))
    with pytest.raises(ValueError, match="token types"):
        await engine.start()
    await engine.stop()
