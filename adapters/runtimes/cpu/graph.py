"""The graph the openvino runtime exports for a BERT-style cross-encoder: the model's own
arithmetic on a right-padded batch, without what its head never reads.

A cross-encoder's head reads one position, the pair's first token (BERT's pooler, RoBERTa's and
XLM-R's classification head, ELECTRA's). Through every layer but the last, every position is
needed: the next layer's keys and values are computed from all of them. In the last layer,
nothing after the attention mixes positions, so the first token alone needs its query, its
attention output, the output projection, the MLP and the norms; only the keys and values are
computed for every token. transformers' modules compute the whole last layer for every token
and the head then drops all rows but one. Skipping them is exact -- the same products on the
rows that are kept -- and saves about five sixths of a layer: 14 % of MiniLM-L6's FLOPs, 7 % of
a 12-layer base model's (the packed GPU engine does the same, ``packed/encoder_forward.py``).

Built for the architectures whose layers are BERT's post-norm layers with absolute positions
(``bert``, ``roberta``, ``xlm-roberta``, ``electra``); any other (ModernBERT, DeBERTa, relative
positions, bi-encoders' pooling over every token) is exported as transformers runs it.
``tests/test_openvino_graph.py`` checks the graph against the checkpoint's own model on each.

Imported only through the openvino runtime's export (pulls in torch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ("TRIMMED_TYPES", "TrimmedCrossEncoder", "trimmed_cross_encoder")

TRIMMED_TYPES = ("bert", "roberta", "xlm-roberta", "electra")


def trimmed_cross_encoder(model: Any) -> TrimmedCrossEncoder | None:
    """``model`` (a ``*ForSequenceClassification``) as a trimmed graph, or None where its
    arithmetic is not the one written here (then the model is exported as it is)."""
    config = model.config
    if config.model_type not in TRIMMED_TYPES:
        return None
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        return None  # relative_key(_query): attention scores with position terms, not written here
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return None
    return TrimmedCrossEncoder(model)


class TrimmedCrossEncoder(torch.nn.Module):
    """``forward(input_ids, attention_mask[, token_type_ids]) -> logits`` (float32), as the
    checkpoint's model returns them; the model's modules are registered, so tracing takes
    their weights as the graph's constants."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        config = model.config
        base = getattr(model, model.base_model_prefix)
        self._emb = base.embeddings
        self._project = getattr(base, "embeddings_project", None)  # ELECTRA: embedding_size -> hidden_size
        self._layers = list(base.encoder.layer)
        # BERT scores pooler(first token) through ``classifier``; the others' ``classifier`` is a
        # head module that takes (rows, seq, hidden) features and reads position 0 itself.
        self._pooler = getattr(base, "pooler", None) if config.model_type == "bert" else None
        # RoBERTa-style embeddings number the non-pad tokens from padding_idx + 1 (transformers'
        # create_position_ids_from_input_ids); BERT and ELECTRA count from 0.
        self._pad = config.pad_token_id if config.model_type in ("roberta", "xlm-roberta") else None

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        e = self._emb
        if self._pad is not None:
            real = input_ids.ne(self._pad).to(torch.int64)
            positions = torch.cumsum(real, dim=1) * real + self._pad
        else:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :].expand_as(input_ids)
        types = token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
        # The embedding module's own tables and norm, in its order: (word + token type) + position, LayerNorm.
        h = e.LayerNorm(
            e.word_embeddings(input_ids) + e.token_type_embeddings(types) + e.position_embeddings(positions)
        )
        if self._project is not None:
            h = self._project(h)
        keep = attention_mask.to(torch.bool)[:, None, None, :]  # (rows, 1, 1, keys): attend to real tokens
        last = len(self._layers) - 1
        for i, layer in enumerate(self._layers):
            h = _layer(layer, h, keep, first_only=i == last)
        logits = self.model.classifier(self._pooler(h) if self._pooler is not None else h)
        return logits.float()


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(rows, seq, hidden) -> (rows, heads, seq, head_dim)."""
    rows, seq, hidden = x.shape
    return x.view(rows, seq, heads, hidden // heads).transpose(1, 2)


def _layer(layer: Any, h: torch.Tensor, keep: torch.Tensor, *, first_only: bool) -> torch.Tensor:
    """One post-norm layer as transformers' BERT layer computes it; ``first_only``: keys and
    values from every token, everything else for each row's first token only."""
    a, out = layer.attention.self, layer.attention.output
    heads = a.num_attention_heads
    x = h[:, :1] if first_only else h
    q, k, v = _heads(a.query(x), heads), _heads(a.key(h), heads), _heads(a.value(h), heads)
    ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    ctx = ctx.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
    x = out.LayerNorm(out.dense(ctx) + x)
    up = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
    return layer.output.LayerNorm(layer.output.dense(up) + x)
