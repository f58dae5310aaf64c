"""family = "auto" on a sentence-transformers embedding model built on a causal LM.

docs/sentence-transformers.md: "auto" picks bi-encoder when modules.json has a Pooling module.
Embedding models such as Qwen3-Embedding or gte-Qwen2 keep their causal-LM architecture name in
config.json; read as a reranker they would be scored with a yes/no prompt, silently.
"""

from __future__ import annotations

import pytest

from adapters.families.detect import ModelFiles, detect_family

_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "GemmaForCausalLM", "Qwen3ForCausalLM"])
def test_a_pooling_module_on_a_causal_lm_is_a_bi_encoder(arch):
    files = ModelFiles(
        path="emb", config={"architectures": [arch]}, modules=_MODULES, pooling={"pooling_mode_lasttoken": True}
    )
    found = detect_family(files)
    assert found.family == "bi-encoder", found


@pytest.mark.parametrize(
    ("arch", "family"),
    [
        ("Qwen2ForCausalLM", "mxbai-rerank-v2"),
        ("GemmaForCausalLM", "bge-reranker-v2-gemma"),
        ("Qwen3ForCausalLM", "qwen3"),
    ],
)
def test_a_plain_causal_lm_is_still_a_reranker(arch, family):
    assert detect_family(ModelFiles(path="r", config={"architectures": [arch]})).family == family
