"""A local stand-in for ``jinaai/jina-reranker-v3``, loaded through the real remote-code path.

The real model's weights and code cannot be fetched here. This writes a checkpoint directory
with the same *interface*: ``config.json`` whose ``architectures`` is ``JinaForRanking`` and
whose ``auto_map`` points ``AutoConfig``/``AutoModel`` at Python files in the directory, so
``AutoModel.from_pretrained(dir, trust_remote_code=True)`` imports that code exactly as it would
import Jina's, and a model with ``rerank(query, documents, top_n=None)`` returning
``[{"document", "relevance_score", "index"}]`` sorted by descending score.

The stand-in's score is a cosine between mean-pooled embeddings of hashed words: per document,
independent of its neighbours, so a test can check that blocks are merged back to the right
positions whatever the block size. It is NOT Jina's model and says nothing about its quality.
It also records each ``rerank`` call's document count (``model.calls``) so tests see the blocks.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONFIG_PY = """
from transformers import PretrainedConfig


class TinyJinaConfig(PretrainedConfig):
    model_type = "tiny_jina_ranking"

    def __init__(self, vocab_size=97, hidden_size=16, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        super().__init__(**kwargs)
"""

MODELING_PY = """
import zlib

import torch
from transformers import PreTrainedModel

from .configuration_tiny_jina import TinyJinaConfig


def word_ids(text, vocab_size):
    return [zlib.crc32(w.lower().encode("utf-8")) % vocab_size for w in text.split()] or [0]


class JinaForRanking(PreTrainedModel):
    config_class = TinyJinaConfig
    base_model_prefix = "ranker"

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.calls = []
        self.post_init()

    def _embed(self, text):
        ids = torch.tensor(word_ids(text, self.config.vocab_size), device=self.embed.weight.device)
        return self.embed(ids).float().mean(0)

    @torch.no_grad()
    def rerank(self, query, documents, top_n=None, return_embeddings=False):
        self.calls.append(len(documents))
        q = self._embed(query)
        out = []
        for i, doc in enumerate(documents):
            score = torch.nn.functional.cosine_similarity(q, self._embed(doc), dim=0).item()
            out.append({"document": doc, "relevance_score": score, "index": i})
        out.sort(key=lambda r: r["relevance_score"], reverse=True)
        return out[:top_n] if top_n else out
"""


def build_tiny_jina(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write the stand-in checkpoint (config, code, random weights) to ``out_dir``."""
    import importlib.util

    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "configuration_tiny_jina.py").write_text(CONFIG_PY)
    (out / "modeling_tiny_jina.py").write_text(MODELING_PY)
    # Instantiate from the very files just written (not from the source above) and save.
    spec = importlib.util.spec_from_file_location("tiny_jina_pkg", out / "configuration_tiny_jina.py")
    assert spec and spec.loader
    conf_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf_mod)
    config = conf_mod.TinyJinaConfig(
        architectures=["JinaForRanking"],
        auto_map={
            "AutoConfig": "configuration_tiny_jina.TinyJinaConfig",
            "AutoModel": "modeling_tiny_jina.JinaForRanking",
        },
    )
    config.save_pretrained(out)
    torch.manual_seed(seed)
    weights = torch.randn(config.vocab_size, config.hidden_size)
    from safetensors.torch import save_file

    save_file({"embed.weight": weights}, str(out / "model.safetensors"))
    return out


if __name__ == "__main__":
    print(build_tiny_jina(sys.argv[1]))
