"""A ModernBERT cross-encoder replica run packed, without padding (``pair_replica``'s steps).

Same step as the BERT-style replica (pairs concatenated, ``cu`` their cumulative lengths, one
host buffer and one copy), other arithmetic, as transformers' ``modeling_modernbert`` runs it:

- embeddings: ``norm(tok_embeddings(ids))`` (LayerNorm without bias unless ``norm_bias``), no
  position embeddings: RoPE on q and k in every layer, positions restarting at 0 for each pair.
  The cos/sin tables come from the model's own ``rotary_emb`` module for each layer type (global
  layers ``rope_parameters["full_attention"]``, formerly ``global_rope_theta``; local layers
  ``"sliding_attention"``, formerly ``local_rope_theta``), so the rotation is the model's;
- pre-norm layers: ``h += Wo(attn(attn_norm(h)))`` (layer 0's ``attn_norm`` is Identity), then
  ``h += mlp.Wo(act(x) * gate)`` with ``x, gate = mlp.Wi(mlp_norm(h)).chunk(2)`` (GeGLU); q/k/v
  is one GEMM already (``Wqkv``);
- attention bidirectional within each pair; a layer of type "sliding_attention" (every layer
  but each ``global_attn_every_n_layers``-th, from layer 0) sees only the keys within
  ``local_attention // 2`` positions of the query, both sides inclusive (transformers'
  ``sliding_window_bidirectional_overlay``): the varlen flash kernels' ``window_size=(w, w)``,
  a band mask in the per-sequence SDPA (``varlen.pick_attention(window=w)``);
- ``final_norm``, then ``classifier_pooling``: "cls" keeps each pair's first token -- only those
  rows go through the last layer's output projection and MLP, as in the BERT-style replica --,
  "mean" averages each pair's tokens (a segment sum over the step, in float32, over the pair's
  length: no padding to mask out); then the model's ``head`` (dense, act, norm), ``drop`` and
  ``classifier`` modules on those rows.

The pointwise regions between the GEMMs (residual add + LayerNorm, RoPE, GeGLU) are compiled one
by one when ``compile`` (the CUDA default), as in the other replicas.

Imported only through ``encoder_replicas.make_replica`` (pulls in torch and transformers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from adapters.runtimes.packed import kernels, picks, varlen
from adapters.runtimes.packed.pair_replica import PackedPairReplica, real_rows

__all__ = ("PackedModernBertReplica",)

Norm = tuple[torch.Tensor, torch.Tensor | None, float]  # LayerNorm weight, bias (None: norm_bias false), eps


def _norm(module: torch.nn.LayerNorm) -> Norm:
    return module.weight, module.bias, float(module.eps)


class _Layer:
    """One ModernBERT layer's tensors and its attention type."""

    __slots__ = (
        "attn_norm",
        "dim",
        "heads",
        "local",
        "mlp_norm",
        "o_b",
        "o_w",
        "qkv_b",
        "qkv_w",
        "wi_b",
        "wi_w",
        "wo_b",
        "wo_w",
    )

    def __init__(self, layer: Any, heads: int) -> None:
        # transformers makes layer 0's attn_norm an Identity: the embeddings' norm precedes it.
        self.attn_norm = _norm(layer.attn_norm) if isinstance(layer.attn_norm, torch.nn.LayerNorm) else None
        self.qkv_w, self.qkv_b = layer.attn.Wqkv.weight, layer.attn.Wqkv.bias
        self.o_w, self.o_b = layer.attn.Wo.weight, layer.attn.Wo.bias
        self.mlp_norm = _norm(layer.mlp_norm)
        self.wi_w, self.wi_b = layer.mlp.Wi.weight, layer.mlp.Wi.bias
        self.wo_w, self.wo_b = layer.mlp.Wo.weight, layer.mlp.Wo.bias
        self.heads = heads
        self.dim = self.qkv_w.shape[0] // (3 * heads)
        self.local = layer.attention_type == "sliding_attention"


def add_ln(
    h: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, real: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the next pre-norm in one pass: ``h + delta`` and its LayerNorm; the
    residual's padding rows (``real`` false) set to 0 (``pair_replica.real_rows`` says why)."""
    h = torch.where(real, h + delta, 0.0)
    return h, F.layer_norm(h, (h.shape[-1],), w, b, eps)


def qkv_rope(
    qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split the fused projection and rotate q and k as transformers' ``apply_rotary_pos_emb``:
    in float32, with cos/sin (T, 1, dim) already rounded to the model dtype, back to the dtype."""
    q, k, v = qkv.view(qkv.shape[0], 3, heads, dim).unbind(1)
    qf, kf = q.float(), k.float()
    q = qf * cos + kernels.rotate_half(qf) * sin
    k = kf * cos + kernels.rotate_half(kf) * sin
    return q.to(qkv.dtype), k.to(qkv.dtype), v


class PackedModernBertReplica(PackedPairReplica):
    """ModernBERT's ``ModernBertForSequenceClassification`` on one device, packed (see the module docstring)."""

    def __init__(
        self, model: Any, device: torch.device, *, attention: str, compile: bool, kernel: str = "auto"
    ) -> None:
        super().__init__(model, device, compile=compile)
        cfg = self.model.config
        if cfg.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {cfg.classifier_pooling!r}: ModernBERT pools 'cls' or 'mean'")
        self.pooling = str(cfg.classifier_pooling)
        base = self.model.model
        self._emb = base.embeddings
        self._rotary = base.rotary_emb
        self._final_norm = _norm(base.final_norm)
        self._layers = [_Layer(layer, int(cfg.num_attention_heads)) for layer in base.layers]
        if any(w.attn_norm is None for w in self._layers[1:]):  # each layer's add + norm is fused with the one before
            raise ValueError("ModernBERT: only layer 0 may lack an attention norm")
        self._types = sorted({"sliding_attention" if w.local else "full_attention" for w in self._layers})
        m = self.model
        self._head: Callable[[torch.Tensor], torch.Tensor] = lambda pooled: m.classifier(m.drop(m.head(pooled)))
        # transformers' config.sliding_window: half the total width local_attention.
        self.window = int(cfg.local_attention) // 2
        dtype = self._layers[0].qkv_w.dtype
        name, self._attend = varlen.pick_attention(attention, device, kernel, causal=False, dtype=dtype)
        local_name, self._attend_local = varlen.pick_attention(
            attention, device, kernel, causal=False, dtype=dtype, window=self.window
        )
        # A varlen kernel's window is checked against the exact banded SDPA before it is trusted
        # (a build may lack local attention); where it fails, the banded SDPA serves the local layers.
        self.window_error = (
            None
            if varlen.needs_lengths(self._attend_local)
            else picks.window_error(self._attend_local, local_name, device, dtype, self.window)
        )
        if self.window_error is not None:
            local_name, self._attend_local = varlen.pick_attention("sdpa", device, causal=False, window=self.window)
            local_name += f" (the varlen kernel failed the band check: {self.window_error})"
        self.attention_name = f"{name}; local layers: {local_name}"
        self._per_sequence = varlen.needs_lengths(self._attend) or varlen.needs_lengths(self._attend_local)
        act = base.layers[0].mlp.act  # the config's hidden_activation, one module for every layer

        def geglu(x: torch.Tensor) -> torch.Tensor:
            inp, gate = x.chunk(2, dim=-1)
            return act(inp) * gate

        self._set_regions((add_ln, qkv_rope, geglu))

    def _per_token(self, out: np.ndarray, lens: list[int], segments: Sequence[int | None]) -> None:
        """No token types in ModernBERT: the row holds the pair each token belongs to (mean pooling's segments)."""
        out[:] = np.repeat(np.arange(len(lens), dtype=np.int64), lens)

    def _per_token_padding(self, pairs: int) -> int:
        """Padding tokens pool into the first empty pair (a CUDA graph's bucket has one), whose row is dropped."""
        return pairs

    def _rope(self, h: torch.Tensor, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """cos/sin (T, 1, dim) per layer type, from the model's own rotary module (its theta per type)."""
        out = {}
        for t in self._types:
            cos, sin = self._rotary(h, positions[None], t)
            out[t] = (cos[0, :, None, :], sin[0, :, None, :])
        return out

    def _forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        pair: torch.Tensor,
        cu_long: torch.Tensor,
        max_len: int,
        lens: list[int] | None,
    ) -> torch.Tensor:
        add_ln_, rope_, geglu = self._regions
        cu = cu_long.to(torch.int32)
        first = cu_long[:-1]
        e = self._emb
        h = e.norm(e.tok_embeddings(ids))  # (its dropout: identity in eval)
        rot = self._rope(h, positions)
        n_tokens = h.shape[0]
        real = real_rows(cu_long, n_tokens)
        last = len(self._layers) - 1
        cls = self.pooling == "cls"
        norm0 = self._layers[0].attn_norm  # None (Identity) in transformers' ModernBERT
        x = h if norm0 is None else F.layer_norm(h, (h.shape[-1],), norm0[0], norm0[1], norm0[2])
        for i, w in enumerate(self._layers):
            cos, sin = rot["sliding_attention" if w.local else "full_attention"]
            q, k, v = rope_(F.linear(x, w.qkv_w, w.qkv_b), cos, sin, w.heads, w.dim)
            attend = self._attend_local if w.local else self._attend
            o = attend(q, k, v, cu, cu, max_len, max_len, lens, lens).reshape(n_tokens, -1)
            if i == last and cls:
                # nothing after this attention mixes positions: keep each pair's first token
                h, o, real = h[first], o[first], real[first]
            h, x = add_ln_(h, F.linear(o, w.o_w, w.o_b), *w.mlp_norm, real)
            # the residual add with the next layer's attention norm (the final norm after the last)
            after = self._final_norm if i == last else self._layers[i + 1].attn_norm
            assert after is not None
            h, x = add_ln_(h, F.linear(geglu(F.linear(x, w.wi_w, w.wi_b)), w.wo_w, w.wo_b), *after, real)
        if cls:
            return self._head(x)
        n = first.shape[0]
        sums = torch.zeros(n, x.shape[-1], dtype=torch.float32, device=x.device).index_add_(0, pair, x.float())
        counts = (cu_long[1:] - first).to(torch.float32)[:, None]
        return self._head((sums / counts).to(x.dtype))
