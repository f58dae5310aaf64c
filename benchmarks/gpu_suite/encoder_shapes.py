"""The cross-encoder shapes ``benchmarks/gpu_suite/encoders.py`` builds (``--model``), besides its XLM-R default.

ModernBERT-base's real config (answerdotai/ModernBERT-base, as gte-reranker-modernbert-base
uses it): hidden 768, 22 layers, 12 heads, GeGLU MLP 1,152, vocabulary 50,368, global attention
every 3rd layer (RoPE theta 160k) and local attention over 128 tokens (±64, theta 10k) in the
others, 8,192 positions; one label, "cls" pooling here (``--pooling mean`` for gte's).

Also the FLOP count of a request for either layout: a GeGLU MLP has three matrices, a local
layer attends to at most ``local_attention + 1`` keys per query.
"""

from __future__ import annotations

from typing import Any

__all__ = ("MODERNBERT_CONFIG", "MODERNBERT_TINY", "flops_per_request", "pair_specials")

MODERNBERT_CONFIG: dict[str, Any] = {
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "intermediate_size": 1152,
    "hidden_activation": "gelu",
    "max_position_embeddings": 8192,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "norm_eps": 1e-5,
    "norm_bias": False,
    "classifier_pooling": "cls",
    "num_labels": 1,
    "initializer_range": 0.02,
}
# A CPU check of the script (not a measurement): 3 layers, a 16-token window the pairs outgrow.
MODERNBERT_TINY: dict[str, Any] = {
    **MODERNBERT_CONFIG,
    "vocab_size": 2000,
    "hidden_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "intermediate_size": 192,
    "max_position_embeddings": 1024,
    "local_attention": 16,
    "initializer_range": 0.2,
}


def pair_specials(cfg: dict[str, Any]) -> int:
    """Special tokens in a pair: ``<s> q </s></s> d </s>`` (XLM-R) or ``[CLS] q [SEP] d [SEP]`` (ModernBERT)."""
    return 3 if cfg.get("model_type") == "modernbert" else 4


def flops_per_request(cfg: dict[str, Any], pair_lens: list[int]) -> float:
    """2 x non-embedding weights x tokens + bidirectional attention (QK^T and PV: 4 L x keys x d per layer)."""
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    glu = cfg.get("model_type") == "modernbert"
    weights = layers * (4 * h * h + (3 if glu else 2) * h * i)
    tokens = sum(pair_lens)
    every, window = cfg.get("global_attn_every_n_layers", 1), cfg.get("local_attention")
    attention = 0
    for layer in range(layers):
        local = glu and window is not None and layer % every != 0
        attention += sum(4 * n * (min(n, window + 1) if local else n) * h for n in pair_lens)
    return 2 * weights * tokens + attention
