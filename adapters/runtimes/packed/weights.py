"""A Qwen3 checkpoint's weights as the packed forwards use them.

``load_backbone`` loads the checkpoint with transformers' real Qwen3 code (the backbone and the two
LM-head rows scored); ``FusedLayer`` lays one decoder layer's weights out for the fused mode (q/k/v
and gate/up each one GEMM, the modules keeping views) and quantizes them for FP8.

Imported only through ``adapters.runtimes.packed.forward`` (pulls in torch and transformers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from adapters.runtimes.packed import fp8_gemm

__all__ = ("FusedLayer", "load_backbone")


def load_backbone(path: str, revision: str | None, dtype: torch.dtype, rows: Sequence[int]) -> tuple[Any, torch.Tensor]:
    """The checkpoint's backbone (embeddings, layers, final norm) and the LM-head ``rows`` in fp32, on CPU."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, revision=revision, dtype=dtype)
    model.eval()
    head = model.get_output_embeddings().weight[list(rows)].detach().to(torch.float32).clone()
    backbone = getattr(model, model.base_model_prefix)
    for p in backbone.parameters():
        p.requires_grad_(False)
    return backbone, head


class FusedLayer:
    """One decoder layer's weights with q/k/v and gate/up each concatenated into one GEMM (as vLLM does)."""

    __slots__ = ("down", "f8", "gate_up", "heads", "k_norm", "kv_heads", "ln1", "ln2", "o", "q_norm", "qkv")

    def __init__(self, layer: Any) -> None:
        a, m = layer.self_attn, layer.mlp
        self.qkv = torch.cat((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)).contiguous()
        self.gate_up = torch.cat((m.gate_proj.weight, m.up_proj.weight)).contiguous()
        self.o, self.down = a.o_proj.weight, m.down_proj.weight
        self.ln1, self.ln2 = layer.input_layernorm.weight, layer.post_attention_layernorm.weight
        self.q_norm, self.k_norm = a.q_norm.weight, a.k_norm.weight
        # The modules keep views of the fused weights: no second copy in memory.
        rows = 0
        for lin in (a.q_proj, a.k_proj, a.v_proj):
            lin.weight = torch.nn.Parameter(self.qkv[rows : rows + lin.weight.shape[0]], requires_grad=False)
            rows += lin.weight.shape[0]
        half = m.gate_proj.weight.shape[0]
        m.gate_proj.weight = torch.nn.Parameter(self.gate_up[:half], requires_grad=False)
        m.up_proj.weight = torch.nn.Parameter(self.gate_up[half:], requires_grad=False)
        self.heads = a.q_proj.weight.shape[0] // a.head_dim
        self.kv_heads = a.k_proj.weight.shape[0] // a.head_dim
        # Biases would need adding to the fused GEMMs; Qwen3 has none (attention_bias=False).
        if any(
            p.bias is not None for p in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        ):
            raise ValueError("fused projections: this checkpoint's projections have biases")
        self.f8: tuple[fp8_gemm.Fp8Weight, ...] = ()  # (qkv, o, gate_up, down) once quantized

    def quantize(self, layer: Any, quantize: Callable[[torch.Tensor], fp8_gemm.Fp8Weight]) -> None:
        """FP8 copies of the four GEMMs' weights; the bf16 ones are freed (shapes kept for the kernel checks)."""
        self.f8 = tuple(quantize(t) for t in (self.qkv, self.o, self.gate_up, self.down))
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
            lin.weight = torch.nn.Parameter(lin.weight.new_empty(lin.weight.shape[0], 0), requires_grad=False)
        self.qkv, self.o, self.gate_up, self.down = (
            t.new_empty(t.shape[0], 0) for t in (self.qkv, self.o, self.gate_up, self.down)
        )
